package cgroup

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestReadBackOnWrittenDescriptor: on a real cgroup, a read from 0 on the
// descriptor a value was just written on answers the kernel's value (the
// rounded one for memory.max), which writeOne relies on to verify a write
// without an open of its own. It fails, rather than letting writeOne's
// fallback hide it, if this kernel does not.
func TestReadBackOnWrittenDescriptor(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := New(WithMountpoint(mnt))
	d, err := m.files(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, write, want string }{
		{FileCPUMax, "25000 100000", "25000 100000"},
		{FileCPUWeight, "35", "35"},
		{FileMemoryMax, "100000001", "99999744"},
		{FileCPUMax, "max 100000", "max 100000"},
		{FileMemoryMax, "max", "max"},
	} {
		fd, err := d.open(c.file, unix.O_RDWR|unix.O_TRUNC)
		if err != nil {
			t.Fatal(err)
		}
		err = writeFD(fd, c.write)
		var buf [128]byte
		n, perr := unix.Pread(fd, buf[:], 0)
		unix.Close(fd)
		if err != nil || perr != nil {
			t.Fatalf("%s: write %v, pread %v", c.file, err, perr)
		}
		if got := strings.TrimSpace(string(buf[:n])); got != c.want {
			t.Errorf("%s: read back %q on the written descriptor after writing %q, want %q", c.file, got, c.write, c.want)
		}
		back, err := d.writeOne(Value{File: c.file, Data: c.write})
		if err != nil || strings.TrimSpace(back) != c.want {
			t.Errorf("writeOne(%s, %q) = %q, %v; want %q", c.file, c.write, back, err, c.want)
		}
	}
}
