package crash_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/resizer/resize-agent/test/looptest"
)

// ext4Shutdown is EXT4_IOC_SHUTDOWN, _IOR('X', 125, __u32) (linux
// fs/ext4/ext4.h; the same number as XFS_IOC_GOINGDOWN, which xfstests'
// godown and generic/ shutdown tests use to cut a file system off as a
// dead disk would), and ext4GoingDefault its EXT4_GOING_FLAGS_DEFAULT:
// the file system is frozen (what was written so far reaches the device,
// consistently), then shut down: every open, read, write, sync and
// truncate after it fails with EIO. The other flags skip the freeze, which
// without a journal (our ext2 image) leaves metadata on the device in no
// particular order: a dangling directory entry is ext2's fault, not the
// agent's.
const (
	ext4Shutdown     = 0x8004587d
	ext4GoingDefault = 0x0
)

// stateFS is the daemon's state directory on a file system of its own:
// the ext4 driver on a 16 MiB image (busybox's mke2fs, in the guest, makes
// an ext2 image, which ext4 mounts without a journal) on a loop device. It
// is small enough to fill up, and shutdown makes it fail with EIO until
// heal unmounts and mounts it again, as a disk taken away and given back.
type stateFS struct {
	t        *testing.T
	dev, dir string
}

const stateFSMiB = 16

func newStateFS(t *testing.T, dir string) *stateFS {
	t.Helper()
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	img := filepath.Join(t.TempDir(), "state.img")
	run("dd", "if=/dev/zero", "of="+img, "bs=1M", fmt.Sprint("count=", stateFSMiB))
	s := &stateFS{t: t, dev: looptest.Attach(t, img), dir: dir}
	// No blocks reserved for root: the daemon runs as root, and the disk
	// must fill up for it too.
	run("mke2fs", "-q", "-m", "0", s.dev)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s.mount()
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return s
}

func (s *stateFS) mount() {
	s.t.Helper()
	if err := syscall.Mount(s.dev, s.dir, "ext4", 0, ""); err != nil {
		s.t.Fatalf("mount %s on %s (ext4): %v", s.dev, s.dir, err)
	}
}

// shutdown fails the file system: every access after it is EIO.
func (s *stateFS) shutdown() {
	s.t.Helper()
	d, err := os.Open(s.dir)
	if err != nil {
		s.t.Fatal(err)
	}
	defer d.Close()
	if err := unix.IoctlSetPointerInt(int(d.Fd()), ext4Shutdown, ext4GoingDefault); err != nil {
		s.t.Fatalf("EXT4_IOC_SHUTDOWN on %s: %v", s.dir, err)
	}
}

// heal brings a shut-down file system back: unmounted, what was not on
// the device is gone, and the next mount finds what was.
func (s *stateFS) heal() {
	s.t.Helper()
	var err error
	for range 50 {
		if err = syscall.Unmount(s.dir, 0); !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond) // a killed daemon's last files
	}
	if err != nil {
		s.t.Fatalf("unmount %s: %v", s.dir, err)
	}
	s.mount()
}

// isEIO reports whether a daemon's log says it stopped on EIO.
func isEIO(log string) bool {
	return strings.Contains(log, "resize-agent stopped") && strings.Contains(log, syscall.EIO.Error())
}
