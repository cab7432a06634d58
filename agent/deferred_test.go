package agent_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup"
)

// TestDeferredKubeletOrder frees room for two of three Deferred intents and
// checks that the two are the kubelet's picks: the higher priority first,
// then the Guaranteed pod, and the oldest Burstable one waits.
func TestDeferredKubeletOrder(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 2000, Memory: 8 * gi}, "/big", "/x", "/y", "/z")
	burst := func(name, cpu string) intent.Spec {
		return spec(name, "/"+name, map[string]string{"cpu": cpu}, nil)
	}
	guaranteed := func(cpu string) intent.Spec {
		r := map[string]string{"cpu": cpu, "memory": "64Mi"}
		return spec("z", "/z", r, r)
	}
	for _, s := range []intent.Spec{burst("big", "1500m"), burst("x", "100m"), guaranteed("100m"), burst("y", "100m")} {
		want(t, submit(t, f.a, s), intent.Completed, "")
	}
	x := submit(t, f.a, burst("x", "500m")) // oldest, Burstable, priority 0
	z := submit(t, f.a, guaranteed("500m")) // Guaranteed, priority 0
	ys := burst("y", "500m")
	ys.Priority = 100
	y := submit(t, f.a, ys)
	for _, it := range []intent.Intent{x, y, z} {
		want(t, it, intent.Deferred, intent.ReasonDeferred)
	}
	// 800m free: room for two of the three.
	want(t, submit(t, f.a, burst("big", "700m")), intent.Completed, "")
	want(t, settleTerminal(t, f.a, y.ID), intent.Completed, "")
	want(t, settleTerminal(t, f.a, z.ID), intent.Completed, "")
	got, err := f.a.Get(x.ID)
	if err != nil {
		t.Fatal(err)
	}
	want(t, got, intent.Deferred, intent.ReasonDeferred)
	if alloc := f.l.Allocated().MilliCPU; alloc != 700+100+500+500 {
		t.Errorf("allocated %dm", alloc)
	}
}

// exits is an ExitWatcher driven by the test.
type exits struct {
	mu      sync.Mutex
	watched map[string]bool
	ch      chan cgroup.Event
	errs    chan error
}

func newExits() *exits {
	return &exits{watched: map[string]bool{}, ch: make(chan cgroup.Event, 8), errs: make(chan error, 1)}
}

func (e *exits) Watch(p string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.watched[p] = true
	return nil
}

func (e *exits) Unwatch(p string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.watched, p)
}

func (e *exits) Events() <-chan cgroup.Event { return e.ch }
func (e *exits) Errors() <-chan error        { return e.errs }

func (e *exits) isWatched(p string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.watched[p]
}

func TestExitFreesCapacityAtOnce(t *testing.T) {
	ex := newExits()
	f := newFixture(t, admission.Capacity{MilliCPU: 2000, Memory: 8 * gi}, "/a", "/b")
	f.a = agent.New(f.cg, f.l, agent.WithExitWatcher(ex), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = f.a.Close(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.a.Run(ctx, time.Hour) }() // no resync: only the exit can free a
	t.Cleanup(func() { cancel(); <-done })

	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "1500m"}, nil)), intent.Completed, "")
	if !ex.isWatched("/a") {
		t.Fatal("/a is not watched for its exit")
	}
	def := submit(t, f.a, spec("b", "/b", map[string]string{"cpu": "1"}, nil))
	want(t, def, intent.Deferred, "")
	ex.ch <- cgroup.Event{Path: "/a"}
	want(t, settleTerminal(t, f.a, def.ID), intent.Completed, "")
	if ex.isWatched("/a") {
		t.Error("/a still watched after it exited")
	}
	if n := len(f.a.Containers()); n != 1 {
		t.Errorf("%d containers managed, want 1 (b)", n)
	}
}

