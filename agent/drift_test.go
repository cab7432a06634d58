package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// hookCgroups calls onRead before each read (Read, and the actuator's
// ReadFiles): to act in the window between the drift check's read and its
// decision.
type hookCgroups struct {
	*recorder
	mu     sync.Mutex
	onRead func(path string)
}

func (h *hookCgroups) Read(p string) (cgroup.State, error) {
	h.mu.Lock()
	f := h.onRead
	h.mu.Unlock()
	if f != nil {
		f(p)
	}
	return h.recorder.Read(p)
}

func (h *hookCgroups) ReadFiles(p string, files ...string) (cgroup.State, error) {
	h.mu.Lock()
	f := h.onRead
	h.mu.Unlock()
	if f != nil {
		f(p)
	}
	return h.recorder.ReadFiles(p, files...)
}

// clock is a settable time.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type driftFixture struct {
	root string
	cg   *hookCgroups
	a    *agent.Agent
	m    *metrics.Metrics
	clk  *clock
}

func newDriftFixture(t *testing.T, alloc admission.Capacity, opts []agent.Option, paths ...string) *driftFixture {
	t.Helper()
	root := cgrouptest.FakeTree(t, paths...)
	cg := &hookCgroups{recorder: &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())}}
	m := metrics.New(prometheus.NewRegistry())
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	opts = append([]agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithMetrics(m), agent.WithClock(clk.Now)}, opts...)
	a := agent.New(cg, admission.NewLedger(alloc), opts...)
	t.Cleanup(func() {
		if err := a.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return &driftFixture{root, cg, a, m, clk}
}

var bigNode = admission.Capacity{MilliCPU: 8000, Memory: 16 << 30}

// check runs a drift check over all managed containers (retrying while a
// worker is still winding down after its intent settled) and waits for the
// drift intents it made.
func (f *driftFixture) check(t *testing.T) agent.DriftResult {
	t.Helper()
	return checkAll(t, f.a)
}

func checkAll(t *testing.T, a *agent.Agent) agent.DriftResult {
	t.Helper()
	res, _ := checkPasses(t, a)
	return res
}

// checkPasses is checkAll that also says how many checks it ran: a pass that
// finds a worker still busy is retried, and each pass counts in the metrics.
func checkPasses(t *testing.T, a *agent.Agent) (agent.DriftResult, int) {
	t.Helper()
	managed, passes := 0, 0
	for _, c := range a.Containers() {
		if c.ManagesCPU || c.ManagesMemory {
			managed++
		}
	}
	var res agent.DriftResult
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		passes++
		if res = a.DriftCheck(context.Background()); res.Checked >= managed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drift check saw %d of %d containers idle", res.Checked, managed)
		}
	}
	for _, it := range a.List(agent.Filter{}, "") {
		if strings.HasPrefix(it.ID, agent.DriftIntentPrefix) && !it.Status.State.Terminal() {
			settle(t, a, it.ID)
		}
	}
	return res, passes
}

func (f *driftFixture) driftIntents() []intent.Intent {
	var out []intent.Intent
	for _, it := range f.a.List(agent.Filter{}, "") {
		if strings.HasPrefix(it.ID, agent.DriftIntentPrefix) {
			out = append(out, it)
		}
	}
	return out
}

