package latency

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

const (
	node  = "node-1"
	uid   = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"
	ctrID = "containerd://abcdef0123"
)

// The container's cgroup as the systemd driver names it.
var ctrCgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-abcdef0123.scope"

func res(reqCPU, limCPU, reqMem, limMem string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(reqCPU), corev1.ResourceMemory: resource.MustParse(reqMem)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limCPU), corev1.ResourceMemory: resource.MustParse(limMem)},
	}
}

func testPod(gen int64, r corev1.ResourceRequirements) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: uid, Generation: gen},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Resources: r}}},
		Status: corev1.PodStatus{
			QOSClass: corev1.PodQOSBurstable, ObservedGeneration: 1,
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "app", ContainerID: ctrID, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				AllocatedResources: r.Requests, Resources: r.DeepCopy(),
			}},
		},
	}
}

var (
	small = res("100m", "500m", "32Mi", "64Mi")
	big   = res("200m", "800m", "32Mi", "96Mi")
)

// runq is a source like the eBPF one: a run-queue histogram and reclaim
// stall per cgroup that the test moves.
type runq struct {
	counts map[string][]uint64
	gone   map[string]bool // cgroups removed: their reads fail
}

func (runq) Name() string { return "ebpf" }
func (q runq) Read(p string) (pressure.Sample, error) {
	if q.gone[p] {
		return pressure.Sample{}, fmt.Errorf("%w: %s", cgroup.ErrNotFound, p)
	}
	c := q.counts[p]
	var n uint64
	for _, v := range c {
		n = max(n, v)
	}
	return pressure.Sample{Source: "ebpf", RunqLatency: &pressure.Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: c, Count: n},
		MemoryStall: 2 * time.Millisecond * time.Duration(n)}, nil
}

type fixture struct {
	t     *testing.T
	root  string
	tr    *Tracker
	rec   *record.FakeRecorder
	reg   *prometheus.Registry
	q     runq
	clock time.Time
}

func newFixture(t *testing.T) *fixture {
	root := cgrouptest.FakeTree(t, ctrCgroup)
	f := &fixture{t: t, root: root, rec: record.NewFakeRecorder(10), reg: prometheus.NewRegistry(),
		q: runq{counts: map[string][]uint64{ctrCgroup: {0, 0, 0}}, gone: map[string]bool{}}, clock: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	f.files("50000 100000", 16, 64<<20)
	cgrouptest.FakePressure(t, root, ctrCgroup, 0, 0, 0)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	tr, err := New(Options{NodeName: node, Cgroups: cg, Sources: []pressure.Source{f.q, pressure.Files{CG: cg}},
		Metrics: metrics.NewKubeResize(f.reg), Recorder: f.rec, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return f.clock }})
	if err != nil {
		t.Fatal(err)
	}
	f.tr = tr
	return f
}

func (f *fixture) files(cpuMax string, weight int, mem int64) {
	cgrouptest.SetFile(f.t, f.root, ctrCgroup, "cpu.max", cpuMax)
	cgrouptest.SetFile(f.t, f.root, ctrCgroup, "cpu.weight", strings.TrimSpace(strings.Repeat(" ", 0)+itoa(weight)))
	cgrouptest.SetFile(f.t, f.root, ctrCgroup, "memory.max", itoa(int(mem)))
}

func itoa(v int) string { return strings.TrimSpace(strings.ReplaceAll(jsonNum(v), "\n", "")) }
func jsonNum(v int) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// at moves the clock by d and ticks.
func (f *fixture) at(d time.Duration) time.Time {
	f.clock = f.clock.Add(d)
	f.tr.tick(f.clock)
	return f.clock
}

func (f *fixture) observe(p *corev1.Pod) { f.tr.observe(p, f.clock) }

func resized(gen int64, acceptedAt time.Time) *corev1.Pod {
	p := testPod(gen, big)
	p.Status.ContainerStatuses[0].AllocatedResources = small.Requests
	p.Status.ContainerStatuses[0].Resources = small.DeepCopy()
	p.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Subresource: "status", Time: &metav1.Time{Time: acceptedAt.Add(time.Hour)}},
		{Manager: "kubectl-patch", Subresource: "resize", Time: &metav1.Time{Time: acceptedAt}},
	}
	return p
}

func only(t *testing.T, tr *Tracker) api.KubeResize {
	t.Helper()
	l := tr.Resizes()
	if len(l) != 1 {
		t.Fatalf("%d resizes listed, want 1: %+v", len(l), l)
	}
	return l[0]
}

func phases(r api.KubeResize) map[string]float64 {
	m := map[string]float64{}
	for _, p := range r.Phases {
		m[p.Phase] = p.Seconds
	}
	return m
}

