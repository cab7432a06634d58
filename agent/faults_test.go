package agent_test

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// No path of the kernel returns EBUSY for cpu.max, cpu.weight or
// memory.max on cgroup v2 (v1's memory.limit_in_bytes does, when reclaim
// falls short), so it is injected here, as the kernel's error in a
// cgroup.WriteError; EINVAL is proven on the real kernel in test/faults.
func TestKernelBusyFailsAndRollsBack(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/pod", "/pod/web")
	var busy atomic.Bool
	busy.Store(true)
	f.cg.fail = func(p string, r cgroup.Resources) error {
		if busy.Load() && r.MemoryMax != nil && p == "/pod/web" {
			return &cgroup.WriteError{Path: p, File: cgroup.FileMemoryMax, Value: "268435456", Err: syscall.EBUSY}
		}
		return nil
	}
	files := func() string {
		var b strings.Builder
		for _, file := range []string{"cpu.max", "cpu.weight", "memory.max"} {
			b.WriteString(file + "=" + cgrouptest.ReadFile(t, f.root, "/pod/web", file) + " ")
		}
		return b.String()
	}
	// The pod's memory.max grows with the resize, so it is written first.
	cgrouptest.SetFile(t, f.root, "/pod", "memory.max", "134217728")
	before, podBefore := files(), "134217728"
	s := spec("web", "/pod/web", map[string]string{"cpu": "500m", "memory": "128Mi"}, map[string]string{"cpu": "1", "memory": "256Mi"})
	s.Target.PodCgroupPath = "/pod"
	it := submit(t, f.a, s)
	want(t, it, intent.Failed, intent.ReasonWriteFailed)
	for _, m := range []string{"device or resource busy", "memory.max", "undone"} {
		if !strings.Contains(it.Status.Message, m) {
			t.Errorf("message %q does not say %q", it.Status.Message, m)
		}
	}
	if got := files(); got != before {
		t.Errorf("after the refused write: %s, want %s (nothing of CPU written: memory goes first)", got, before)
	}
	// Memory goes first (the kubelet's order): the pod's memory.max grew
	// before the container's write failed, and is undone.
	if got := cgrouptest.ReadFile(t, f.root, "/pod", "memory.max"); got != podBefore {
		t.Errorf("pod memory.max = %s, want it undone to %s", got, podBefore)
	}
	if n := f.l.Allocated(); n != (admission.Capacity{}) {
		t.Errorf("a failed intent holds %+v on the ledger", n)
	}

	// The agent keeps serving the container.
	busy.Store(false)
	want(t, submit(t, f.a, s), intent.Completed, intent.ReasonApplied)
	if got := cgrouptest.ReadFile(t, f.root, "/pod/web", "memory.max"); got != "268435456" {
		t.Errorf("memory.max = %s", got)
	}
	if n := f.l.Allocated(); n.MilliCPU != 500 || n.Memory != 128<<20 {
		t.Errorf("allocated %+v", n)
	}
	for _, it := range f.a.List(agent.Filter{}, "") {
		if !it.Status.State.Terminal() {
			t.Errorf("intent %s left %s", it.ID, it.Status.State)
		}
	}
}