func (f *driftFixture) container(t *testing.T, name string) agent.ContainerInfo {
	t.Helper()
	for _, c := range f.a.Containers() {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return agent.ContainerInfo{}
}

func (f *driftFixture) count(res, action string) float64 {
	return testutil.ToFloat64(f.m.Drift.WithLabelValues(res, action))
}

func TestDriftRestore(t *testing.T) {
	f := newDriftFixture(t, bigNode, nil, "/pod/a")
	it := submit(t, f.a, spec("a", "/pod/a", map[string]string{"cpu": "500m", "memory": "128Mi"}, map[string]string{"cpu": "1", "memory": "256Mi"}))
	if it.Status.State != intent.Completed {
		t.Fatalf("intent: %+v", it.Status)
	}
	if r := f.check(t); r.Checked != 1 || r.Drifted != 0 || r.Recheck {
		t.Fatalf("clean check: %+v", r)
	}

	cgrouptest.SetFile(t, f.root, "/pod/a", "cpu.max", "20000 100000")
	r := f.check(t)
	if r.Drifted != 1 || !r.Recheck {
		t.Fatalf("drift check: %+v", r)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/pod/a", "cpu.max"); got != "100000 100000" {
		t.Errorf("cpu.max after restore = %q", got)
	}
	ds := f.driftIntents()
	if len(ds) != 1 || ds[0].Status.State != intent.Completed || ds[0].Status.Reason != intent.ReasonApplied {
		t.Fatalf("drift intents: %+v", ds)
	}
	if ap := ds[0].Status.Applied.Of("/pod/a"); len(ap) != 2 || ap[1].File != "cpu.max" {
		// The cpu group (weight and max) is written whole.
		t.Errorf("applied: %+v", ds[0].Status.Applied)
	}
	if d := f.container(t, "a").Drift; d == nil || d.Action != agent.DriftActionRestore || d.Intent != ds[0].ID ||
		len(d.Files) != 1 || d.Files[0].Found != "20000 100000" || d.Files[0].Expected != "100000 100000" {
		t.Fatalf("drift info before the verifying check: %+v", d)
	}
	if f.count("cpu", "restore") != 1 || f.count("memory", "restore") != 0 {
		t.Errorf("drift_total: cpu/restore %v memory/restore %v", f.count("cpu", "restore"), f.count("memory", "restore"))
	}
	if got := testutil.ToFloat64(f.m.DriftedContainers); got != 1 {
		t.Errorf("drifted_containers = %v", got)
	}

	// The next check verifies the restore and clears the drift.
	checks := testutil.ToFloat64(f.m.DriftChecks.WithLabelValues("intent"))
	r, passes := checkPasses(t, f.a)
	if r.Drifted != 0 || r.Recheck {
		t.Fatalf("verifying check: %+v", r)
	}
	if d := f.container(t, "a").Drift; d != nil {
		t.Errorf("drift after the restore held: %+v", d)
	}
	if got := testutil.ToFloat64(f.m.DriftedContainers); got != 0 {
		t.Errorf("drifted_containers = %v", got)
	}
	if got := testutil.ToFloat64(f.m.DriftChecks.WithLabelValues("intent")); got != checks+float64(passes) {
		t.Errorf("drift_checks_total{against=intent} = %v after %d more checks, want %v", got, passes, checks+float64(passes))
	}

	// Memory too, and the container's last intent is the restore.
	cgrouptest.SetFile(t, f.root, "/pod/a", "memory.max", "max")
	f.check(t)
	if got := cgrouptest.ReadFile(t, f.root, "/pod/a", "memory.max"); got != "268435456" {
		t.Errorf("memory.max after restore = %q", got)
	}
	if f.count("memory", "restore") != 1 {
		t.Errorf("memory/restore = %v", f.count("memory", "restore"))
	}
	if c := f.container(t, "a"); !strings.HasPrefix(c.LastIntent, agent.DriftIntentPrefix) || c.Resources.CPULimit != 1000 {
		t.Errorf("container after restores: %+v", c)
	}
}

// Only the files of declared resources are watched: memory.max of a
// container whose intents named only cpu is not the agent's.
func TestDriftOnlyDeclared(t *testing.T) {
	f := newDriftFixture(t, bigNode, nil, "/a")
	submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m"}, nil))
	cgrouptest.SetFile(t, f.root, "/a", "memory.max", "1000000")
	if r := f.check(t); r.Drifted != 0 {
		t.Fatalf("undeclared memory reported: %+v", r)
	}
	cgrouptest.SetFile(t, f.root, "/a", "cpu.weight", "7")
	f.check(t)
	if got := cgrouptest.ReadFile(t, f.root, "/a", "cpu.weight"); got != fmt.Sprint(cgroup.MilliCPUToWeight(500)) {
		t.Errorf("cpu.weight = %q", got)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/a", "memory.max"); got != "1000000" {
		t.Errorf("memory.max written: %q", got)
	}
	if it := f.driftIntents(); len(it) != 1 || it[0].Spec.Resources.Requests[corev1.ResourceMemory] != (resource.Quantity{}) {
		t.Errorf("drift intent: %+v", it)
	}
}

func TestDriftPodCgroup(t *testing.T) {
	f := newDriftFixture(t, bigNode, nil, "/pod", "/pod/a", "/pod/b")
	sa := spec("a", "/pod/a", map[string]string{"cpu": "500m"}, map[string]string{"cpu": "1"})
	sa.Target.PodCgroupPath = "/pod"
	sb := spec("b", "/pod/b", map[string]string{"cpu": "250m"}, map[string]string{"cpu": "500m"})
	sb.Target.PodCgroupPath = "/pod"
	submit(t, f.a, sa)
	submit(t, f.a, sb)
	if got := cgrouptest.ReadFile(t, f.root, "/pod", "cpu.max"); got != "150000 100000" {
		t.Fatalf("pod cpu.max = %q", got)
	}
	cgrouptest.SetFile(t, f.root, "/pod", "cpu.max", "max 100000")
	f.check(t)
	if got := cgrouptest.ReadFile(t, f.root, "/pod", "cpu.max"); got != "150000 100000" {
		t.Errorf("pod cpu.max after restore = %q", got)
	}
	if ds := f.driftIntents(); len(ds) != 1 {
		t.Errorf("one restore for the pod, got %d", len(ds))
	}
}

func TestDriftReport(t *testing.T) {
	f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftPolicy(agent.DriftReport)}, "/a")
	submit(t, f.a, spec("a", "/a", nil, map[string]string{"cpu": "1", "memory": "256Mi"}))
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "max 100000")
	for range 3 {
		if r := f.check(t); r.Drifted != 1 || r.Recheck {
			t.Fatalf("check: %+v", r)
		}
	}
	if got := cgrouptest.ReadFile(t, f.root, "/a", "cpu.max"); got != "max 100000" {
		t.Errorf("report policy wrote cpu.max: %q", got)
	}
	d := f.container(t, "a").Drift
	if d == nil || d.Policy != agent.DriftReport || d.Action != agent.DriftActionReport || len(d.Files) != 1 || d.Files[0].File != "cpu.max" {
		t.Fatalf("drift info: %+v", d)
	}
	if f.count("cpu", "report") != 1 {
		t.Errorf("a drift that stays is counted once, got %v", f.count("cpu", "report"))
	}
	if len(f.driftIntents()) != 0 {
		t.Error("report policy made an intent")
	}
	// A change of the values found is a new drift; putting them back ends it.
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "50000 100000")
	f.check(t)
	if f.count("cpu", "report") != 2 {
		t.Errorf("cpu/report = %v", f.count("cpu", "report"))
	}
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "100000 100000")
	if r := f.check(t); r.Drifted != 0 || f.container(t, "a").Drift != nil {
		t.Errorf("drift not cleared: %+v", r)
	}
}

