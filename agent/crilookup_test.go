package agent_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// countingRuntime counts the calls the agent makes of the runtime.
type countingRuntime struct {
	*agenttest.Runtime
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingRuntime) count(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[name]++
}

func (c *countingRuntime) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = map[string]int{}
	return out
}

func (c *countingRuntime) Find(ctx context.Context, podUID, name string) (cri.Container, error) {
	c.count("Find")
	return c.Runtime.Find(ctx, podUID, name)
}

func (c *countingRuntime) Version(ctx context.Context) (string, error) {
	c.count("Version")
	return c.Runtime.Version(ctx)
}

func (c *countingRuntime) Get(ctx context.Context, id string) (cri.Container, error) {
	c.count("Get")
	return c.Runtime.Get(ctx, id)
}

func (c *countingRuntime) PodContainers(ctx context.Context, podUID string) ([]cri.Container, error) {
	c.count("PodContainers")
	return c.Runtime.PodContainers(ctx, podUID)
}

func (c *countingRuntime) Update(ctx context.Context, id string, r cri.Resources) error {
	c.count("Update")
	return c.Runtime.Update(ctx, id, r)
}

// TestKnownContainerNoLookup: once the agent knows a runtime's container,
// each intent for it makes exactly one UpdateContainerResources call and
// no lookup (Find, Get), listing of its pod or liveness probe (Version:
// the runtime answered the last intent's update just before); a container
// restarted behind the agent's back (no exit watcher to tell it) is still
// found, by the resize that finds the old one gone, and resized.
func TestKnownContainerNoLookup(t *testing.T) {
	root := cgrouptest.FakeTree(t)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	rt := &countingRuntime{Runtime: agenttest.NewRuntime(cg), calls: map[string]int{}}
	a := agent.New(rt.Cgroups(), admission.NewLedger(admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}),
		agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithRuntime(rt))
	t.Cleanup(func() { a.Close(context.Background()) })
	const pod = "/kubepods/burstable/poduid-1"
	cgrouptest.AddFake(t, root, pod)
	cgrouptest.AddFake(t, root, pod+"/web")
	rt.Add("uid-1", "web", pod+"/web")

	resize := func(cpu string) intent.Intent {
		s := intent.Spec{Target: intent.Target{Name: "web", PodUID: "uid-1"}}
		s.Resources.Limits = list2(map[string]string{"cpu": cpu})
		return submit(t, a, s)
	}
	want(t, resize("500m"), intent.Completed, "")
	first := rt.take()
	if first["Find"] != 1 || first["PodContainers"] != 1 {
		t.Errorf("first intent: runtime calls %v, want one Find and one PodContainers (registration)", first)
	}
	for i, cpu := range []string{"600m", "700m", "800m", "900m"} {
		want(t, resize(cpu), intent.Completed, "")
		got := rt.take()
		if got["Update"] != 1 || len(got) != 1 {
			t.Errorf("intent %d for a known container: runtime calls %v, want exactly one Update", i+2, got)
		}
	}
	if got := cgrouptest.ReadFile(t, root, pod+"/web", "cpu.max"); got != "90000 100000" {
		t.Errorf("web cpu.max = %q after the resizes", got)
	}

	// Restarted behind the agent's back into a new cgroup.
	rt.Remove("uid-1", "web")
	cgrouptest.AddFake(t, root, pod+"/web-2")
	next := rt.Add("uid-1", "web", pod+"/web-2")
	done := resize("1000m")
	want(t, done, intent.Completed, "")
	if got := cgrouptest.ReadFile(t, root, pod+"/web-2", "cpu.max"); got != "100000 100000" {
		t.Errorf("the restarted container's cpu.max = %q, want 100000 100000", got)
	}
	var found bool
	for _, c := range a.Containers() {
		if c.Name == "web" {
			found = c.CgroupPath == pod+"/web-2" && c.ContainerID == next.ID
		}
	}
	if !found {
		t.Errorf("the agent does not follow the restarted container: %+v", a.Containers())
	}
	// And it is known again: one Update per intent.
	rt.take()
	want(t, resize("1100m"), intent.Completed, "")
	if got := rt.take(); got["Update"] != 1 || len(got) != 1 {
		t.Errorf("after following the restart: runtime calls %v, want exactly one Update", got)
	}
}

