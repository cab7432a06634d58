package cgroup_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func fakeMemory(t *testing.T) (*cgroup.Manager, string) {
	t.Helper()
	root := cgrouptest.FakeTree(t, "/c")
	cgrouptest.SetFile(t, root, "/c", "memory.high", "max")
	cgrouptest.SetFile(t, root, "/c", "memory.current", "104857600")
	cgrouptest.SetFile(t, root, "/c", "memory.stat", "anon 4194304\nfile 94371840\nshmem 1048576\nslab_reclaimable 2097152\n")
	cgrouptest.SetFile(t, root, "/c", "memory.pressure",
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=1500\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500\n")
	return cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()), root
}

func TestReadMemory(t *testing.T) {
	m, _ := fakeMemory(t)
	got, err := m.ReadMemory("/c")
	if err != nil {
		t.Fatal(err)
	}
	want := cgroup.Memory{Current: 100 << 20, High: cgroup.Unlimited, Max: cgroup.Unlimited,
		Anon: 4 << 20, File: 90 << 20, Shmem: 1 << 20, SlabReclaimable: 2 << 20,
		Pressure: cgroup.PSI{Some: 1500 * time.Microsecond, Full: 500 * time.Microsecond}}
	if got != want {
		t.Errorf("ReadMemory = %+v\nwant %+v", got, want)
	}
	if r := got.Reclaimable(); r != 91<<20 {
		t.Errorf("Reclaimable = %d, want file-shmem+slab = 91 MiB", r)
	}
}

func TestReadMemoryHigh(t *testing.T) {
	m, root := fakeMemory(t)
	if v, err := m.ReadMemoryHigh("/c"); err != nil || v != cgroup.Unlimited {
		t.Errorf("memory.high max: %d, %v", v, err)
	}
	cgrouptest.SetFile(t, root, "/c", "memory.high", "201326592")
	if v, err := m.ReadMemoryHigh("/c"); err != nil || v != 192<<20 {
		t.Errorf("memory.high 192Mi: %d, %v", v, err)
	}
	cgrouptest.SetFile(t, root, "/c", "memory.high", "lots")
	if _, err := m.ReadMemoryHigh("/c"); err == nil {
		t.Error("memory.high lots: no error")
	}
	if _, err := m.ReadMemoryHigh("/../etc"); err == nil {
		t.Error("a path out of the tree: no error")
	}
}

func TestSetMemoryHigh(t *testing.T) {
	m, root := fakeMemory(t)
	if err := m.SetMemoryHigh("/c", 32<<20); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ReadFile(t, root, "/c", "memory.high"); got != "33554432" {
		t.Errorf("memory.high = %q", got)
	}
	if err := m.SetMemoryHigh("/c", cgroup.Unlimited); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ReadFile(t, root, "/c", "memory.high"); got != "max" {
		t.Errorf("memory.high = %q", got)
	}
	if err := m.SetMemoryHigh("/c", -5); !errors.Is(err, cgroup.ErrInvalidValue) {
		t.Errorf("negative memory.high: %v", err)
	}
	cgroup.SetFailWrite(m, func(f string) error { return syscall.EBUSY })
	var we *cgroup.WriteError
	if err := m.SetMemoryHigh("/c", 1<<20); !errors.As(err, &we) || we.File != "memory.high" || !errors.Is(err, syscall.EBUSY) {
		t.Errorf("failed write: %v", err)
	}
	if err := m.SetMemoryHigh("/nope", 1<<20); !errors.Is(err, cgroup.ErrNotFound) {
		t.Errorf("missing cgroup: %v", err)
	}
}

func TestReclaim(t *testing.T) {
	m, root := fakeMemory(t)
	if _, err := m.Reclaim("/c", 1<<20); !errors.Is(err, cgroup.ErrNotSupported) {
		t.Fatalf("without memory.reclaim: %v, want ErrNotSupported", err)
	}
	if ok, err := m.SupportsReclaim("/c"); ok || err != nil {
		t.Errorf("SupportsReclaim = %v, %v", ok, err)
	}
	cgrouptest.SetFile(t, root, "/c", "memory.reclaim", "")
	if ok, err := m.SupportsReclaim("/c"); !ok || err != nil {
		t.Errorf("SupportsReclaim = %v, %v", ok, err)
	}
	if _, err := m.Reclaim("/c", 1<<20); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ReadFile(t, root, "/c", "memory.reclaim"); got != "1048576" {
		t.Errorf("wrote %q to memory.reclaim", got)
	}
	if _, err := m.Reclaim("/c", 0); !errors.Is(err, cgroup.ErrInvalidValue) {
		t.Errorf("reclaim 0: %v", err)
	}
	cgroup.SetFailWrite(m, func(f string) error {
		if f == "memory.reclaim" {
			return syscall.EAGAIN
		}
		return nil
	})
	_, err := m.Reclaim("/c", 1<<20)
	var re *cgroup.ReclaimError
	if !errors.Is(err, cgroup.ErrReclaimIncomplete) || !errors.As(err, &re) || re.Requested != 1<<20 || re.Path != "/c" {
		t.Errorf("EAGAIN: %v, want a ReclaimError matching ErrReclaimIncomplete", err)
	}
}