func TestDriftAdopt(t *testing.T) {
	f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftPolicy(agent.DriftAdopt)}, "/a")
	submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m", "memory": "128Mi"}, map[string]string{"cpu": "1", "memory": "256Mi"}))
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "200000 100000")
	cgrouptest.SetFile(t, f.root, "/a", "memory.max", "536870912")
	f.check(t)
	c := f.container(t, "a")
	want := intent.Resources{CPURequest: 500, CPULimit: 2000, MemoryRequest: 128 << 20, MemoryLimit: 512 << 20}
	if c.Resources != want || c.Drift != nil {
		t.Fatalf("after adopt: %+v drift %+v", c.Resources, c.Drift)
	}
	ds := f.driftIntents()
	if len(ds) != 1 || ds[0].Status.State != intent.Completed || ds[0].Status.Reason != agent.ReasonDriftAdopted || c.LastIntent != ds[0].ID {
		t.Fatalf("adoption record: %+v", ds)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/a", "cpu.max"); got != "200000 100000" {
		t.Errorf("adopt wrote cpu.max: %q", got)
	}
	if f.count("cpu", "adopt") != 1 || f.count("memory", "adopt") != 1 {
		t.Errorf("adopt counts: %v %v", f.count("cpu", "adopt"), f.count("memory", "adopt"))
	}
	if r := f.check(t); r.Drifted != 0 {
		t.Errorf("adopted values still drift: %+v", r)
	}
	// A later intent starts from the adopted values.
	it := submit(t, f.a, spec("a", "/a", map[string]string{"memory": "256Mi"}, nil))
	if it.Status.State != intent.Completed || f.container(t, "a").Resources.CPULimit != 2000 {
		t.Errorf("intent after adopt: %+v %+v", it.Status, f.container(t, "a").Resources)
	}
}

