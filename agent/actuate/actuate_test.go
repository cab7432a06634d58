package actuate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// fakeCgroups is one cgroup whose usage never comes down: a fake of the
// files for the logic of a shrink, which the real kernel tests cover
// end to end (test/integration).
type fakeCgroups struct {
	st     cgroup.State
	mem    cgroup.Memory
	writes []string
}

func (f *fakeCgroups) Read(string) (cgroup.State, error) { return f.st, nil }
func (f *fakeCgroups) Write(p string, r cgroup.Resources) error {
	f.writes = append(f.writes, fmt.Sprint(p, r.Values()))
	return nil
}
func (f *fakeCgroups) PathOf(int) (string, error)               { return "", errors.New("no pids here") }
func (f *fakeCgroups) PageSize() int64                          { return 4096 }
func (f *fakeCgroups) ReadMemory(string) (cgroup.Memory, error) { return f.mem, nil }
func (f *fakeCgroups) SupportsReclaim(string) (bool, error)     { return true, nil }
func (f *fakeCgroups) Reclaim(string, int64) (int64, error)     { return 0, nil }
func (f *fakeCgroups) SetMemoryHigh(p string, v int64) error {
	f.mem.High = v
	f.writes = append(f.writes, fmt.Sprintf("%s memory.high=%d", p, v))
	return nil
}

// TestDoStopsReclaimWhenCancelled: once ctx ends, a shrink gives up with
// ctx's cause, puts memory.high back and leaves memory.max alone.
func TestDoStopsReclaimWhenCancelled(t *testing.T) {
	const mi = 1 << 20
	cg := &fakeCgroups{
		st:  cgroup.State{CPUMax: cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}, CPUWeight: 100, MemoryMax: 512 * mi, MemoryCurrent: 300 * mi},
		mem: cgroup.Memory{Current: 300 * mi, High: cgroup.Unlimited, Max: 512 * mi},
	}
	x := &Actuator{Cgroups: cg, Period: 100000}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("the agent is shutting down"))
	want := intent.Resources{MemoryLimit: 256 * mi}
	out := x.Do(ctx, Job{Want: want, Memory: true, Container: Level{Path: "/c", Want: x.ContainerFiles("/c", want, false, true)}})
	if out.State != intent.Failed || out.Reason != intent.ReasonMemoryBelowUsage || !strings.Contains(out.Message, "the agent is shutting down") {
		t.Errorf("result %s %s %q", out.State, out.Reason, out.Message)
	}
	if got := strings.Join(cg.writes, "; "); got != fmt.Sprintf("/c memory.high=%d; /c memory.high=-1", 256*mi) {
		t.Errorf("writes %q: memory.high lowered then restored, nothing else", got)
	}
	if out.Reclaim == nil || len(out.Reclaim.Restored) != 1 || out.Reclaim.RestoreErr != nil {
		t.Errorf("reclaim report %+v", out.Reclaim)
	}
}

// TestDoNoChange: files that hold the values already are not written.
func TestDoNoChange(t *testing.T) {
	cg := &fakeCgroups{st: cgroup.State{CPUMax: cgroup.CPUMax{Quota: 50000, Period: 100000}, CPUWeight: cgroup.MilliCPUToWeight(500), MemoryMax: cgroup.Unlimited}}
	x := &Actuator{Cgroups: cg, Period: 100000}
	want := intent.Resources{CPURequest: 500, CPULimit: 500}
	out := x.Do(context.Background(), Job{Want: want, CPU: true, Container: Level{Path: "/c", Want: x.ContainerFiles("/c", want, true, false)}})
	if out.State != intent.Completed || out.Reason != intent.ReasonNoChange || len(cg.writes) != 0 {
		t.Errorf("result %s %s, writes %v", out.State, out.Reason, cg.writes)
	}
}

// restartRuntime fails every restart with err.
type restartRuntime struct{ err error }

func (restartRuntime) Update(context.Context, string, cri.Resources) error { return nil }
func (r restartRuntime) Restart(context.Context, string, cri.Resources, time.Duration) (cri.Container, error) {
	return cri.Container{}, r.err
}

// TestRestartSaysWhatIsLeft: a restart that fails says whether a running
// container is left: the old one (RestartFailed) or none
// (RestartLostContainer), issue 18 item 2.
func TestRestartSaysWhatIsLeft(t *testing.T) {
	cg := &fakeCgroups{st: cgroup.State{CPUMax: cgroup.CPUMax{Quota: 50000, Period: 100000}, CPUWeight: 59, MemoryMax: cgroup.Unlimited}}
	want := intent.Resources{CPURequest: 1000, CPULimit: 1000}
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{&cri.RestartError{Running: "c1", Stage: "create", Err: errors.New("no space")}, intent.ReasonRestartFailed},
		{&cri.RestartError{Stage: "start", Err: errors.New("exec format error")}, intent.ReasonRestartLostContainer},
	} {
		x := &Actuator{Cgroups: cg, Runtime: restartRuntime{tc.err}, Period: 100000}
		out := x.Do(context.Background(), Job{Want: want, CPU: true, RuntimeID: "c1", Restart: true,
			Container: Level{Path: "/c", Want: x.ContainerFiles("/c", want, true, false)}})
		if out.State != intent.Failed || out.Reason != tc.reason || !strings.Contains(out.Message, tc.err.Error()) {
			t.Errorf("%v: %s/%s %q, want %s", tc.err, out.State, out.Reason, out.Message, tc.reason)
		}
	}
}
