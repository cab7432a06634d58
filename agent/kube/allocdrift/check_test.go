package allocdrift_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/kube/allocdrift"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup/spec"
	"github.com/resizer/resize-agent/cri"
)

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func req(r, l corev1.ResourceList) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: r, Limits: l}
}

// The kubelet's and runc's values, from their own conversions: shares from
// the request (from the limit without one), runc's weight (not the
// kubelet's pod-cgroup one: 100m is 17, not 4), a quota of at
// least 1 ms, "max" for no limit.
func TestExpected(t *testing.T) {
	for _, tc := range []struct {
		name               string
		res                corev1.ResourceRequirements
		cpuMax, weight, mm string
		shares             int64
	}{
		{"best effort", req(nil, nil), "max 100000", "1", "max", 2},
		{"burstable", req(rl("cpu", "100m", "memory", "32Mi"), rl("cpu", "500m", "memory", "64Mi")), "50000 100000", "17", "67108864", 102},
		{"1 CPU", req(rl("cpu", "1"), nil), "max 100000", "100", "max", 1024},
		{"limit only", req(nil, rl("cpu", "2")), "200000 100000", fmt.Sprint(spec.SharesToWeight(2048)), "max", 2048},
		// Seen on the real node (runc 1.4.4): 200m -> 29, 300m -> 40.
		{"200m", req(rl("cpu", "200m"), nil), "max 100000", "29", "max", 204},
		{"300m", req(rl("cpu", "300m"), nil), "max 100000", "40", "max", 307},
		{"tiny limit", req(rl("cpu", "1m"), rl("cpu", "1m")), "1000 100000", "1", "max", 2},
	} {
		got := allocdrift.Expected(tc.res, 100000)
		if s := got.CPUMax.String(); s != tc.cpuMax {
			t.Errorf("%s: cpu.max %s, want %s", tc.name, s, tc.cpuMax)
		}
		if s := fmt.Sprint(*got.CPUWeight); s != tc.weight {
			t.Errorf("%s: cpu.weight %s, want %s", tc.name, s, tc.weight)
		}
		if w := spec.SharesToWeight(uint64(tc.shares)); *got.CPUWeight != w {
			t.Errorf("%s: cpu.weight %d, want runc's %d for %d shares", tc.name, *got.CPUWeight, w, tc.shares)
		}
		if s := spec.FormatMax(*got.MemoryMax); s != tc.mm {
			t.Errorf("%s: memory.max %s, want %s", tc.name, s, tc.mm)
		}
		rr := allocdrift.RuntimeResources(tc.res, 100000)
		if rr.CPUShares != tc.shares || rr.CPUPeriod != 100000 || rr.CPUQuota != got.CPUMax.Quota || rr.MemoryLimit != *got.MemoryMax {
			t.Errorf("%s: runtime %+v", tc.name, rr)
		}
	}
}

// fakeNode is a runtime and cgroupfs: containers by ID, their cgroups'
// files by path; Update writes what runc would.
type fakeNode struct {
	mu      sync.Mutex
	files   map[string]spec.State
	updates []cri.Resources
}

func (f *fakeNode) Get(_ context.Context, id string) (cri.Container, error) {
	return cri.Container{ID: id, State: "CONTAINER_RUNNING", PID: 100}, nil
}

func (f *fakeNode) Update(_ context.Context, id string, r cri.Resources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.updates = append(f.updates, r)
	st := f.files["/kubepods/"+id]
	st.CPUMax = spec.CPUMax{Quota: r.CPUQuota, Period: uint64(r.CPUPeriod)}
	st.CPUWeight = spec.SharesToWeight(uint64(r.CPUShares))
	st.MemoryMax = r.MemoryLimit
	f.files["/kubepods/"+id] = st
	return nil
}

func (f *fakeNode) PathOf(int) (string, error) { return "/kubepods/c1", nil }
func (f *fakeNode) PageSize() int64            { return 4096 }
func (f *fakeNode) Read(p string) (spec.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[p], nil
}