// A cpu.weight change is taken as the CPU request that gives it, on the
// ledger; one that does not fit is refused.
func TestDriftAdoptWeight(t *testing.T) {
	f := newDriftFixture(t, admission.Capacity{MilliCPU: 2000, Memory: 1 << 30}, []agent.Option{agent.WithDriftPolicy(agent.DriftAdopt)}, "/a")
	submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m"}, nil))
	cgrouptest.SetFile(t, f.root, "/a", "cpu.weight", fmt.Sprint(cgroup.MilliCPUToWeight(1000))) // 100 with runc's formula
	f.check(t)
	if c := f.container(t, "a"); c.Resources.CPURequest != 1000 || c.Allocated.MilliCPU != 1000 || c.Drift != nil {
		t.Fatalf("after adopting cpu.weight: %+v allocated %+v drift %+v", c.Resources, c.Allocated, c.Drift)
	}
	cgrouptest.SetFile(t, f.root, "/a", "cpu.weight", "10000") // 256 CPUs
	f.check(t)
	c := f.container(t, "a")
	if c.Resources.CPURequest != 1000 || c.Allocated.MilliCPU != 1000 || c.Drift == nil || c.Drift.Action != agent.DriftActionRefuse ||
		!strings.Contains(c.Drift.Message, "does not fit") {
		t.Fatalf("after a weight that does not fit: %+v allocated %+v drift %+v", c.Resources, c.Allocated, c.Drift)
	}
	if f.count("cpu", "refuse") != 1 {
		t.Errorf("cpu/refuse = %v", f.count("cpu", "refuse"))
	}
}

func TestDriftAdoptRefusals(t *testing.T) {
	for _, tc := range []struct{ name, file, data, msg string }{
		{"qos", "cpu.max", "200000 100000", intent.ReasonQoSChange},
		{"period", "cpu.max", "100000 50000", "period"},
		{"fraction", "cpu.max", "33333 100000", "whole number"},
		{"memory below request", "memory.max", "1048576", "memory request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftPolicy(agent.DriftAdopt)}, "/a")
			// Guaranteed.
			submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "1", "memory": "256Mi"}, map[string]string{"cpu": "1", "memory": "256Mi"}))
			cgrouptest.SetFile(t, f.root, "/a", tc.file, tc.data)
			f.check(t)
			c := f.container(t, "a")
			if c.Resources.CPULimit != 1000 || c.Resources.MemoryLimit != 256<<20 || c.QOSClass != "Guaranteed" {
				t.Errorf("resources changed: %+v", c.Resources)
			}
			if c.Drift == nil || c.Drift.Action != agent.DriftActionRefuse || !strings.Contains(c.Drift.Message, tc.msg) {
				t.Fatalf("drift: %+v", c.Drift)
			}
			if len(f.driftIntents()) != 0 {
				t.Error("refused adoption left an intent")
			}
		})
	}
}

// Another writer that puts its value back after every restore: after three
// restores within the window the agent backs off and reports, then tries
// once more after the backoff, and backs off twice as long when the fight
// resumes.
func TestDriftBackoff(t *testing.T) {
	f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftBackoff(time.Minute, 3)}, "/a")
	submit(t, f.a, spec("a", "/a", nil, map[string]string{"cpu": "1"}))
	fight := func() { cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "max 100000") }
	for i := 1; i <= 3; i++ {
		fight()
		f.check(t)
		if n := len(f.driftIntents()); n != i {
			t.Fatalf("restore %d: %d drift intents", i, n)
		}
		f.clk.Add(time.Second)
	}
	fight()
	for range 5 { // held off: no restore, and counted once
		if r := f.check(t); r.Drifted != 1 {
			t.Fatalf("%+v", r)
		}
		f.clk.Add(time.Second)
	}
	d := f.container(t, "a").Drift
	if n := len(f.driftIntents()); n != 3 || d == nil || d.Action != agent.DriftActionBackoff || d.BackoffUntil == nil || d.Restores != 3 {
		t.Fatalf("backoff: %d intents, drift %+v", n, d)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/a", "cpu.max"); got != "max 100000" {
		t.Errorf("restored during the backoff: %q", got)
	}
	if f.count("cpu", "backoff") != 1 || f.count("cpu", "restore") != 3 {
		t.Errorf("counts: backoff %v restore %v", f.count("cpu", "backoff"), f.count("cpu", "restore"))
	}
	first := d.BackoffUntil.Sub(f.clk.Now())

	// After the backoff: one restore; the writer fights again: a longer backoff.
	f.clk.Add(time.Minute)
	f.check(t)
	if n := len(f.driftIntents()); n != 4 {
		t.Fatalf("after the backoff: %d intents", n)
	}
	fight()
	f.check(t)
	d = f.container(t, "a").Drift
	if d == nil || d.Action != agent.DriftActionBackoff || d.BackoffUntil.Sub(f.clk.Now()) <= first+time.Minute/2 {
		t.Fatalf("second backoff: %+v (first %v)", d, first)
	}

	// A new intent from a client ends the fight.
	submit(t, f.a, spec("a", "/a", nil, map[string]string{"cpu": "2"}))
	fight()
	f.check(t)
	if n := len(f.driftIntents()); n != 5 {
		t.Errorf("after a new intent the agent restores again: %d intents", n)
	}
}

