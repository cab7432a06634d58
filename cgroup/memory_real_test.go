package cgroup_test

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func TestRealKernelMemoryHigh(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	// Not page aligned: the kernel rounds down, which the check allows for.
	if err := m.SetMemoryHigh(p, 50000001); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ReadFile(t, mnt, p, "memory.high"); got != "49999872" {
		t.Errorf("kernel's memory.high = %q, want 49999872", got)
	}
	if err := m.SetMemoryHigh(p, cgroup.Unlimited); err != nil {
		t.Fatal(err)
	}
	mem, err := m.ReadMemory(p)
	if err != nil {
		t.Fatal(err)
	}
	if mem.High != cgroup.Unlimited || mem.Max != cgroup.Unlimited {
		t.Errorf("after unlimiting: %+v", mem)
	}
}

// TestRealKernelReclaim fills a cgroup with reclaimable kernel memory
// (negative dentries, from looking up names that do not exist in cgroupfs,
// which keeps them; the guest has no disk-backed page cache) and has the
// kernel reclaim it, then asks an empty cgroup for more than it holds.
func TestRealKernelReclaim(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	if ok, err := m.SupportsReclaim(p); !ok || err != nil {
		t.Fatalf("SupportsReclaim on kernel 5.19+: %v, %v", ok, err)
	}
	long := strings.Repeat("x", 200)
	// busybox ash: "[" is a builtin, so each lookup is a stat, not a fork.
	script := `i=0; while [ $i -lt 30000 ]; do [ -e "` + mnt + p + `/` + long + `$i" ]; i=$((i+1)); done; echo ready; sleep 600`
	cmd := exec.Command("sh", "-c", script)
	out := &strings.Builder{}
	cmd.Stdout = out
	cgrouptest.StartIn(t, mnt, p, cmd)
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), "ready") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	before, err := m.ReadMemory(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before: current %d, slab_reclaimable %d, anon %d, file %d", before.Current, before.SlabReclaimable, before.Anon, before.File)
	if before.SlabReclaimable < 4<<20 {
		t.Fatalf("only %d bytes of reclaimable slab after 30000 lookups", before.SlabReclaimable)
	}
	start := time.Now()
	got, err := m.Reclaim(p, before.SlabReclaimable)
	took := time.Since(start)
	time.Sleep(200 * time.Millisecond) // dentries are freed after an RCU grace period
	after, rerr := m.ReadMemory(p)
	if rerr != nil {
		t.Fatal(rerr)
	}
	t.Logf("reclaim %d: %v in %s, reported %d; after: current %d, slab_reclaimable %d", before.SlabReclaimable, err, took, got, after.Current, after.SlabReclaimable)
	if err != nil && !errors.Is(err, cgroup.ErrReclaimIncomplete) {
		t.Fatal(err)
	}
	if freed := before.Current - after.Current; freed < before.SlabReclaimable/2 {
		t.Errorf("memory.current fell by %d, want at least half of %d", freed, before.SlabReclaimable)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process died: %v", err)
	}
}

// TestRealKernelReclaimIncomplete asks an empty cgroup for 1 MiB: the
// kernel answers EAGAIN.
func TestRealKernelReclaimIncomplete(t *testing.T) {
	mnt, p := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	_, err := m.Reclaim(p, 1<<20)
	var re *cgroup.ReclaimError
	if !errors.Is(err, cgroup.ErrReclaimIncomplete) || !errors.As(err, &re) {
		t.Fatalf("Reclaim from an empty cgroup: %v, want ErrReclaimIncomplete", err)
	}
	t.Logf("%v", err)
}
