package cgroup_test

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func TestPressureFake(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/c")
	cgrouptest.FakePressure(t, root, "/c", 2500000, 7, 2)
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	p, err := m.Pressure("/c")
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasPSI || p.CPU.Some != 2500*time.Millisecond || p.CPU.Full != 1250*time.Millisecond || p.CPU.Avg10Some != 1.5 ||
		p.Memory.Some != 250*time.Millisecond || p.ThrottledPeriods != 7 || p.Throttled != 7*time.Millisecond || p.Periods != 100 || p.OOMKills != 2 {
		t.Errorf("Pressure = %+v", p)
	}
	if _, err := m.Pressure("/nope"); err == nil {
		t.Error("Pressure of a missing cgroup succeeded")
	}
	id, err := m.ID("/c")
	fi, _ := os.Stat(root + "/c")
	if err != nil || id != fi.Sys().(*syscall.Stat_t).Ino {
		t.Errorf("ID = %d, %v", id, err)
	}
}

// TestRealKernelPressure throttles a busy process with cpu.max and reads
// the kernel's own counters.
func TestRealKernelPressure(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := m.Write(p, cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 10000, Period: 100000}}); err != nil {
		t.Fatal(err)
	}
	cgrouptest.StartBusy(t, mnt, p)
	time.Sleep(1500 * time.Millisecond)
	pr, err := m.Pressure(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after 1.5 s at 10%% of a CPU: %+v", pr)
	if pr.ThrottledPeriods == 0 || pr.Throttled == 0 {
		t.Errorf("no throttling seen: %+v", pr)
	}
	if pr.HasPSI && pr.CPU.Some == 0 {
		t.Errorf("no CPU pressure seen: %+v", pr)
	}
	if id, err := m.ID(p); err != nil || id == 0 {
		t.Errorf("ID = %d, %v", id, err)
	}
}