// A container with an intent in flight is not checked, and an intent that
// runs between the check's read and its decision makes it drop what it read.
func TestDriftRaces(t *testing.T) {
	f := newDriftFixture(t, bigNode, nil, "/a")
	submit(t, f.a, spec("a", "/a", nil, map[string]string{"cpu": "1"}))

	// An apply in flight: its write blocks.
	f.cg.block = make(chan struct{})
	it, _, err := f.a.Submit(spec("a", "/a", nil, map[string]string{"cpu": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, f.a, it.ID, intent.InProgress)
	// Until the apply is held at its write: before that it reads the files,
	// and the fixture's file write below is not atomic as the kernel's is.
	for f.cg.blocked.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "12345 100000")
	if r := f.a.DriftCheck(context.Background()); r.Checked != 0 || r.Drifted != 0 {
		t.Errorf("checked a container with an apply in flight: %+v", r)
	}
	close(f.cg.block) // and left closed: no write blocks from here on
	settle(t, f.a, it.ID)
	if r := f.check(t); r.Drifted != 0 {
		t.Fatalf("the intent's values drift: %+v", r)
	}

	// An intent that completes while the check reads.
	var raced atomic.Bool
	f.cg.mu.Lock()
	f.cg.onRead = func(string) {
		if !raced.Swap(true) { // the intent's own reads come back here
			submit(t, f.a, spec("a", "/a", nil, map[string]string{"cpu": "3"}))
		}
	}
	f.cg.mu.Unlock()
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "12345 100000")
	if r := f.a.DriftCheck(context.Background()); r.Checked != 0 || r.Drifted != 0 || !raced.Load() {
		t.Errorf("acted on a read raced by an intent: %+v (raced %v)", r, raced.Load())
	}
	f.cg.mu.Lock()
	f.cg.onRead = nil
	f.cg.mu.Unlock()
	if n := len(f.driftIntents()); n != 0 {
		t.Errorf("%d drift intents", n)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/a", "cpu.max"); got != "300000 100000" {
		t.Errorf("cpu.max = %q", got)
	}
}

// A runtime's container is restored through the runtime, so that the
// runtime's record matches the files again.
func TestDriftRestoreThroughRuntime(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	ra.AddContainer(t, "uid-1", "app", "/kubepods/pod1/ctr1")
	it, _, err := ra.Submit(intent.Spec{Target: intent.Target{Name: "app", PodUID: "uid-1"},
		Resources: spec("", "", nil, map[string]string{"cpu": "1", "memory": "64Mi"}).Resources})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, ra.Agent, it.ID)
	before := ra.Runtime.Updates()
	cgrouptest.SetFile(t, ra.Root, "/kubepods/pod1/ctr1", "cpu.max", "max 100000")
	checkAll(t, ra.Agent)
	var d intent.Intent
	for _, x := range ra.List(agent.Filter{}, "") {
		if strings.HasPrefix(x.ID, agent.DriftIntentPrefix) {
			d = settle(t, ra.Agent, x.ID)
		}
	}
	if d.Status.State != intent.Completed || d.Status.Via != "runtime" || d.Spec.Target.PodUID != "uid-1" {
		t.Fatalf("drift intent: %+v", d)
	}
	// The CPU step, and memory sent as well though its files held it, so
	// that the runtime's record is the one a kubelet-driven node keeps.
	if ra.Runtime.Updates() != before+2 {
		t.Errorf("runtime updates: %d -> %d", before, ra.Runtime.Updates())
	}
	if got := ra.File(t, "/kubepods/pod1/ctr1", "cpu.max"); got != "100000 100000" {
		t.Errorf("cpu.max = %q", got)
	}
}

