package agent_test

import (
	"context"
	"errors"
	"fmt"
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

// hangingRuntime is agenttest.Runtime that can hang as a SIGSTOPped
// containerd does: a call waits until the runtime resumes or its bound
// (callTimeout, as cri.WithTimeout) passes, and then fails unavailable;
// an update the caller gave up on is still carried out once the runtime
// resumes, as containerd does with a request already on its socket.
type hangingRuntime struct {
	*agenttest.Runtime
	mu      sync.Mutex
	resumed chan struct{} // nil: running
	before  func()        // run before an update, once
	late    sync.WaitGroup
	landed  []int64 // the CPU quotas of the updates carried out late
}

const callTimeout = 300 * time.Millisecond

func (h *hangingRuntime) hang() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resumed == nil {
		h.resumed = make(chan struct{})
	}
}

func (h *hangingRuntime) resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resumed != nil {
		close(h.resumed)
		h.resumed = nil
	}
}

// wait is a call's wait on a hung runtime: nil once it runs, or the
// error cri.Client returns at its deadline, and the channel it resumes on.
func (h *hangingRuntime) wait(ctx context.Context) (<-chan struct{}, error) {
	h.mu.Lock()
	r := h.resumed
	h.mu.Unlock()
	if r == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	select {
	case <-r:
		return nil, nil
	case <-ctx.Done():
		return r, fmt.Errorf("%w: %w", cri.ErrUnavailable, ctx.Err())
	}
}

func (h *hangingRuntime) Version(ctx context.Context) (string, error) {
	if _, err := h.wait(ctx); err != nil {
		return "", err
	}
	return h.Runtime.Version(ctx)
}

func (h *hangingRuntime) Find(ctx context.Context, podUID, name string) (cri.Container, error) {
	if _, err := h.wait(ctx); err != nil {
		return cri.Container{}, err
	}
	return h.Runtime.Find(ctx, podUID, name)
}

func (h *hangingRuntime) Get(ctx context.Context, id string) (cri.Container, error) {
	if _, err := h.wait(ctx); err != nil {
		return cri.Container{}, err
	}
	return h.Runtime.Get(ctx, id)
}

func (h *hangingRuntime) PodContainers(ctx context.Context, podUID string) ([]cri.Container, error) {
	if _, err := h.wait(ctx); err != nil {
		return nil, err
	}
	return h.Runtime.PodContainers(ctx, podUID)
}

func (h *hangingRuntime) Update(ctx context.Context, id string, r cri.Resources) error {
	h.mu.Lock()
	f := h.before
	h.before = nil
	h.mu.Unlock()
	if f != nil {
		f()
	}
	resumed, err := h.wait(ctx)
	if err != nil {
		h.late.Add(1)
		go func() {
			defer h.late.Done()
			<-resumed
			_ = h.Runtime.Update(context.Background(), id, r)
			h.mu.Lock()
			h.landed = append(h.landed, r.CPUQuota)
			h.mu.Unlock()
		}()
		return err
	}
	return h.Runtime.Update(ctx, id, r)
}

// hungFixture is an agent with a pod's container web on a runtime that
// can hang, and a bare cgroup; web is known to the agent, at 500m.
func hungFixture(t *testing.T) (*agent.Agent, *hangingRuntime, string, func(cpu string) intent.Spec) {
	t.Helper()
	agent.SetProbeTimeout(t, 200*time.Millisecond)
	root := cgrouptest.FakeTree(t)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	rt := &hangingRuntime{Runtime: agenttest.NewRuntime(cg)}
	t.Cleanup(func() { rt.resume(); rt.late.Wait() })
	a := agent.New(rt.Cgroups(), admission.NewLedger(admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}),
		agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithRuntime(rt))
	t.Cleanup(func() { a.Close(context.Background()) })
	const pod = "/kubepods/burstable/poduid-1"
	cgrouptest.AddFake(t, root, pod)
	cgrouptest.AddFake(t, root, pod+"/web")
	cgrouptest.AddFake(t, root, "/bare")
	rt.Add("uid-1", "web", pod+"/web")
	web := func(cpu string) intent.Spec {
		s := intent.Spec{Target: intent.Target{Name: "web", PodUID: "uid-1"}}
		s.Resources.Limits = list2(map[string]string{"cpu": cpu})
		return s
	}
	want(t, submit(t, a, web("500m")), intent.Completed, intent.ReasonApplied)
	return a, rt, root, web
}

