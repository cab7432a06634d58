package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder wraps the real cgroup.Manager (on a fake tree) and records the
// order of writes; fail makes the write of one path/file fail.
type recorder struct {
	*cgroup.Manager
	mu     sync.Mutex
	writes []string
	fail   func(path string, r cgroup.Resources) error
	block  chan struct{}
	// blocked counts writes that have reached block (and so have done
	// their reads of the files before it).
	blocked atomic.Int32
}

func (r *recorder) Write(p string, res cgroup.Resources) error {
	if err := r.record(p, res); err != nil {
		return err
	}
	return r.Manager.Write(p, res)
}

// WriteFrom is the actuator's write (after its own read): recorded, failed
// and blocked as Write is.
func (r *recorder) WriteFrom(p string, res cgroup.Resources, cur cgroup.State) error {
	if err := r.record(p, res); err != nil {
		return err
	}
	return r.Manager.WriteFrom(p, res, cur)
}

func (r *recorder) record(p string, res cgroup.Resources) error {
	if r.block != nil {
		r.blocked.Add(1)
		<-r.block
	}
	r.mu.Lock()
	for _, v := range res.Values() {
		r.writes = append(r.writes, p+":"+v.File+"="+v.Data)
	}
	f := r.fail
	r.mu.Unlock()
	if f != nil {
		return f(p, res)
	}
	return nil
}

func (r *recorder) Writes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.writes...)
}

type fixture struct {
	root string
	cg   *recorder
	a    *agent.Agent
	l    *admission.Ledger
}

func newFixture(t testing.TB, alloc admission.Capacity, paths ...string) *fixture {
	t.Helper()
	root := cgrouptest.FakeTree(t, paths...)
	cg := &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())}
	l := admission.NewLedger(alloc)
	a := agent.New(cg, l, agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() {
		if err := a.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return &fixture{root, cg, a, l}
}

func q(s string) resource.Quantity { return resource.MustParse(s) }

func spec(name, path string, req, lim map[string]string) intent.Spec {
	s := intent.Spec{Target: intent.Target{Name: name, CgroupPath: path}}
	conv := func(m map[string]string) corev1.ResourceList {
		if m == nil {
			return nil
		}
		l := corev1.ResourceList{}
		for k, v := range m {
			l[corev1.ResourceName(k)] = q(v)
		}
		return l
	}
	s.Resources.Requests, s.Resources.Limits = conv(req), conv(lim)
	return s
}

// settle waits until the intent is terminal or Deferred.
func settle(t *testing.T, a *agent.Agent, id string) intent.Intent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for e := range a.Watch(ctx, agent.Filter{IntentID: id}) {
		if s := e.Intent.Status.State; s.Terminal() || s == intent.Deferred {
			return e.Intent
		}
	}
	t.Fatalf("intent %s did not settle", id)
	return intent.Intent{}
}

func submit(t *testing.T, a *agent.Agent, s intent.Spec) intent.Intent {
	t.Helper()
	it, _, err := a.Submit(s)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return settle(t, a, it.ID)
}

func want(t testing.TB, it intent.Intent, state intent.State, reason string) {
	t.Helper()
	if it.Status.State != state || (reason != "" && it.Status.Reason != reason) {
		t.Fatalf("intent %s: %s/%s %q, want %s/%s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message, state, reason)
	}
}

const gi = int64(1) << 30

func TestResizeWritesConvertedValues(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/pod/web")
	it := submit(t, f.a, spec("web", "/pod/web", map[string]string{"cpu": "500m", "memory": "256Mi"}, map[string]string{"cpu": "1", "memory": "512Mi"}))
	want(t, it, intent.Completed, intent.ReasonApplied)
	for file, v := range map[string]string{"cpu.max": "100000 100000", "cpu.weight": "59", "memory.max": "536870912"} {
		if got := cgrouptest.ReadFile(t, f.root, "/pod/web", file); got != v {
			t.Errorf("%s = %q, want %q", file, got, v)
		}
	}
	if got := f.l.Allocated(); got != (admission.Capacity{MilliCPU: 500, Memory: 256 << 20}) {
		t.Errorf("allocated %+v", got)
	}
	// The same again is a no-op: nothing is written.
	n := len(f.cg.Writes())
	it = submit(t, f.a, spec("web", "/pod/web", map[string]string{"cpu": "500m"}, map[string]string{"cpu": "1"}))
	want(t, it, intent.Completed, intent.ReasonNoChange)
	if len(f.cg.Writes()) != n {
		t.Errorf("no-op intent wrote %v", f.cg.Writes()[n:])
	}
}

func TestIdempotentID(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/c")
	s := spec("c", "/c", nil, map[string]string{"cpu": "1"})
	s.ID = "my-resize-1"
	a, created, err := f.a.Submit(s)
	if err != nil || !created {
		t.Fatal(err, created)
	}
	b, created, err := f.a.Submit(s)
	if err != nil || created || b.ID != a.ID {
		t.Fatalf("resubmit: %v %v %s", err, created, b.ID)
	}
	s.Resources.Limits[corev1.ResourceCPU] = q("2")
	if _, _, err := f.a.Submit(s); !errors.Is(err, agent.ErrConflict) {
		t.Fatalf("same id, other spec: %v", err)
	}
	settle(t, f.a, a.ID)
}

func TestInfeasibleAndDeferred(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 2000, Memory: 4 * gi}, "/a", "/b")
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "1500m"}, nil)), intent.Completed, "")
	inf := submit(t, f.a, spec("b", "/b", map[string]string{"cpu": "3"}, nil))
	want(t, inf, intent.Infeasible, intent.ReasonInfeasible)
	if !strings.Contains(inf.Status.Message, "cpu: requested 3, free 500m, allocatable 2") {
		t.Errorf("message %q", inf.Status.Message)
	}
	def := submit(t, f.a, spec("b", "/b", map[string]string{"cpu": "1"}, nil))
	want(t, def, intent.Deferred, intent.ReasonDeferred)
	if got := cgrouptest.ReadFile(t, f.root, "/b", "cpu.weight"); got != "100" {
		t.Errorf("deferred intent wrote cpu.weight=%s", got)
	}
	// a shrinks: b's deferred intent completes without being resubmitted.
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m"}, nil)), intent.Completed, "")
	done := settleTerminal(t, f.a, def.ID)
	want(t, done, intent.Completed, "")
	if got := f.l.Get("/b"); got.MilliCPU != 1000 {
		t.Errorf("b holds %+v", got)
	}
}