// In Kubernetes mode (WithDriftLeavePods) a pod's container is not
// compared with the agent's last intent: its reference is the kubelet's
// allocation (agent/kube/allocdrift), and restoring the agent's values
// would undo a kubelet resize. A bare cgroup is still checked.
func TestDriftLeavePods(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode, agent.WithDriftLeavePods())
	ra.AddContainer(t, "uid-1", "app", "/kubepods/pod1/ctr1")
	it, _, err := ra.Submit(intent.Spec{Target: intent.Target{Name: "app", PodUID: "uid-1"},
		Resources: spec("", "", nil, map[string]string{"cpu": "1", "memory": "64Mi"}).Resources})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, ra.Agent, it.ID)
	before := ra.Runtime.Updates()
	// What a kubelet resize to 2 CPUs leaves in the files.
	cgrouptest.SetFile(t, ra.Root, "/kubepods/pod1/ctr1", "cpu.max", "200000 100000")
	if r := ra.DriftCheck(context.Background()); r.Checked != 0 || r.Drifted != 0 {
		t.Fatalf("drift check of a pod's container: %+v", r)
	}
	for _, x := range ra.List(agent.Filter{}, "") {
		if strings.HasPrefix(x.ID, agent.DriftIntentPrefix) {
			t.Fatalf("drift intent %s made for a pod's container", x.ID)
		}
	}
	if got := ra.File(t, "/kubepods/pod1/ctr1", "cpu.max"); got != "200000 100000" || ra.Runtime.Updates() != before {
		t.Errorf("cpu.max %q, runtime updates %d -> %d: the kubelet's values were overwritten", got, before, ra.Runtime.Updates())
	}
}