// The kubelet's sequence as it is seen on a real node: InProgress with the
// generation, the files, then the status. Phases come out in order with
// the times the tracker saw them; the window after ends 30 s after the
// files held the values, and only then is the Event recorded.
func TestPhasesInOrder(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	for range 8 { // 40 s of samples before the resize
		f.at(5 * time.Second)
	}
	// The located container is a pressure target (the collector's in
	// Kubernetes mode).
	if ts := f.tr.Targets(); len(ts) != 1 || ts[0].Cgroup != ctrCgroup || ts[0].Name == "" || ts[0].PodUID == "" {
		t.Errorf("Targets() %+v, want the pod's container at %s", ts, ctrCgroup)
	}
	f.q.counts[ctrCgroup] = []uint64{10, 60, 100} // starved: p50 in (1ms, 10ms]
	cgrouptest.FakePressure(t, f.root, ctrCgroup, 15_000_000, 80, 0)
	seen := f.at(time.Second)
	f.observe(resized(2, seen.Add(-600*time.Millisecond).Truncate(time.Second)))
	f.at(100 * time.Millisecond)

	p := resized(2, seen)
	p.Status.ObservedGeneration = 2
	kubeletAt := seen.Truncate(time.Second)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue, ObservedGeneration: 2, LastTransitionTime: metav1.Time{Time: kubeletAt}}}
	f.clock = f.clock.Add(200 * time.Millisecond)
	f.observe(p)
	f.at(300 * time.Millisecond) // files not yet changed
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	f.at(100 * time.Millisecond)

	p = testPod(2, big)
	p.Status.ObservedGeneration = 2
	f.clock = f.clock.Add(time.Second)
	f.observe(p)

	r := only(t, f.tr)
	if r.Outcome != "open" || r.AdmittedBy != "PodResizeInProgress" || r.Manager != "kubectl-patch" {
		t.Errorf("outcome %s admitted by %s manager %s, want open (window after), PodResizeInProgress, kubectl-patch", r.Outcome, r.AdmittedBy, r.Manager)
	}
	ph := phases(r)
	want := map[string]float64{"admitted": 0.3, "cgroup": 0.7, "status": 1.7}
	for k, v := range want {
		if d := ph[k] - v; d > 1e-6 || d < -1e-6 {
			t.Errorf("phase %s %.3fs, want %.3fs", k, ph[k], v)
		}
	}
	if r.KubeletAdmittedAt == nil || !r.KubeletAdmittedAt.Equal(kubeletAt) {
		t.Errorf("kubelet's admission time %v, want the condition's lastTransitionTime %v", r.KubeletAdmittedAt, kubeletAt)
	}
	if a := ph["accepted"]; a < 0.4 || a > 1.0 {
		t.Errorf("accepted phase %.3fs: want the managedFields time (whole seconds) to seen", a)
	}
	if got := testutil.CollectAndCount(f.reg, "resize_agent_kube_resize_duration_seconds"); got != 4 {
		t.Errorf("%d series, want the 4 phases completed", got)
	}
	select {
	case e := <-f.rec.Events:
		t.Fatalf("Event before the window after ended: %s", e)
	default:
	}
	// Relief: few waits, short ones, no throttling.
	f.q.counts[ctrCgroup] = []uint64{1000, 1000, 1000}
	for range 6 {
		f.at(5 * time.Second)
	}
	e := <-f.rec.Events
	if !strings.HasPrefix(e, "Normal ResizeMeasured generation 2 by kubectl-patch (app) completed:") {
		t.Fatalf("event %q", e)
	}
	for _, s := range []string{"admitted +0.30s", "cgroup +0.70s", "status +1.70s", "throttled ", "runq p50 ", "cpu psi "} {
		if !strings.Contains(e, s) {
			t.Errorf("event %q lacks %q", e, s)
		}
	}
	r = only(t, f.tr)
	if r.Outcome != "completed" || len(r.Pressure) != 1 || r.Pressure[0].Before == nil || r.Pressure[0].After == nil {
		t.Fatalf("after the window: %+v", r)
	}
	b, a := r.Pressure[0].Before, r.Pressure[0].After
	if b.Seconds < 29 || b.Seconds > 36 || a.Seconds < 29 || a.Seconds > 36 {
		t.Errorf("windows %.1fs before, %.1fs after, want about 30s", b.Seconds, a.Seconds)
	}
	if b.RunqP50Seconds == nil || a.RunqP50Seconds == nil || !(*a.RunqP50Seconds < *b.RunqP50Seconds) {
		t.Errorf("run-queue p50 before %v after %v: want lower after", b.RunqP50Seconds, a.RunqP50Seconds)
	}
	if b.ThrottledSeconds <= 0 || a.ThrottledSeconds != 0 {
		t.Errorf("throttled %.3fs before, %.3fs after", b.ThrottledSeconds, a.ThrottledSeconds)
	}
}

