package cgroup_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestCheckHost runs on whatever kernel the test runs on and checks that
// Check agrees with /proc/self/mountinfo about /sys/fs/cgroup.
func TestCheckHost(t *testing.T) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("no /proc/self/mountinfo: %v", err)
	}
	isV2 := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 8 && f[4] == "/sys/fs/cgroup" {
			sep := 6
			for sep < len(f) && f[sep] != "-" {
				sep++
			}
			isV2 = sep+1 < len(f) && f[sep+1] == "cgroup2"
		}
	}
	err = cgroup.New().Check()
	t.Logf("Check() on this host: %v (mountinfo says cgroup2=%v)", err, isV2)
	if !isV2 && !errors.Is(err, cgroup.ErrNotCgroup2) {
		t.Errorf("host /sys/fs/cgroup is not cgroup2, Check() = %v", err)
	}
	if isV2 && err != nil && !errors.Is(err, cgroup.ErrMissingController) {
		t.Errorf("host /sys/fs/cgroup is cgroup2, Check() = %v", err)
	}
}

func TestRealKernelWriteVerify(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	r := cgroup.Resources{
		CPUMax:    &cgroup.CPUMax{Quota: cgroup.MilliCPUToQuota(250, 100000), Period: 100000},
		CPUWeight: ptr(cgroup.MilliCPUToWeight(250)),
		MemoryMax: ptr(int64(100000001)), // not page aligned: the kernel rounds down
	}
	if err := m.Write(p, r); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"cpu.max": "25000 100000", "cpu.weight": "35", "memory.max": "99999744"} {
		if got := cgrouptest.ReadFile(t, mnt, p, f); got != want {
			t.Errorf("kernel's %s = %q, want %q", f, got, want)
		}
	}
	if err := m.Write(p, cgroup.Resources{MemoryMax: ptr(cgroup.Unlimited), CPUMax: &cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}}); err != nil {
		t.Fatal(err)
	}
	s, err := m.Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if s.MemoryMax != cgroup.Unlimited || s.CPUMax.Quota != cgroup.Unlimited {
		t.Errorf("after unlimiting: %+v", s)
	}
}

// TestRealKernelRollback has the kernel itself refuse a write: a quota past
// the scheduler's bandwidth limit gets EINVAL after cpu.weight was written,
// and cpu.weight must be restored.
func TestRealKernelRollback(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	err := m.Write(p, cgroup.Resources{
		CPUWeight: ptr(uint64(777)),
		CPUMax:    &cgroup.CPUMax{Quota: 1 << 50, Period: 100000},
	})
	var we *cgroup.WriteError
	if !errors.As(err, &we) || !errors.Is(err, syscall.EINVAL) || we.File != "cpu.max" {
		t.Fatalf("Write error = %v, want a WriteError for cpu.max with EINVAL", err)
	}
	if got := cgrouptest.ReadFile(t, mnt, p, "cpu.weight"); got != "100" {
		t.Errorf("cpu.weight = %q after rollback, want 100", got)
	}
	if got := cgrouptest.ReadFile(t, mnt, p, "cpu.max"); got != "max 100000" {
		t.Errorf("cpu.max = %q after rollback", got)
	}
}