func TestRunDrift(t *testing.T) {
	f := newDriftFixture(t, bigNode, nil, "/a")
	submit(t, f.a, spec("a", "/a", nil, map[string]string{"cpu": "1"}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.a.RunDrift(ctx, 20*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "max 100000")
	deadline := time.Now().Add(5 * time.Second)
	for cgrouptest.ReadFile(t, f.root, "/a", "cpu.max") != "100000 100000" {
		if time.Now().After(deadline) {
			t.Fatal("not restored")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestParseDriftPolicy(t *testing.T) {
	for _, s := range []string{"report", "restore", "adopt", "off"} {
		if p, err := agent.ParseDriftPolicy(s); err != nil || string(p) != s {
			t.Errorf("%s: %v %v", s, p, err)
		}
	}
	if _, err := agent.ParseDriftPolicy("fix"); err == nil {
		t.Error("fix accepted")
	}
}

// Under adopt, a container's new limit is adopted; its pod cgroup, whose
// values follow from the containers', is then expected at the new sum, and
// a pod value that differs from it is only reported.
func TestDriftAdoptInPod(t *testing.T) {
	f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftPolicy(agent.DriftAdopt)}, "/pod", "/pod/a")
	s := spec("a", "/pod/a", map[string]string{"cpu": "500m"}, map[string]string{"cpu": "1"})
	s.Target.PodCgroupPath = "/pod"
	submit(t, f.a, s)
	// Another writer resizes container and pod, the pod first (as the kubelet does).
	cgrouptest.SetFile(t, f.root, "/pod", "cpu.max", "200000 100000")
	cgrouptest.SetFile(t, f.root, "/pod/a", "cpu.max", "200000 100000")
	f.check(t)
	if c := f.container(t, "a"); c.Resources.CPULimit != 2000 || c.Drift != nil {
		t.Fatalf("after adopt: %+v drift %+v", c.Resources, c.Drift)
	}
	// Only the pod: reported, not adopted, not written.
	cgrouptest.SetFile(t, f.root, "/pod", "cpu.max", "max 100000")
	f.check(t)
	d := f.container(t, "a").Drift
	if d == nil || d.Action != agent.DriftActionReport || len(d.Files) != 1 || d.Files[0].Cgroup != "/pod" || d.Files[0].Expected != "200000 100000" {
		t.Fatalf("pod drift: %+v", d)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/pod", "cpu.max"); got != "max 100000" {
		t.Errorf("pod cpu.max written: %q", got)
	}
}

// An adoption is journaled with the adopted resources: after a restart the
// agent expects the adopted values and finds no drift.
func TestDriftAdoptSurvivesRestart(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/a", "/b")
	dir := t.TempDir()
	a1, _, _ := journaled(t, root, dir, big, agent.WithDriftPolicy(agent.DriftAdopt))
	submit(t, a1, spec("a", "/a", map[string]string{"cpu": "500m"}, map[string]string{"cpu": "1"}))
	cgrouptest.SetFile(t, root, "/a", "cpu.max", "200000 100000")
	checkAll(t, a1)
	// The acceptance of a later intent is on disk, so the adoption before it is too.
	submit(t, a1, spec("b", "/b", map[string]string{"cpu": "100m"}, nil))

	a2, _, _ := journaled(t, root, crash(t, dir), big, agent.WithDriftPolicy(agent.DriftAdopt))
	recoverAgent(t, a2)
	var got intent.Resources
	for _, c := range a2.Containers() {
		if c.Name == "a" {
			got = c.Resources
		}
	}
	if got.CPULimit != 2000 || got.CPURequest != 500 {
		t.Fatalf("after restart: %+v", got)
	}
	if r := checkAll(t, a2); r.Drifted != 0 {
		t.Errorf("drift after restart: %+v", r)
	}
}

// The pod cgroup of a runtime's pod counts the containers the agent does
// not manage too, as apply does: a sidecar's limit is no drift, and a
// restore puts back the sum with it.
func TestDriftPodWithUnmanagedContainer(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	cgrouptest.AddFake(t, ra.Root, "/kubepods/burstable/poduid-1")
	ra.AddContainer(t, "uid-1", "app", "/kubepods/burstable/poduid-1/app")
	side := ra.AddContainer(t, "uid-1", "side", "/kubepods/burstable/poduid-1/side")
	if err := ra.Runtime.Update(context.Background(), side.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512}); err != nil {
		t.Fatal(err)
	}
	it, _, err := ra.Submit(intent.Spec{Target: intent.Target{Name: "app", PodUID: "uid-1"},
		Resources: spec("", "", nil, map[string]string{"cpu": "1"}).Resources})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, ra.Agent, it.ID)
	if got := ra.File(t, "/kubepods/burstable/poduid-1", "cpu.max"); got != "150000 100000" {
		t.Fatalf("pod cpu.max = %q", got)
	}
	if r := checkAll(t, ra.Agent); r.Drifted != 0 {
		t.Fatalf("the sidecar's share of the pod cgroup taken for drift: %+v %+v", r, ra.Containers())
	}
	cgrouptest.SetFile(t, ra.Root, "/kubepods/burstable/poduid-1", "cpu.max", "max 100000")
	checkAll(t, ra.Agent)
	if got := ra.File(t, "/kubepods/burstable/poduid-1", "cpu.max"); got != "150000 100000" {
		t.Errorf("pod cpu.max after restore = %q", got)
	}
	if r := checkAll(t, ra.Agent); r.Drifted != 0 {
		t.Errorf("after the restore: %+v", r)
	}
}

// With the kernel's limit-write marks, a clean container is read again
// only when something wrote its files, or at the sweep; a write the hook
// does not see is caught at the sweep.
func TestDriftFollowsWrites(t *testing.T) {
	w := agenttest.NewWriteMarks("/a", "/b")
	f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftWrites(w, time.Minute)}, "/a", "/b", "/c")
	var mu sync.Mutex
	reads := map[string]int{}
	f.cg.onRead = func(p string) { mu.Lock(); reads[p]++; mu.Unlock() }
	readsOf := func(p string) int { mu.Lock(); defer mu.Unlock(); n := reads[p]; reads[p] = 0; return n }
	for _, n := range []string{"a", "b", "c"} {
		submit(t, f.a, spec(n, "/"+n, nil, map[string]string{"cpu": "1", "memory": "256Mi"}))
	}
	readsOf("/a")
	readsOf("/b")
	readsOf("/c")
	check := func(wantChecked, wantSkipped int) {
		t.Helper()
		// A check passes over a container whose worker has not let go of
		// it yet (CI saw 2 read, 0 skipped): wait, as checkAll does.
		for deadline := time.Now().Add(5 * time.Second); !f.a.Idle(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("containers not idle after 5 s")
			}
		}
		r := f.a.DriftCheck(context.Background())
		if r.Checked != wantChecked || r.Skipped != wantSkipped {
			t.Fatalf("drift check: %d read, %d skipped; want %d, %d", r.Checked, r.Skipped, wantChecked, wantSkipped)
		}
		for _, it := range f.driftIntents() {
			if !it.Status.State.Terminal() {
				settle(t, f.a, it.ID)
			}
		}
	}
	check(3, 0) // the first check sweeps
	readsOf("/a")
	readsOf("/b")
	readsOf("/c")
	f.clk.Add(10 * time.Second)
	check(1, 2) // /c has no mark (the hook cannot name it): read each time
	if n := readsOf("/a") + readsOf("/b"); n != 0 {
		t.Errorf("clean, unwritten containers read %d times", n)
	}
	if n := readsOf("/c"); n != 1 {
		t.Errorf("/c without a mark read %d times, want 1", n)
	}

	// A stray write the hook sees: read, found, restored.
	cgrouptest.SetFile(t, f.root, "/a", "cpu.max", "max 100000")
	w.Write("/a")
	f.clk.Add(10 * time.Second)
	check(2, 1)
	if got := cgrouptest.ReadFile(t, f.root, "/a", "cpu.max"); got != "100000 100000" {
		t.Errorf("/a cpu.max after the check: %q, want restored", got)
	}
	w.Write("/a") // the restore's own write
	f.clk.Add(10 * time.Second)
	check(2, 1) // the restore verified
	f.clk.Add(10 * time.Second)
	check(1, 2)

	// A write the hook misses (cpu.weight.nice, say): only the sweep sees it.
	cgrouptest.SetFile(t, f.root, "/b", "memory.max", "1073741824")
	f.clk.Add(10 * time.Second)
	check(1, 2)
	if got := cgrouptest.ReadFile(t, f.root, "/b", "memory.max"); got != "1073741824" {
		t.Fatalf("/b memory.max %q", got)
	}
	f.clk.Add(time.Minute)
	check(3, 0)
	if got := cgrouptest.ReadFile(t, f.root, "/b", "memory.max"); got != "268435456" {
		t.Errorf("/b memory.max after the sweep: %q, want restored", got)
	}
	if n := len(f.driftIntents()); n != 2 {
		t.Errorf("%d drift intents, want 2 (a, then b)", n)
	}
}