func settleTerminal(t *testing.T, a *agent.Agent, id string) intent.Intent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for e := range a.Watch(ctx, agent.Filter{IntentID: id}) {
		if e.Intent.Status.State.Terminal() {
			return e.Intent
		}
	}
	t.Fatalf("intent %s did not end", id)
	return intent.Intent{}
}

func TestDeferredRetriedWhenContainerGoes(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 2000, Memory: 4 * gi}, "/a", "/b")
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "1500m"}, nil)), intent.Completed, "")
	def := submit(t, f.a, spec("b", "/b", map[string]string{"cpu": "1"}, nil))
	want(t, def, intent.Deferred, "")
	cgrouptest.Remove(t, f.root, "/a")
	f.a.Resync()
	want(t, settleTerminal(t, f.a, def.ID), intent.Completed, "")
}

func TestNewerIntentSupersedesQueued(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/c")
	f.cg.block = make(chan struct{})
	first, _, err := f.a.Submit(spec("c", "/c", nil, map[string]string{"cpu": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, f.a, first.ID, intent.InProgress)
	second, _, _ := f.a.Submit(spec("c", "/c", nil, map[string]string{"cpu": "2"}))
	third, _, _ := f.a.Submit(spec("c", "/c", nil, map[string]string{"cpu": "3"}))
	close(f.cg.block)
	want(t, settleTerminal(t, f.a, first.ID), intent.Completed, "")
	s2 := settleTerminal(t, f.a, second.ID)
	want(t, s2, intent.Superseded, intent.ReasonSuperseded)
	if s2.Status.SupersededBy != third.ID {
		t.Errorf("superseded by %q, want %q", s2.Status.SupersededBy, third.ID)
	}
	want(t, settleTerminal(t, f.a, third.ID), intent.Completed, "")
	if got := cgrouptest.ReadFile(t, f.root, "/c", "cpu.max"); got != "300000 100000" {
		t.Errorf("cpu.max = %s", got)
	}
}

func waitState(t *testing.T, a *agent.Agent, id string, s intent.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for e := range a.Watch(ctx, agent.Filter{IntentID: id}) {
		if e.Intent.Status.State == s {
			return
		}
	}
	t.Fatalf("intent %s never reached %s", id, s)
}

func TestMemoryDecreaseBelowUsageRefused(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/c")
	want(t, submit(t, f.a, spec("c", "/c", nil, map[string]string{"memory": "1Gi"})), intent.Completed, "")
	cgrouptest.SetFile(t, f.root, "/c", "memory.current", fmt.Sprint(600<<20))
	it := submit(t, f.a, spec("c", "/c", map[string]string{"memory": "512Mi"}, map[string]string{"memory": "512Mi"}))
	want(t, it, intent.Failed, intent.ReasonMemoryBelowUsage)
	if !strings.Contains(it.Status.Message, "512Mi is below the current usage 600Mi") {
		t.Errorf("message %q", it.Status.Message)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.max"); got != fmt.Sprint(gi) {
		t.Errorf("memory.max changed to %s", got)
	}
	if got := f.l.Get("/c").Memory; got != gi {
		t.Errorf("ledger holds %d after a refused shrink", got)
	}
	s := spec("c", "/c", map[string]string{"memory": "512Mi"}, map[string]string{"memory": "512Mi"})
	s.AllowMemoryBelowUsage = true
	want(t, submit(t, f.a, s), intent.Completed, "")
}

func TestPodOrderingAndRollback(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}, "/pod", "/pod/a", "/pod/b")
	podSpec := func(name string, cpu string) intent.Spec {
		s := spec(name, "/pod/"+name, map[string]string{"cpu": "100m", "memory": "128Mi"}, map[string]string{"cpu": cpu, "memory": "256Mi"})
		s.Target.PodCgroupPath = "/pod"
		return s
	}
	want(t, submit(t, f.a, podSpec("a", "1")), intent.Completed, "")
	want(t, submit(t, f.a, podSpec("b", "1")), intent.Completed, "")
	if got := cgrouptest.ReadFile(t, f.root, "/pod", "cpu.max"); got != "200000 100000" {
		t.Fatalf("pod cpu.max = %s, want the sum of both limits", got)
	}
	// Growing: the pod first, then the container.
	n := len(f.cg.Writes())
	want(t, submit(t, f.a, podSpec("a", "2")), intent.Completed, "")
	w := f.cg.Writes()[n:]
	if idx(w, "/pod:cpu.max=300000 100000") > idx(w, "/pod/a:cpu.max=200000 100000") || idx(w, "/pod/a:cpu.max=200000 100000") < 0 {
		t.Errorf("increase order: %v", w)
	}
	// Shrinking: the container first, then the pod.
	n = len(f.cg.Writes())
	want(t, submit(t, f.a, podSpec("a", "500m")), intent.Completed, "")
	w = f.cg.Writes()[n:]
	if idx(w, "/pod/a:cpu.max=50000 100000") > idx(w, "/pod:cpu.max=150000 100000") || idx(w, "/pod:cpu.max=150000 100000") < 0 {
		t.Errorf("decrease order: %v", w)
	}
	// A failure on the second write rolls the first one back.
	f.cg.mu.Lock()
	f.cg.fail = func(p string, r cgroup.Resources) error {
		if p == "/pod/a" && r.CPUMax != nil {
			return &cgroup.WriteError{Path: p, File: "cpu.max", Err: errors.New("device or resource busy")}
		}
		return nil
	}
	f.cg.mu.Unlock()
	it := submit(t, f.a, podSpec("a", "3"))
	want(t, it, intent.Failed, intent.ReasonWriteFailed)
	if got := cgrouptest.ReadFile(t, f.root, "/pod", "cpu.max"); got != "150000 100000" {
		t.Errorf("pod cpu.max after rollback = %s", got)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/pod/a", "cpu.max"); got != "50000 100000" {
		t.Errorf("container cpu.max after rollback = %s", got)
	}
}