func (f *fakeNode) set(st spec.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files["/kubepods/c1"] = st
}

type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) Eventf(_ runtime.Object, typ, reason, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, typ+" "+reason+": "+fmt.Sprintf(format, args...))
}

var (
	oldRes = req(rl("cpu", "100m", "memory", "32Mi"), rl("cpu", "500m", "memory", "64Mi"))
	newRes = req(rl("cpu", "200m", "memory", "32Mi"), rl("cpu", "800m", "memory", "96Mi"))
)

func pod(specRes, statusRes corev1.ResourceRequirements, conds ...corev1.PodConditionType) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1"},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "app", Resources: specRes}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", ContainerID: "containerd://c1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			Resources: &statusRes,
		}}},
	}
	for _, c := range conds {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, Reason: "Deferred"})
	}
	return p
}

func state(r corev1.ResourceRequirements) spec.State {
	w := allocdrift.Expected(r, 100000)
	return spec.State{CPUMax: *w.CPUMax, CPUWeight: *w.CPUWeight, MemoryMax: *w.MemoryMax}
}

type harness struct {
	c      *allocdrift.Checker
	node   *fakeNode
	ev     *events
	now    time.Time
	pod    *corev1.Pod
	counts map[string]int
}

func newHarness(t *testing.T, policy allocdrift.Policy, more ...func(*allocdrift.Options)) *harness {
	h := &harness{node: &fakeNode{files: map[string]spec.State{}}, ev: &events{}, now: time.Unix(1e9, 0), counts: map[string]int{}}
	h.pod = pod(oldRes, oldRes)
	h.node.set(state(oldRes))
	opts := allocdrift.Options{
		Policy: policy, Confirm: 3 * time.Second, Recorder: h.ev,
		Count:   func(r, a string) { h.counts[r+"/"+a]++ },
		Checked: func() { h.counts["checks"]++ },
		Now:     func() time.Time { return h.now },
	}
	for _, f := range more {
		f(&opts)
	}
	c, err := allocdrift.New(func() []*corev1.Pod { return []*corev1.Pod{h.pod} }, h.node, h.node, opts)
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h
}

func (h *harness) check(after time.Duration) allocdrift.Result {
	h.now = h.now.Add(after)
	return h.c.Check(context.Background())
}

// A stray write to cpu.max is reported once, after the confirmation delay,
// with an Event of the agent's own reason; nothing is written.
func TestReport(t *testing.T) {
	h := newHarness(t, "")
	if r := h.check(0); r.Checked != 1 || r.Drifted != 0 {
		t.Fatalf("clean: %+v", r)
	}
	if h.counts["checks"] != 1 {
		t.Errorf("Checked called %d times after one check", h.counts["checks"])
	}
	st := state(oldRes)
	st.CPUMax = spec.CPUMax{Quota: 20000, Period: 100000}
	h.node.set(st)
	if r := h.check(time.Second); r.Drifted != 1 || len(r.Findings) != 0 || !r.Recheck {
		t.Fatalf("first sight: %+v, want drifted, not acted on, recheck", r)
	}
	r := h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionReport {
		t.Fatalf("confirmed: %+v", r)
	}
	if got := strings.Join(h.ev.got, "\n"); got != "Warning CgroupDrift: container app: cgroup values differ from what the kubelet actuated (status.containerStatuses[].resources): cpu.max 20000 100000 (the kubelet's 50000 100000)" {
		t.Fatalf("event %q", got)
	}
	if r := h.check(10 * time.Second); len(r.Findings) != 0 || r.Drifted != 1 {
		t.Fatalf("acted twice: %+v", r)
	}
	if h.counts["cpu/report"] != 1 || len(h.node.updates) != 0 {
		t.Fatalf("counts %v, updates %v", h.counts, h.node.updates)
	}
	// Put back by someone: resolved; a new write is a new drift.
	h.node.set(state(oldRes))
	if r := h.check(time.Second); r.Drifted != 0 {
		t.Fatalf("after the fix: %+v", r)
	}
}