// BenchmarkDeferredWake measures the time from capacity freed (another
// container's shrink completing) to a Deferred intent completing, by the
// two intents' CompletedAt, on a fixture tree: the agent's own share of that
// latency. The same on the real kernel is in test/integration.
func BenchmarkDeferredWake(b *testing.B) {
	f := newFixture(b, admission.Capacity{MilliCPU: 2000, Memory: 8 * gi}, "/a", "/b")
	settled := func(id string, done func(intent.State) bool) intent.Intent {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for e := range f.a.Watch(ctx, agent.Filter{IntentID: id}) {
			if done(e.Intent.Status.State) {
				return e.Intent
			}
		}
		b.Fatalf("intent %s did not settle", id)
		return intent.Intent{}
	}
	terminal := func(s intent.State) bool { return s.Terminal() }
	run := func(s intent.Spec, done func(intent.State) bool) intent.Intent {
		it, _, err := f.a.Submit(s)
		if err != nil {
			b.Fatal(err)
		}
		return settled(it.ID, done)
	}
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		run(spec("a", "/a", map[string]string{"cpu": "1500m"}, nil), terminal)
		bcpu := "1000m"
		if i%2 == 1 {
			bcpu = "1100m" // a change every time
		}
		def := run(spec("b", "/b", map[string]string{"cpu": bcpu}, nil), func(s intent.State) bool { return s == intent.Deferred })
		want(b, def, intent.Deferred, "")
		freed := run(spec("a", "/a", map[string]string{"cpu": "100m"}, nil), terminal)
		done := settled(def.ID, terminal)
		want(b, done, intent.Completed, "")
		total += done.Status.CompletedAt.Sub(*freed.Status.CompletedAt)
		run(spec("b", "/b", map[string]string{"cpu": "100m"}, nil), terminal)
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns-freed-to-completed/op")
}

// TestPhaseMetrics: an applied intent is observed once in every phase,
// and its admission phase holds the time it spent Deferred.
func TestPhaseMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	clock := time.Unix(1000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	f := newFixture(t, admission.Capacity{MilliCPU: 2000, Memory: 8 * gi}, "/a", "/b")
	f.a = agent.New(f.cg, f.l, agent.WithMetrics(m), agent.WithClock(now), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = f.a.Close(context.Background()) })

	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "1500m"}, nil)), intent.Completed, "")
	def := submit(t, f.a, spec("b", "/b", map[string]string{"cpu": "1"}, nil))
	want(t, def, intent.Deferred, "")
	mu.Lock()
	clock = clock.Add(7 * time.Second) // Deferred for 7 s
	mu.Unlock()
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m"}, nil)), intent.Completed, "")
	want(t, settleTerminal(t, f.a, def.ID), intent.Completed, "")

	for _, phase := range metrics.Phases {
		if n := testutil.CollectAndCount(m.ResizePhase.WithLabelValues(phase, "completed").(prometheus.Collector)); n != 1 {
			t.Errorf("phase %s: %d series", phase, n)
		}
	}
	got := &dto.Metric{}
	if err := m.ResizePhase.WithLabelValues("admission", "completed").(prometheus.Metric).Write(got); err != nil {
		t.Fatal(err)
	}
	h := got.GetHistogram()
	if h.GetSampleCount() != 3 || h.GetSampleSum() < 7 || h.GetSampleSum() > 7.5 {
		t.Errorf("admission phase: %d samples, sum %.3f s; want 3 samples summing to the 7 s Deferred", h.GetSampleCount(), h.GetSampleSum())
	}
}

// TestRuntimeContainerExit: a runtime's container that exits is forgotten,
// unless the runtime already runs its next attempt, which the agent then
// follows.
func TestRuntimeContainerExit(t *testing.T) {
	ex := newExits()
	ra := runningRuntimeAgent(t, ex)

	ra.AddContainer(t, "uid-1", "web", "/pod1/web")
	ra.AddContainer(t, "uid-1", "side", "/pod1/side")
	for _, name := range []string{"web", "side"} {
		s := intent.Spec{Target: intent.Target{Name: name, PodUID: "uid-1"}}
		s.Resources.Requests = list2(map[string]string{"cpu": "1"})
		want(t, submit(t, ra.Agent, s), intent.Completed, "")
	}
	// web restarted by its runtime in a new cgroup: followed.
	ra.Runtime.Remove("uid-1", "web")
	ra.AddContainer(t, "uid-1", "web", "/pod1/web-2")
	ex.ch <- cgroup.Event{Path: "/pod1/web"}
	// side exits for good: forgotten, its 1 CPU freed.
	ra.Runtime.Remove("uid-1", "side")
	ex.ch <- cgroup.Event{Path: "/pod1/side"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cs := ra.Containers()
		if len(cs) == 1 && cs[0].Name == "web" && cs[0].CgroupPath == "/pod1/web-2" && ex.isWatched("/pod1/web-2") && !ex.isWatched("/pod1/side") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containers %+v", cs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := ra.Ledger.Allocated().MilliCPU; got != 1000 {
		t.Errorf("allocated %dm, want web's 1000m", got)
	}
}