// A resize of a container younger than a sampling period (a pod created
// and resized at once, as in docs/walkthrough.md): no reading of its own
// yet, so the window before runs from the container's start, when its
// counters were zero (a CI node left the Event's "before" empty).
func TestBeforeWindowOfAYoungContainer(t *testing.T) {
	f := newFixture(t)
	f.at(time.Second) // a sampling round with no pod: the next is 5 s away
	started := f.clock.Add(-3 * time.Second)
	p := testPod(1, small)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	f.at(100 * time.Millisecond) // located, not sampled
	f.q.counts[ctrCgroup] = []uint64{10, 60, 100}
	cgrouptest.FakePressure(t, f.root, ctrCgroup, 1_500_000, 80, 0)

	p = resized(2, f.clock)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	f.at(100 * time.Millisecond)
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	f.at(100 * time.Millisecond)
	p = testPod(2, big)
	p.Status.ObservedGeneration = 2
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	for range 8 {
		f.at(5 * time.Second)
	}
	r := only(t, f.tr)
	if r.Outcome != "completed" || len(r.Pressure) != 1 || r.Pressure[0].Before == nil || r.Pressure[0].After == nil {
		t.Fatalf("after the window: %+v", r)
	}
	b := r.Pressure[0].Before
	if b.Seconds < 3 || b.Seconds > 3.5 {
		t.Errorf("window before %.2fs, want from the start (3.2s)", b.Seconds)
	}
	if b.RunqCount != 100 || b.RunqP50Seconds == nil || *b.RunqP50Seconds <= 0.001 || *b.RunqP50Seconds > 0.01 {
		t.Errorf("window before: %d run-queue waits, p50 %v; want the 100 since the start, p50 in (1ms, 10ms]", b.RunqCount, b.RunqP50Seconds)
	}
	if b.ThrottledSeconds <= 0 || b.CPUPressure == nil || *b.CPUPressure <= 0 {
		t.Errorf("window before: throttled %.3fs, cpu psi %v; want both from the start", b.ThrottledSeconds, b.CPUPressure)
	}

	// An old container with no reading (sampling capped, say) still gets
	// no window: a since-start average would not be "before".
	f2 := newFixture(t)
	f2.at(time.Second)
	p = testPod(1, small)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: f2.clock.Add(-time.Hour)}
	f2.observe(p)
	f2.at(100 * time.Millisecond)
	f2.observe(resized(2, f2.clock))
	f2.at(100 * time.Millisecond)
	if r := f2.tr.pods[uid].open; r == nil || !r.tookBefore || len(r.before) != 0 {
		t.Errorf("an hour-old container with no reading: resize %+v, want its window before taken and empty", r)
	}
}

func cgroupWeight(milli int64) int { return int(cgroup.MilliCPUToWeight(milli)) }

// A kubelet that admits, actuates and reports between two status updates:
// the generation observed with nothing pending is the admission.
func TestFastKubeletObservedGeneration(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.at(time.Second)
	f.observe(resized(2, f.clock))
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	f.at(200 * time.Millisecond)
	p := testPod(2, big)
	p.Status.ObservedGeneration = 2
	f.clock = f.clock.Add(time.Second)
	f.observe(p)
	ph := phases(only(t, f.tr))
	if ph["admitted"] != ph["cgroup"] || ph["cgroup"] >= ph["status"] {
		t.Errorf("phases %v: admitted is the cgroup time when the files are first, before the status", ph)
	}
}

// A status that reports the resize before the tracker's next poll of the
// files (the agent short of CPU, the watch event and the tick together):
// the files are read at once, so the cgroup phase is not after the status
// (seen on the node: cgroup 5.64 s, status 5.53 s).
func TestStatusBeforePollReadsFiles(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.at(time.Second)
	f.observe(resized(2, f.clock))
	f.at(100 * time.Millisecond) // files not yet changed
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	p := testPod(2, big)
	p.Status.ObservedGeneration = 2
	f.clock = f.clock.Add(500 * time.Millisecond) // no tick in between
	f.observe(p)
	ph := phases(only(t, f.tr))
	if _, ok := ph["cgroup"]; !ok || ph["cgroup"] > ph["status"] || ph["admitted"] > ph["cgroup"] {
		t.Errorf("phases %v: want admitted <= cgroup <= status", ph)
	}
}