// A kubelet resize is not drift: while the spec differs from the status
// (the kubelet wrote the files and has not reported yet) the pod is left
// alone, and once the status reports it the new values are the reference.
func TestKubeletResizeIsNotDrift(t *testing.T) {
	h := newHarness(t, allocdrift.PolicyRestore)
	h.check(0)
	h.pod = pod(newRes, oldRes)
	h.node.set(state(newRes))
	for range 5 {
		if r := h.check(5 * time.Second); r.Checked != 0 || r.Drifted != 0 {
			t.Fatalf("during the kubelet's resize: %+v", r)
		}
	}
	h.pod = pod(newRes, oldRes, corev1.PodResizeInProgress)
	if r := h.check(5 * time.Second); r.Checked != 0 {
		t.Fatalf("InProgress: %+v", r)
	}
	h.pod = pod(newRes, newRes)
	for range 3 {
		if r := h.check(5 * time.Second); r.Checked != 1 || r.Drifted != 0 {
			t.Fatalf("after the kubelet reported: %+v", r)
		}
	}
	if len(h.ev.got)+len(h.node.updates) != 0 {
		t.Fatalf("events %v, updates %v", h.ev.got, h.node.updates)
	}
	// Deferred: the kubelet actuates nothing, the files must hold the
	// status still, and a stray write there is drift.
	h.pod = pod(req(rl("cpu", "64"), rl("cpu", "64")), newRes, corev1.PodResizePending)
	st := state(newRes)
	st.MemoryMax = 1 << 30
	h.node.set(st)
	h.check(time.Second)
	if r := h.check(3 * time.Second); len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionRestore {
		t.Fatalf("drift of a Deferred pod: %+v", r)
	}
	if got, _ := h.node.Read("/kubepods/c1"); got != state(newRes) {
		t.Fatalf("restored to %+v, want the kubelet's %+v", got, state(newRes))
	}
	if h.counts["memory/restore"] != 1 {
		t.Fatalf("counts %v", h.counts)
	}
}

// Under restore the kubelet's values go back through the runtime; a writer
// that keeps undoing them is reported after three restores, not fought.
func TestRestoreAndBackoff(t *testing.T) {
	h := newHarness(t, allocdrift.PolicyRestore)
	bad := state(oldRes)
	bad.CPUMax = spec.CPUMax{Quota: spec.Unlimited, Period: 100000}
	for i := 1; i <= 3; i++ {
		h.node.set(bad)
		h.check(time.Second)
		r := h.check(3 * time.Second)
		if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionRestore {
			t.Fatalf("restore %d: %+v", i, r)
		}
		if got, _ := h.node.Read("/kubepods/c1"); got != state(oldRes) {
			t.Fatalf("restore %d left %+v", i, got)
		}
		if r := h.check(time.Second); r.Drifted != 0 {
			t.Fatalf("after restore %d: %+v", i, r)
		}
	}
	want := cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 102, MemoryLimit: 64 << 20}
	if h.node.updates[0] != want {
		t.Fatalf("runtime update %+v, want %+v", h.node.updates[0], want)
	}
	h.node.set(bad)
	h.check(time.Second)
	r := h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionBackoff || len(h.node.updates) != 3 {
		t.Fatalf("fourth time: %+v, %d updates", r, len(h.node.updates))
	}
	// After the window, restores resume.
	h.check(3 * time.Minute)
	r = h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionRestore {
		t.Fatalf("after the window: %+v", r)
	}
}