func quotaOf(t *testing.T, a *agent.Agent, rt *hangingRuntime) int64 {
	t.Helper()
	for _, c := range a.Containers() {
		if c.Name == "web" {
			ct, err := rt.Runtime.Get(context.Background(), c.ContainerID)
			if err != nil {
				t.Fatal(err)
			}
			return ct.Resources.CPUQuota
		}
	}
	t.Fatal("web is not managed")
	return 0
}

// TestHungRuntimeRefusesKnownContainer is test/faults TestContainerdHangs
// on fakes: the runtime hangs under an update in flight. A submission for
// the same container, which the agent knows and does not look up, is
// refused (ErrRuntime: 503 RuntimeUnavailable) rather than accepted and
// sent once the runtime resumes; the update in flight fails
// RuntimeUnavailable; bare cgroups are served; once the runtime resumes,
// the next intent completes through it.
func TestHungRuntimeRefusesKnownContainer(t *testing.T) {
	a, rt, root, web := hungFixture(t)
	stopped := make(chan struct{})
	rt.before = func() { rt.hang(); close(stopped) }
	mid, _, err := a.Submit(web("700m"))
	if err != nil {
		t.Fatal(err)
	}
	<-stopped

	refused, _, err := a.Submit(web("800m"))
	if !errors.Is(err, agent.ErrRuntime) {
		t.Errorf("submit while the runtime hangs: intent %s %v, err %v; want ErrRuntime", refused.ID, refused.Status.State, err)
	}
	bare := submit(t, a, spec("bare", "/bare", nil, map[string]string{"cpu": "200m"}))
	want(t, bare, intent.Completed, intent.ReasonApplied)
	want(t, settle(t, a, mid.ID), intent.Failed, intent.ReasonRuntimeUnavailable)

	rt.resume()
	rt.late.Wait()
	// What the runtime did late is the update in flight (700m), which the
	// agent gave up on; never the refused one.
	if q := quotaOf(t, a, rt); q == 80000 {
		t.Errorf("the refused intent's update (800m) reached the runtime after it resumed")
	}
	if got := cgrouptest.ReadFile(t, root, "/kubepods/burstable/poduid-1/web", "cpu.max"); got == "80000 100000" {
		t.Errorf("web cpu.max = %q: the refused intent took effect", got)
	}

	var back intent.Intent
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		it, _, err := a.Submit(web("900m"))
		if err == nil {
			back = settle(t, a, it.ID)
			break
		}
		if !errors.Is(err, agent.ErrRuntime) || time.Now().After(deadline) {
			t.Fatalf("submit after the runtime resumed: %v", err)
		}
	}
	want(t, back, intent.Completed, intent.ReasonApplied)
	if got := cgrouptest.ReadFile(t, root, "/kubepods/burstable/poduid-1/web", "cpu.max"); got != "90000 100000" {
		t.Errorf("web cpu.max = %q after the runtime resumed", got)
	}
}

// TestQueuedIntentNotSentToHungRuntime: an intent accepted while the
// runtime answered, queued behind one whose update then went unanswered,
// is not sent to the hung runtime: it fails RuntimeUnavailable at once
// and never takes effect once the runtime resumes.
func TestQueuedIntentNotSentToHungRuntime(t *testing.T) {
	a, rt, root, web := hungFixture(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	rt.before = func() { close(inFlight); <-release; rt.hang() }
	first, _, err := a.Submit(web("700m"))
	if err != nil {
		t.Fatal(err)
	}
	<-inFlight
	// The runtime answers (the update in flight has not reached it yet).
	queued, _, err := a.Submit(web("800m"))
	if err != nil {
		t.Fatalf("submit while the runtime answers: %v", err)
	}
	close(release)
	want(t, settle(t, a, first.ID), intent.Failed, intent.ReasonRuntimeUnavailable)
	want(t, settle(t, a, queued.ID), intent.Failed, intent.ReasonRuntimeUnavailable)

	rt.resume()
	rt.late.Wait()
	rt.mu.Lock()
	landed := rt.landed
	rt.mu.Unlock()
	for _, q := range landed {
		if q == 80000 {
			t.Errorf("the queued intent's update (800m) was sent to the hung runtime and carried out once it resumed (late updates %v)", landed)
		}
	}
	if got := cgrouptest.ReadFile(t, root, "/kubepods/burstable/poduid-1/web", "cpu.max"); got == "80000 100000" {
		t.Errorf("web cpu.max = %q: the failed intent took effect", got)
	}
}