// Stale conditions of the previous generation say nothing of this one; an
// Infeasible verdict for it ends it with a Warning.
func TestInfeasibleAndStaleConditions(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	p := resized(2, f.clock)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue, ObservedGeneration: 1}}
	f.observe(p)
	if r := only(t, f.tr); r.AdmittedBy != "" {
		t.Fatalf("admitted by %s from a condition of generation 1", r.AdmittedBy)
	}
	p = resized(2, f.clock)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonInfeasible, Message: "Node didn't have enough capacity", ObservedGeneration: 2}}
	f.at(time.Second)
	f.observe(p)
	r := only(t, f.tr)
	if r.Outcome != "infeasible" || r.Error == "" {
		t.Errorf("outcome %s error %q", r.Outcome, r.Error)
	}
	if e := <-f.rec.Events; !strings.HasPrefix(e, "Warning ResizeMeasured") || !strings.Contains(e, "infeasible") {
		t.Errorf("event %q", e)
	}
	if n := testutil.ToFloat64(counter(t, f.reg, "infeasible")); n != 1 || len(r.Phases) != 1 || r.Phases[0].Phase != "accepted" {
		t.Errorf("an infeasible resize: %v observations, phases %+v; want accepted only", n, r.Phases)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, outcome string) prometheus.Collector {
	t.Helper()
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		var n float64
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && l.GetValue() == outcome {
						n += float64(m.GetHistogram().GetSampleCount())
					}
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("n", "n", nil, nil), prometheus.GaugeValue, n)
	})
}

// A second resize before the first is done supersedes it; a generation
// change that is not a resize starts none; a deleted pod ends its resize.
func TestSupersededNotAResizeAndGone(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.observe(resized(2, f.clock))
	f.at(time.Second)
	f.observe(testPod(3, res("300m", "900m", "32Mi", "96Mi")))
	l := f.tr.Resizes()
	if len(l) != 2 || l[0].Outcome != "superseded" || l[1].Generation != 3 || l[1].Outcome != "open" {
		t.Fatalf("resizes %+v", l)
	}
	p := testPod(4, res("300m", "900m", "32Mi", "96Mi"))
	p.Spec.ActiveDeadlineSeconds = new(int64)
	f.observe(p)
	if n := len(f.tr.Resizes()); n != 2 {
		t.Errorf("%d resizes after a generation change with the same resources", n)
	}
	f.tr.gone(uid, f.clock)
	if l := f.tr.Resizes(); l[1].Outcome != "gone" {
		t.Errorf("after the pod was deleted: %+v", l[1])
	}
	// A pod seen for the first time (a restart of the agent) is a baseline.
	f.observe(resized(7, f.clock))
	if n := len(f.tr.Resizes()); n != 2 {
		t.Errorf("a resize counted for a pod seen first at generation 7")
	}
}

// Files that never hold what the status reports: the resize completes
// Grace after the status, without a cgroup phase, and says what was found.
func TestFilesNeverHold(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.at(time.Second)
	f.observe(resized(2, f.clock))
	p := testPod(2, big)
	p.Status.ObservedGeneration = 2
	f.observe(p)
	f.at(29 * time.Second)
	if r := only(t, f.tr); r.Outcome != "open" {
		t.Fatalf("completed before the grace: %+v", r)
	}
	f.at(2 * time.Second)
	r := only(t, f.tr)
	if r.Outcome != "completed" || hasPhase(&r, "cgroup") || !strings.Contains(r.Summary, "cpu.max 50000 100000 (want quota 80000)") {
		t.Errorf("%+v", r)
	}
}

func TestTimeout(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.observe(resized(2, f.clock))
	f.at(11 * time.Minute)
	if r := only(t, f.tr); r.Outcome != "timeout" {
		t.Errorf("outcome %s", r.Outcome)
	}
}

func TestServeHTTP(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.observe(resized(2, f.clock))
	for _, c := range []struct {
		q    string
		code int
		n    int
	}{{"", 200, 1}, {"?pod=ns/web", 200, 1}, {"?pod=ns/other", 200, 0}, {"?pod=" + strings.Repeat("x", 400), 400, -1}} {
		w := httptest.NewRecorder()
		f.tr.ServeHTTP(w, httptest.NewRequest("GET", "/v1/kube/resizes"+c.q, nil))
		if w.Code != c.code {
			t.Errorf("%s: %d", c.q, w.Code)
			continue
		}
		if c.n < 0 {
			continue
		}
		var l []api.KubeResize
		if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil || len(l) != c.n {
			t.Errorf("%s: %d resizes (%v)", c.q, len(l), err)
		}
	}
}