func TestParsePolicy(t *testing.T) {
	for _, s := range []string{"report", "restore", "off"} {
		if _, err := allocdrift.ParsePolicy(s); err != nil {
			t.Error(err)
		}
	}
	for _, s := range []string{"", "adopt", "Restore"} {
		if _, err := allocdrift.ParsePolicy(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// With the kernel's write marks, a clean container is read again when its
// cgroup was written or the kubelet's values for it changed, and at every
// sweep; a write the hook misses waits for the sweep.
func TestFollowsWrites(t *testing.T) {
	w := agenttest.NewWriteMarks("/kubepods/c1")
	h := newHarness(t, "", func(o *allocdrift.Options) { o.Writes, o.Sweep = w, time.Minute })
	if r := h.check(0); r.Checked != 1 || r.Skipped != 0 {
		t.Fatalf("first check: %+v, want a read", r)
	}
	if r := h.check(10 * time.Second); r.Checked != 0 || r.Skipped != 1 {
		t.Fatalf("nothing written: %+v, want skipped", r)
	}
	// A stray write the hook sees: read, confirmed, reported.
	st := state(oldRes)
	st.CPUMax = spec.CPUMax{Quota: 20000, Period: 100000}
	h.node.set(st)
	w.Write("/kubepods/c1")
	if r := h.check(time.Second); r.Checked != 1 || r.Drifted != 1 {
		t.Fatalf("after a write: %+v, want read and drifted", r)
	}
	if r := h.check(3 * time.Second); r.Checked != 1 || len(r.Findings) != 1 {
		t.Fatalf("confirmation: %+v, want read (drifted is never skipped) and reported", r)
	}
	h.node.set(state(oldRes))
	w.Write("/kubepods/c1")
	if r := h.check(time.Second); r.Checked != 1 || r.Drifted != 0 {
		t.Fatalf("put back: %+v", r)
	}
	if r := h.check(10 * time.Second); r.Skipped != 1 {
		t.Fatalf("clean again: %+v, want skipped", r)
	}
	// The kubelet's resize: new expected values, read even before the
	// mark moves (a status the agent sees before the write's mark).
	h.pod = pod(newRes, newRes)
	if r := h.check(time.Second); r.Checked != 1 || r.Drifted != 1 {
		t.Fatalf("new allocation, files not yet written: %+v, want read, differing", r)
	}
	h.node.set(state(newRes))
	w.Write("/kubepods/c1")
	if r := h.check(time.Second); r.Checked != 1 || r.Drifted != 0 {
		t.Fatalf("kubelet wrote: %+v", r)
	}
	// A write the hook misses (cpu.weight.nice): seen at the sweep only.
	st = state(newRes)
	st.CPUWeight = 1
	h.node.set(st)
	if r := h.check(10 * time.Second); r.Skipped != 1 || r.Drifted != 0 {
		t.Fatalf("unseen write before the sweep: %+v, want skipped", r)
	}
	if r := h.check(time.Minute); r.Checked != 1 || r.Drifted != 1 {
		t.Fatalf("sweep: %+v, want read and drifted", r)
	}
}

// countedMarks counts the lookups of a cgroup's mark.
type countedMarks struct {
	*agenttest.WriteMarks
	lookups int
}

func (c *countedMarks) LimitWriteMark(p string) (pressure.WriteMark, bool) {
	c.lookups++
	return c.WriteMarks.LimitWriteMark(p)
}

// Nothing written anywhere since the last check: the clean container is
// skipped without a lookup of its mark; a write anywhere brings the
// lookup back.
func TestQuietNodeLooksNothingUp(t *testing.T) {
	w := &countedMarks{WriteMarks: agenttest.NewWriteMarks("/kubepods/c1")}
	h := newHarness(t, "", func(o *allocdrift.Options) { o.Writes, o.Sweep = w, time.Minute })
	if r := h.check(0); r.Checked != 1 || w.lookups != 1 {
		t.Fatalf("first check: %+v, %d lookups", r, w.lookups)
	}
	w.lookups = 0
	if r := h.check(10 * time.Second); r.Skipped != 1 || w.lookups != 0 {
		t.Fatalf("quiet: %+v, %d lookups, want skipped with none", r, w.lookups)
	}
	w.Write("/elsewhere")
	if r := h.check(10 * time.Second); r.Skipped != 1 || w.lookups != 1 {
		t.Fatalf("a write elsewhere: %+v, %d lookups, want skipped after one", r, w.lookups)
	}
}
