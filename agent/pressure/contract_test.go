package pressure_test

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/bpf"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// contract is what every Source must do, on the real kernel: fail for a
// cgroup that does not exist; see the CPU stall of a task throttled by
// cpu.max grow, and not that of an idle cgroup; count an OOM kill in the
// cgroup whose limit was hit.
func contract(t *testing.T, mnt, base string, src pressure.Source) {
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	if _, err := src.Read(base + "/nope"); !errors.Is(err, cgroup.ErrNotFound) {
		t.Errorf("Read of a missing cgroup: %v, want ErrNotFound", err)
	}

	busy := cgrouptest.Child(t, mnt, base, "busy")
	idle := cgrouptest.Child(t, mnt, base, "idle")
	if err := cg.Write(busy, cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 10000, Period: 100000}}); err != nil {
		t.Fatal(err)
	}
	b0, i0 := read(t, src, busy), read(t, src, idle)
	cgrouptest.StartBusy(t, mnt, busy)
	time.Sleep(2 * time.Second)
	b1, i1 := read(t, src, busy), read(t, src, idle)
	t.Logf("%s: CPU stall over 2 s at 10%% of a CPU: busy %v, idle %v", src.Name(), b1.CPUStall-b0.CPUStall, i1.CPUStall-i0.CPUStall)
	if d := b1.CPUStall - b0.CPUStall; d < 200*time.Millisecond {
		t.Errorf("%s: a throttled busy loop stalled only %v in 2 s", src.Name(), d)
	}
	if d := i1.CPUStall - i0.CPUStall; d > 20*time.Millisecond {
		t.Errorf("%s: an idle cgroup stalled %v", src.Name(), d)
	}

	oom := cgrouptest.Child(t, mnt, base, "oom")
	lim := int64(32 << 20)
	if err := cg.Write(oom, cgroup.Resources{MemoryMax: &lim}); err != nil {
		t.Fatal(err)
	}
	o0 := read(t, src, oom)
	// busybox tail holds a line with no newline whole in memory.
	hog := exec.Command("sh", "-c", "head -c 96m /dev/zero | tail >/dev/null")
	cgrouptest.StartIn(t, mnt, oom, hog)
	err := hog.Wait()
	o1 := read(t, src, oom)
	t.Logf("%s: 96MiB under 32Mi: %v; OOM kills %d -> %d, memory stall +%v", src.Name(), err, o0.OOMKills, o1.OOMKills, o1.MemoryStall-o0.MemoryStall)
	if o1.OOMKills <= o0.OOMKills {
		t.Errorf("%s: no OOM kill counted for the cgroup whose limit was hit", src.Name())
	}
	if o := read(t, src, idle); o.OOMKills != 0 {
		t.Errorf("%s: OOM kills counted for the idle cgroup: %d", src.Name(), o.OOMKills)
	}
}

func read(t *testing.T, src pressure.Source, p string) pressure.Sample {
	t.Helper()
	s, err := src.Read(p)
	if err != nil {
		t.Fatalf("%s: Read(%s): %v", src.Name(), p, err)
	}
	return s
}

func TestContractFiles(t *testing.T) {
	mnt, base := cgrouptest.Real(t)
	contract(t, mnt, base, pressure.Files{CG: cgroup.New(cgroup.WithMountpoint(mnt))})
}

func TestContractBPF(t *testing.T) {
	mnt, base := cgrouptest.Real(t)
	tr, err := bpf.Load()
	if err != nil {
		if os.Getenv("RESIZE_AGENT_REQUIRE_BPF") == "1" {
			t.Fatalf("eBPF is required here: %v", err)
		}
		t.Skipf("eBPF programs do not load here: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	contract(t, mnt, base, pressure.BPF{T: tr, CG: cgroup.New(cgroup.WithMountpoint(mnt))})
}