// countedMarks counts the lookups of a cgroup's mark.
type countedMarks struct {
	*agenttest.WriteMarks
	mu      sync.Mutex
	lookups int
}

func (c *countedMarks) LimitWriteMark(p string) (pressure.WriteMark, bool) {
	c.mu.Lock()
	c.lookups++
	c.mu.Unlock()
	return c.WriteMarks.LimitWriteMark(p)
}

func (c *countedMarks) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.lookups
	c.lookups = 0
	return n
}

// With nothing written anywhere since the last check (the hook's stamp of
// the last write to any cgroup unchanged), a check skips its clean
// containers without looking up each one's mark; a write anywhere brings
// the lookups back for that check.
func TestDriftQuietNodeLooksNothingUp(t *testing.T) {
	w := &countedMarks{WriteMarks: agenttest.NewWriteMarks("/a", "/b")}
	f := newDriftFixture(t, bigNode, []agent.Option{agent.WithDriftWrites(w, time.Minute)}, "/a", "/b")
	for _, n := range []string{"a", "b"} {
		submit(t, f.a, spec(n, "/"+n, nil, map[string]string{"cpu": "1", "memory": "256Mi"}))
	}
	check := func(wantChecked, wantSkipped, wantLookups int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !f.a.Idle(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("containers not idle after 5 s")
			}
		}
		w.take()
		r := f.a.DriftCheck(context.Background())
		if n := w.take(); r.Checked != wantChecked || r.Skipped != wantSkipped || n != wantLookups {
			t.Fatalf("drift check: %d read, %d skipped, %d marks looked up; want %d, %d, %d", r.Checked, r.Skipped, n, wantChecked, wantSkipped, wantLookups)
		}
	}
	check(2, 0, 2) // the sweep: every container read, its mark taken
	f.clk.Add(10 * time.Second)
	check(0, 2, 0) // quiet: nothing looked up
	w.Write("/b")  // a write the hook saw, to the files' own values
	f.clk.Add(10 * time.Second)
	check(1, 1, 2)
	f.clk.Add(10 * time.Second)
	check(0, 2, 0)
}