func TestCandidates(t *testing.T) {
	got := candidates(uid, corev1.PodQOSBurstable, ctrID)
	if len(got) != 2 || got[0] != ctrCgroup || got[1] != "/kubepods/burstable/pod"+uid+"/abcdef0123" {
		t.Errorf("%q", got)
	}
	if g := candidates(uid, corev1.PodQOSGuaranteed, "cri-o://x1"); g[0] != "/kubepods.slice/kubepods-pod"+strings.ReplaceAll(uid, "-", "_")+".slice/crio-x1.scope" {
		t.Errorf("%q", g)
	}
	for _, bad := range []string{"", "abc", "containerd://", "containerd://../x", "containerd://a/b"} {
		if c := candidates(uid, corev1.PodQOSBurstable, bad); c != nil {
			t.Errorf("%q: %q", bad, c)
		}
	}
}

func TestQuantile(t *testing.T) {
	b := []float64{0.001, 0.01, 0.1}
	for _, c := range []struct {
		q     float64
		cum   []uint64
		total uint64
		want  float64
	}{
		{0.5, []uint64{10, 60, 100}, 100, 0.001 + 0.009*40/50},
		{0.99, []uint64{10, 60, 100}, 100, 0.01 + 0.09*39/40},
		{0.5, []uint64{100, 100, 100}, 100, 0.0005},
		{0.99, []uint64{0, 0, 0}, 10, 0.1}, // all past the last bound
	} {
		got := quantile(c.q, b, c.cum, c.total)
		if got == nil || *got-c.want > 1e-12 || c.want-*got > 1e-12 {
			t.Errorf("q%.2f %v: %v, want %v", c.q, c.cum, got, c.want)
		}
	}
	if quantile(0.5, b, []uint64{0, 0, 0}, 0) != nil {
		t.Error("a quantile of nothing")
	}
}

func TestExpectMismatch(t *testing.T) {
	e := expect(big)
	ok := cgroup.State{CPUMax: cgroup.CPUMax{Quota: 80000, Period: 100000}, CPUWeight: cgroup.MilliCPUToWeight(200), MemoryMax: 96 << 20}
	if m := e.mismatch(ok, 4096); m != "" {
		t.Errorf("%s", m)
	}
	noLimit := expect(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}})
	if m := noLimit.mismatch(cgroup.State{CPUMax: cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}, CPUWeight: cgroup.MilliCPUToWeight(250), MemoryMax: cgroup.Unlimited}, 4096); m != "" {
		t.Errorf("%s", m)
	}
	odd := expect(res("100m", "100m", "10000k", "10000k")) // not a page multiple: the kernel rounds down
	if m := odd.mismatch(cgroup.State{CPUMax: cgroup.CPUMax{Quota: 10000, Period: 100000}, CPUWeight: cgroup.MilliCPUToWeight(100), MemoryMax: 10000000 - 10000000%4096}, 4096); m != "" {
		t.Errorf("%s", m)
	}
	if m := e.mismatch(cgroup.State{CPUMax: cgroup.CPUMax{Quota: 50000, Period: 100000}, CPUWeight: 1, MemoryMax: 64 << 20}, 4096); strings.Count(m, "want") != 3 {
		t.Errorf("%s", m)
	}
}

// On the node (run 2 of TestLatency) a tick that read the clock before
// waiting for the lock, held by the informer's handler stamping
// PodResizeInProgress, put the cgroup phase 30 ms before admitted. The
// daemon's calls pass no time: it is read under the lock.
func TestStampedUnderTheLock(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	clock := f.clock
	f.tr.opts.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	f.tr.observe(testPod(1, small), time.Time{})
	f.tr.observe(resized(2, clock), time.Time{})
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	f.tr.mu.Lock() // the handler holds it
	done := make(chan struct{})
	go func() { f.tr.tick(time.Time{}); close(done) }()
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	clock = clock.Add(time.Second)
	mu.Unlock()
	f.tr.mu.Unlock()
	<-done
	r := f.tr.pods[uid].open
	if d := r.cgroupAt.Sub(r.seen); d != time.Second {
		t.Errorf("cgroup phase %v, want 1s: stamped before the lock was taken", d)
	}
}

// slowSource is a pressure source whose reads wait for release, as reads
// do on a node short of CPU.
type slowSource struct{ entered, release chan struct{} }

func (slowSource) Name() string { return "slow" }
func (s slowSource) Read(string) (pressure.Sample, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	return pressure.Sample{}, errors.New("slow")
}

