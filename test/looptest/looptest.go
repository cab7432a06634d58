// Package looptest attaches image files to loop devices for the tests that
// need a block device of their own in the VM harness (a file system to fill,
// to shut down, to run out of space on), without losetup: the guest has
// only busybox.
package looptest

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// Attach attaches img to a free loop device (/dev/loop-control), as
// losetup does, detached when the test ends.
func Attach(t testing.TB, img string) string {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		if os.Getenv(cgrouptest.RequireEnv) == "1" {
			t.Fatalf("loop devices: %v", err)
		}
		t.Skipf("needs loop devices (the VM harness loads the module): %v", err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		t.Fatalf("LOOP_CTL_GET_FREE: %v", err)
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
			t.Fatalf("mknod %s: %v", dev, err)
		}
	}
	lf, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_SET_FD, int(f.Fd())); err != nil {
		t.Fatalf("LOOP_SET_FD %s: %v", dev, err)
	}
	t.Cleanup(func() {
		_ = unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
		lf.Close()
	})
	return dev
}