// TestCountedBeforeSeen: a watcher that sees an intent's outcome finds the
// resize already counted. The count came after the event, and a client
// that scraped the agent at once sometimes did not find its resize.
func TestCountedBeforeSeen(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	f := newFixture(t, admission.Capacity{MilliCPU: 1 << 20, Memory: 8 * gi}, "/a")
	f.a = agent.New(f.cg, f.l, agent.WithMetrics(m), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = f.a.Close(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := f.a.Watch(ctx, agent.Filter{})
	for i := range 200 {
		it, _, err := f.a.Submit(spec("a", "/a", map[string]string{"cpu": []string{"100m", "200m"}[i%2]}, nil))
		if err != nil {
			t.Fatal(err)
		}
		for e := range events {
			if e.Intent.ID == it.ID && e.Intent.Status.State.Terminal() {
				break
			}
		}
		if got := testutil.ToFloat64(m.Resizes.WithLabelValues("completed")); got != float64(i+1) {
			t.Fatalf("intent %d seen completed with %v resizes counted", i+1, got)
		}
	}
}

// TestRestartedWhileResized: a container restarted by its runtime while
// the agent's worker still holds it after a resize is followed into its
// next attempt once the worker lets go, as an exit seen at any other time
// is, not forgotten with its capacity freed.
func TestRestartedWhileResized(t *testing.T) {
	// Unbuffered: a send returns once the agent has taken the event, and
	// the next once it has handled it.
	ex := &exits{watched: map[string]bool{}, ch: make(chan cgroup.Event)}
	ra := runningRuntimeAgent(t, ex)

	ra.AddContainer(t, "uid-1", "web", "/pod1/web")
	s := intent.Spec{Target: intent.Target{Name: "web", PodUID: "uid-1"}}
	s.Resources.Requests = list2(map[string]string{"cpu": "1"})
	want(t, submit(t, ra.Agent, s), intent.Completed, "")

	held := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(held) }) }
	t.Cleanup(release) // before the agent closes: its worker waits on it
	ra.Runtime.SetHeld(held)
	before := ra.Runtime.Updates()
	s.Resources.Requests = list2(map[string]string{"cpu": "1500m"})
	it, _, err := ra.Submit(s)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ra.Runtime.Updates() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second resize never reached the runtime")
		}
	}
	// Restarted by its runtime in a new cgroup, the worker still holding it.
	ra.Runtime.Remove("uid-1", "web")
	ra.AddContainer(t, "uid-1", "web", "/pod1/web-2")
	ex.ch <- cgroup.Event{Path: "/pod1/web"}
	ex.ch <- cgroup.Event{Path: "/nowhere"}
	ra.Runtime.SetHeld(nil)
	release()
	settle(t, ra.Agent, it.ID)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		cs := ra.Containers()
		if len(cs) == 1 && cs[0].CgroupPath == "/pod1/web-2" && ex.isWatched("/pod1/web-2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containers %+v, want web followed into /pod1/web-2", cs)
		}
	}
	if got := ra.Ledger.Allocated().MilliCPU; got == 0 {
		t.Errorf("web's capacity freed: allocated %dm", got)
	}
}

// runningRuntimeAgent is a runtime's agent whose Run loop takes ex's exits.
func runningRuntimeAgent(t *testing.T, ex *exits) *agenttest.RuntimeAgent {
	ra := agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, agent.WithExitWatcher(ex))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ra.Run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); <-done })
	return ra
}