// A CI run's node saw a resize 10 s after another informer of the same
// daemon had: the handler, which stamps when the agent saw a change,
// waited for a tick reading every container's pressure under the lock.
// The reads are done without it.
func TestSlowReadsDoNotHoldTheHandler(t *testing.T) {
	f := newFixture(t)
	f.observe(testPod(1, small))
	f.at(time.Second) // locates the container
	slow := slowSource{entered: make(chan struct{}, 1), release: make(chan struct{})}
	f.tr.opts.Sources = append(f.tr.opts.Sources, slow)
	f.tr.nextSample = time.Time{}
	ticked := make(chan struct{})
	go func() { f.tr.tick(f.clock); close(ticked) }()
	<-slow.entered
	observed := make(chan struct{})
	go func() { f.tr.observe(resized(2, f.clock), f.clock); close(observed) }()
	select {
	case <-observed:
	case <-time.After(5 * time.Second):
		t.Error("the handler waited for the tick's reads")
	}
	close(slow.release)
	<-ticked
	<-observed
	if r := only(t, f.tr); r.Generation != 2 || r.Outcome != "open" {
		t.Errorf("resize %+v, want generation 2 open", r)
	}
}

// The kubelet updates a pod's containers one after another; on the node
// the second container's files held the new values 2.1 s after the first's.
// Each container's time is kept, and the cgroup phase is the last of them.
func TestContainerCgroupsOneAfterAnother(t *testing.T) {
	f := newFixture(t)
	const id2 = "containerd://fedcba9876"
	cg2 := strings.Replace(ctrCgroup, "abcdef0123", "fedcba9876", 1)
	cgrouptest.AddFake(t, f.root, cg2)
	cgrouptest.SetFile(t, f.root, cg2, "cpu.max", "50000 100000")
	cgrouptest.SetFile(t, f.root, cg2, "cpu.weight", itoa(16))
	cgrouptest.SetFile(t, f.root, cg2, "memory.max", itoa(64<<20))
	two := func(p *corev1.Pod) *corev1.Pod {
		c := p.Spec.Containers[0]
		c.Name = "hog"
		p.Spec.Containers = append(p.Spec.Containers, c)
		cs := *p.Status.ContainerStatuses[0].DeepCopy()
		cs.Name, cs.ContainerID = "hog", id2
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, cs)
		return p
	}
	f.observe(two(testPod(1, small)))
	f.at(time.Second)
	seen := f.clock
	f.observe(two(resized(2, f.clock)))
	f.at(100 * time.Millisecond)
	f.files("80000 100000", cgroupWeight(200), 96<<20) // app first
	appAt := f.at(500 * time.Millisecond)
	f.at(time.Second)
	cgrouptest.SetFile(t, f.root, cg2, "cpu.max", "80000 100000")
	cgrouptest.SetFile(t, f.root, cg2, "cpu.weight", itoa(cgroupWeight(200)))
	cgrouptest.SetFile(t, f.root, cg2, "memory.max", itoa(96<<20))
	hogAt := f.at(600 * time.Millisecond)
	p := two(testPod(2, big))
	p.Status.ObservedGeneration = 2
	f.at(time.Second)
	f.observe(p)
	f.at(31 * time.Second)
	r := only(t, f.tr)
	if ph := phases(r); ph["cgroup"] != hogAt.Sub(seen).Seconds() {
		t.Errorf("cgroup phase %v s, want %v s (the last container's)", ph["cgroup"], hogAt.Sub(seen).Seconds())
	}
	want := []api.ContainerCgroup{{Container: "app", At: appAt, Seconds: appAt.Sub(seen).Seconds()}, {Container: "hog", At: hogAt, Seconds: hogAt.Sub(seen).Seconds()}}
	if len(r.ContainerCgroups) != 2 || r.ContainerCgroups[0] != want[0] || r.ContainerCgroups[1] != want[1] {
		t.Errorf("containerCgroups %+v, want %+v", r.ContainerCgroups, want)
	}
}

func TestSummaryContainerCgroups(t *testing.T) {
	r := &api.KubeResize{Generation: 2, Manager: "kubectl-patch", Containers: []string{"app", "hog"}, Outcome: "completed",
		Phases:           []api.KubeResizePhase{{Phase: "accepted", Seconds: 0.17}, {Phase: "admitted", Seconds: 0.96}, {Phase: "cgroup", Seconds: 5.37}, {Phase: "status", Seconds: 5.4}},
		ContainerCgroups: []api.ContainerCgroup{{Container: "app", Seconds: 2.78}, {Container: "hog", Seconds: 5.37}}}
	want := "generation 2 by kubectl-patch (app,hog) completed: seen 0.17s after accepted, admitted +0.96s cgroup +5.37s (app +2.78s, hog +5.37s) status +5.40s"
	if got := summary(r, ""); got != want {
		t.Errorf("summary:\n got %q\nwant %q", got, want)
	}
}

// fakeWrites is the eBPF hook's times of the limit writes, per cgroup.
type fakeWrites map[string]time.Time

func (w fakeWrites) LastLimitWrite(p string) (time.Time, bool) {
	at, ok := w[p]
	return at, ok
}