// TestUnmanagedSiblingNoListing: a resize of a container whose pod has a
// container the agent does not manage lists the pod only when the
// kernel's limit-write marks say a sibling may have changed (updated,
// started, stopped), and then sums the pod cgroup with what the runtime
// reports of it now; without the marks it lists every time.
func TestUnmanagedSiblingNoListing(t *testing.T) {
	const pod = "/kubepods/burstable/poduid-1"
	setup := func(t *testing.T, marked bool) (*countingRuntime, *agent.Agent, string, *agenttest.WriteMarks) {
		root := cgrouptest.FakeTree(t, pod, pod+"/web", pod+"/side")
		cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
		rt := &countingRuntime{Runtime: agenttest.NewRuntime(cg), calls: map[string]int{}}
		marks := agenttest.NewWriteMarks(pod, pod+"/web", pod+"/side")
		opts := []agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithRuntime(rt)}
		if marked {
			opts = append(opts, agent.WithDriftWrites(marks, time.Hour))
		}
		a := agent.New(rt.Cgroups(), admission.NewLedger(admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}), opts...)
		t.Cleanup(func() { a.Close(context.Background()) })
		rt.Add("uid-1", "web", pod+"/web")
		side := rt.Add("uid-1", "side", pod+"/side")
		if err := rt.Update(context.Background(), side.ID, cri.Resources{CPUShares: 1024, CPUPeriod: 100000, CPUQuota: 100000}); err != nil {
			t.Fatal(err)
		}
		return rt, a, root, marks
	}
	resize := func(t *testing.T, a *agent.Agent, cpu string) {
		t.Helper()
		s := intent.Spec{Target: intent.Target{Name: "web", PodUID: "uid-1"}}
		s.Resources.Limits = list2(map[string]string{"cpu": cpu})
		want(t, submit(t, a, s), intent.Completed, "")
	}
	podMax := func(t *testing.T, root, want string) {
		t.Helper()
		if got := cgrouptest.ReadFile(t, root, pod, "cpu.max"); got != want {
			t.Errorf("pod cpu.max = %q, want %q", got, want)
		}
	}

	t.Run("marked", func(t *testing.T) {
		rt, a, root, marks := setup(t, true)
		resize(t, a, "500m")
		if got := rt.take(); got["PodContainers"] != 1 {
			t.Errorf("first intent: runtime calls %v, want one PodContainers (registration)", got)
		}
		podMax(t, root, "150000 100000")
		for i, cpu := range []string{"600m", "700m"} {
			resize(t, a, cpu)
			if got := rt.take(); got["Update"] != 1 || len(got) != 1 {
				t.Errorf("intent %d, nothing written to the sibling: runtime calls %v, want exactly one Update", i+2, got)
			}
		}
		podMax(t, root, "170000 100000")

		// The sibling updated behind the agent's back (the hook sees its
		// write): listed again once, and the pod cgroup leaves it its room.
		side, err := rt.Find(context.Background(), "uid-1", "side")
		if err != nil {
			t.Fatal(err)
		}
		rt.take()
		if err := rt.Update(context.Background(), side.ID, cri.Resources{CPUShares: 1024, CPUPeriod: 100000, CPUQuota: 200000}); err != nil {
			t.Fatal(err)
		}
		marks.Write(pod + "/side")
		rt.take()
		// relisted: the next resize lists the pod once and sums it anew;
		// the one after does not list it.
		relisted := func(why, cpu, next, wantPod string) {
			t.Helper()
			resize(t, a, cpu)
			if got := rt.take(); got["PodContainers"] != 1 {
				t.Errorf("after %s: runtime calls %v, want one PodContainers", why, got)
			}
			podMax(t, root, wantPod)
			resize(t, a, next)
			if got := rt.take(); got["Update"] != 1 || len(got) != 1 {
				t.Errorf("listed since %s: runtime calls %v, want exactly one Update", why, got)
			}
		}
		relisted("the sibling's update", "800m", "900m", "280000 100000")

		// A container started in the pod: a new child cgroup. It has no
		// CPU limit, so neither has the pod (the kubelet's rule).
		cgrouptest.AddFake(t, root, pod+"/extra")
		rt.Add("uid-1", "extra", pod+"/extra")
		marks.Write(pod + "/extra")
		relisted("a container started", "1", "1100m", "max 100000")
	})

	t.Run("unmarked", func(t *testing.T) {
		rt, a, root, _ := setup(t, false)
		resize(t, a, "500m")
		rt.take()
		for _, cpu := range []string{"600m", "700m"} {
			resize(t, a, cpu)
			if got := rt.take(); got["PodContainers"] != 1 || got["Update"] != 1 {
				t.Errorf("no marks: runtime calls %v, want one PodContainers and one Update", got)
			}
		}
		podMax(t, root, "170000 100000")
	})
}