func idx(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestQoSClassMustNotChange(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}, "/g")
	want(t, submit(t, f.a, spec("g", "/g", nil, map[string]string{"cpu": "1", "memory": "1Gi"})), intent.Completed, "")
	_, _, err := f.a.Submit(spec("g", "/g", map[string]string{"cpu": "500m"}, nil))
	if !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), "Guaranteed to Burstable") {
		t.Fatalf("QoS change: %v", err)
	}
	// Both request and limit together keep it Guaranteed.
	want(t, submit(t, f.a, spec("g", "/g", map[string]string{"cpu": "2"}, map[string]string{"cpu": "2"})), intent.Completed, "")
}

func TestRejectedSubmissionsChangeNothing(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}, "/c")
	restart := spec("c", "/c", nil, map[string]string{"memory": "1Gi"})
	restart.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	for name, tc := range map[string]struct {
		s    intent.Spec
		want error
	}{
		"missing cgroup":  {spec("x", "/nope", nil, map[string]string{"cpu": "1"}), agent.ErrNotFound},
		"escape":          {spec("x", "/../../etc", nil, map[string]string{"cpu": "1"}), intent.ErrInvalid},
		"restart needed":  {restart, intent.ErrInvalid},
		"request > limit": {spec("c", "/c", map[string]string{"cpu": "2"}, map[string]string{"cpu": "1"}), intent.ErrInvalid},
	} {
		if _, _, err := f.a.Submit(tc.s); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if w := f.cg.Writes(); len(w) != 0 {
		t.Errorf("rejected intents wrote %v", w)
	}
	if len(f.a.List(agent.Filter{}, "")) != 0 {
		t.Error("rejected intents were stored")
	}
}

func TestCloseFailsQueued(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 1000, Memory: 8 * gi}, "/a", "/b")
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "1"}, nil)), intent.Completed, "")
	def := submit(t, f.a, spec("b", "/b", map[string]string{"cpu": "500m"}, nil))
	want(t, def, intent.Deferred, "")
	if err := f.a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	it, _ := f.a.Get(def.ID)
	want(t, it, intent.Failed, intent.ReasonShutdown)
	if _, _, err := f.a.Submit(spec("a", "/a", nil, nil)); err == nil {
		t.Error("Submit after Close succeeded")
	}
}