// On the one-vCPU node the agent's reads ran 2.4 s after the container's
// own reads saw the new values: with the eBPF hook the cgroup phase is the
// kernel's time of the write, not of the read that found it.
func TestCgroupPhaseIsTheWrite(t *testing.T) {
	f := newFixture(t)
	writes := fakeWrites{}
	f.tr.opts.Writes = writes
	f.observe(testPod(1, small))
	f.at(time.Second)
	seen := f.clock
	f.observe(resized(2, f.clock))
	f.at(100 * time.Millisecond)
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	wrote := f.clock.Add(300 * time.Millisecond)
	writes[ctrCgroup] = wrote
	f.at(2400 * time.Millisecond) // the read, late
	p := testPod(2, big)
	p.Status.ObservedGeneration = 2
	f.at(time.Second)
	f.observe(p)
	f.at(31 * time.Second)
	r := only(t, f.tr)
	if ph := phases(r); ph["cgroup"] != wrote.Sub(seen).Seconds() || ph["admitted"] > ph["cgroup"] || r.AdmittedBy != "cgroup" {
		t.Errorf("phases %v, admitted by %s: want cgroup %.1fs, the write's time, and admitted by it", ph, r.AdmittedBy, wrote.Sub(seen).Seconds())
	}
	if len(r.ContainerCgroups) != 1 || !r.ContainerCgroups[0].At.Equal(wrote) {
		t.Errorf("containerCgroups %+v, want app at %v", r.ContainerCgroups, wrote)
	}
	// A write before the agent saw the change (the kubelet quicker than
	// the watch) is put when it saw it; one after the read at the read;
	// none known at the read.
	rs := &resize{seen: seen}
	read := seen.Add(time.Second)
	for _, c := range []struct{ written, want time.Time }{
		{seen.Add(-time.Second), seen}, {seen.Add(3 * time.Second), read}, {time.Time{}, read}, {seen.Add(time.Millisecond), seen.Add(time.Millisecond)},
	} {
		if at := heldSince(rs, c.written, read); !at.Equal(c.want) {
			t.Errorf("heldSince(written %v): %v, want %v", c.written, at, c.want)
		}
	}
}

// The kubelet's restart for a resize can remove the container's cgroup
// before the tracker's first look: the window before then ends at the
// container's newest sample (CI's walkthrough had none at all).
func TestBeforeWindowWhenTheCgroupIsGone(t *testing.T) {
	f, sampled := sampledThenResized(t)
	if err := os.RemoveAll(filepath.Join(f.root, ctrCgroup)); err != nil {
		t.Fatal(err)
	}
	f.q.gone[ctrCgroup] = true
	f.at(100 * time.Millisecond)
	r := f.tr.pods[uid].open
	if r == nil || !r.tookBefore || r.before["app"] == nil {
		t.Fatalf("window before of a container whose cgroup is gone: %+v", r)
	}
	b := r.before["app"]
	if end := b.Start.Add(time.Duration(b.Seconds * float64(time.Second))); !end.Equal(sampled) {
		t.Errorf("window before ends at %v, want the newest sample %v", end, sampled)
	}
	if b.RunqCount != 100 {
		t.Errorf("window before: %d run-queue waits, want the 100 sampled", b.RunqCount)
	}
}

// sampledThenResized is a container started 20 s ago, sampled twice (the
// second time with run-queue waits and pressure), then resized: the
// resize is seen at the next tick. sampled is the second sample's time.
func sampledThenResized(t *testing.T) (f *fixture, sampled time.Time) {
	t.Helper()
	f = newFixture(t)
	started := f.clock.Add(-20 * time.Second)
	p := testPod(1, small)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	f.at(100 * time.Millisecond) // located and sampled
	f.q.counts[ctrCgroup] = []uint64{10, 60, 100}
	cgrouptest.FakePressure(t, f.root, ctrCgroup, 1_500_000, 80, 0)
	f.at(5 * time.Second) // sampled again, with the waits
	sampled = f.clock
	p = resized(2, f.clock)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	return f, sampled
}

// A read that comes back without cpu.stat and CPU PSI (containerd's
// cgroups library reads missing files as none: a cgroup removed during the
// read, as CI's walkthrough saw) does not end the window before, which
// would then say "no throttling, no PSI": the newest whole sample does.
func TestBeforeWindowSkipsAPartialRead(t *testing.T) {
	f, sampled := sampledThenResized(t)
	for _, name := range []string{"cpu.stat", "cpu.pressure"} {
		if err := os.Remove(filepath.Join(f.root, ctrCgroup, name)); err != nil {
			t.Fatal(err)
		}
	}
	f.at(100 * time.Millisecond)
	r := f.tr.pods[uid].open
	if r == nil || !r.tookBefore || r.before["app"] == nil {
		t.Fatalf("window before: %+v", r)
	}
	b := r.before["app"]
	if end := b.Start.Add(time.Duration(b.Seconds * float64(time.Second))); !end.Equal(sampled) {
		t.Errorf("window before ends at %v, want the newest whole sample %v", end, sampled)
	}
	if b.CPUPressure == nil || b.ThrottledSeconds <= 0 {
		t.Errorf("window before: CPU PSI %v, throttled %vs: the partial read ended it", b.CPUPressure, b.ThrottledSeconds)
	}
}

// A container whose cgroup is not found at the first look is looked for
// again at every tick, and gets its window before once found, as long as
// its files do not hold the new values yet.
func TestBeforeWindowWaitsForTheCgroup(t *testing.T) {
	f := newFixture(t)
	if err := os.RemoveAll(filepath.Join(f.root, ctrCgroup)); err != nil {
		t.Fatal(err)
	}
	started := f.clock.Add(-10 * time.Second)
	p := testPod(1, small)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	f.at(100 * time.Millisecond) // not found: relocate holds the next look back by 10 s
	p = resized(2, f.clock)
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.Time{Time: started}
	f.observe(p)
	f.at(100 * time.Millisecond)
	if r := f.tr.pods[uid].open; r == nil || r.tookBefore {
		t.Fatalf("resize %+v: want its window before still waiting", r)
	}
	cgrouptest.AddFake(t, f.root, ctrCgroup)
	f.files("50000 100000", 16, 64<<20)
	cgrouptest.FakePressure(t, f.root, ctrCgroup, 1_500_000, 80, 0)
	f.q.counts[ctrCgroup] = []uint64{10, 60, 100}
	f.at(100 * time.Millisecond)
	r := f.tr.pods[uid].open
	if r == nil || !r.tookBefore || r.before["app"] == nil {
		t.Fatalf("window before once the cgroup is found: %+v", r)
	}
	if s := r.before["app"].Seconds; s < 9.5 || s > 11 {
		t.Errorf("window before %.2fs, want from the container's start (10.3s)", s)
	}
}

// A static pod's mirror pod has an API UID of its own; its cgroups carry
// the kubelet's (the config.mirror annotation), where its containers are
// found.
func TestMirrorPodLocated(t *testing.T) {
	f := newFixture(t)
	p := testPod(1, small)
	p.UID = "a8f2c1d0-0000-4000-8000-000000000001"
	p.Annotations = map[string]string{"kubernetes.io/config.mirror": uid}
	f.observe(p)
	f.at(5 * time.Second)
	if ts := f.tr.Targets(); len(ts) != 1 || ts[0].Cgroup != ctrCgroup || ts[0].PodUID != string(p.UID) {
		t.Errorf("Targets() %+v, want the static pod's container at %s, labelled with the mirror pod's UID", ts, ctrCgroup)
	}
}

// sidecar is p with its container a sidecar: a restartable init
// container, its status among the init containers'.
func sidecar(p *corev1.Pod) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p.Spec.InitContainers, p.Spec.Containers = p.Spec.Containers, nil
	p.Spec.InitContainers[0].RestartPolicy = &always
	p.Status.InitContainerStatuses, p.Status.ContainerStatuses = p.Status.ContainerStatuses, nil
	return p
}

// A sidecar's resize is timed to its cgroup too (the node's first sidecar
// resize had no cgroup phase: only the containers' statuses were looked
// at).
func TestSidecarResizeTimed(t *testing.T) {
	f := newFixture(t)
	f.observe(sidecar(testPod(1, small)))
	f.at(5 * time.Second)
	if ts := f.tr.Targets(); len(ts) != 1 || ts[0].Cgroup != ctrCgroup {
		t.Fatalf("Targets() %+v, want the sidecar at %s", ts, ctrCgroup)
	}
	seen := f.at(time.Second)
	f.observe(sidecar(resized(2, seen.Truncate(time.Second))))
	f.at(100 * time.Millisecond)
	f.files("80000 100000", cgroupWeight(200), 96<<20)
	f.at(100 * time.Millisecond)
	p := sidecar(testPod(2, big))
	p.Status.ObservedGeneration = 2
	f.clock = f.clock.Add(time.Second)
	f.observe(p)
	r := only(t, f.tr)
	if _, ok := phases(r)["cgroup"]; !ok || len(r.Containers) != 1 || r.Containers[0] != "app" {
		t.Fatalf("a sidecar's resize: containers %v, phases %+v, want the cgroup phase", r.Containers, r.Phases)
	}
}
