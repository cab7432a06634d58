package allocdrift_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/agent/kube/allocdrift"
	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
	"github.com/resizer/resize-agent/cri"
)

const (
	podPath = "/kubepods/burstable/podu1"
	ctrPath = podPath + "/c1"
)

// podNode is a node whose container c1 sits in the kubelet's pod cgroup of
// pod u1; with write, it is also a Writer.
type podNode struct {
	mu     sync.Mutex
	files  map[string]spec.State
	writes []spec.Resources
}

func (f *podNode) Get(_ context.Context, id string) (cri.Container, error) {
	return cri.Container{ID: id, State: "CONTAINER_RUNNING", PID: 100}, nil
}
func (f *podNode) Update(context.Context, string, cri.Resources) error { return nil }
func (f *podNode) PathOf(int) (string, error)                          { return ctrPath, nil }
func (f *podNode) PageSize() int64                                     { return 4096 }
func (f *podNode) Read(p string) (spec.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[p], nil
}

func (f *podNode) set(p string, st spec.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[p] = st
}

type writingNode struct{ *podNode }

func (f writingNode) Write(p string, r spec.Resources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, r)
	st := f.files[p]
	if r.CPUMax != nil {
		st.CPUMax = *r.CPUMax
	}
	if r.CPUWeight != nil {
		st.CPUWeight = *r.CPUWeight
	}
	if r.MemoryMax != nil {
		st.MemoryMax = *r.MemoryMax
	}
	f.files[p] = st
	return nil
}

func stateOf(r spec.Resources) spec.State {
	return spec.State{CPUMax: *r.CPUMax, CPUWeight: *r.CPUWeight, MemoryMax: *r.MemoryMax}
}

// podLevel is a Running pod with pod-level resources podRes (allocated:
// status.allocatedResources holds the requests) and one container without
// any, at generation gen, seen by the kubelet.
func podLevel(podRes corev1.ResourceRequirements, gen int64) *corev1.Pod {
	none := corev1.ResourceRequirements{}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plr", Namespace: "default", UID: "u1", Generation: gen},
		Spec: corev1.PodSpec{NodeName: "n", Resources: podRes.DeepCopy(),
			Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable, ObservedGeneration: gen,
			AllocatedResources: podRes.Requests.DeepCopy(),
			// Read back from the pod cgroup by the kubelet: no reference.
			Resources: &corev1.ResourceRequirements{Limits: rl("cpu", "7")},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://c1",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, Resources: &none}}},
	}
}

var (
	plOld = req(rl("cpu", "100m", "memory", "100Mi"), rl("cpu", "200m", "memory", "200Mi"))
	plNew = req(rl("cpu", "200m", "memory", "100Mi"), rl("cpu", "400m", "memory", "200Mi"))
)

// The pod cgroup the kubelet writes, for the pods of its own tests
// (TestResourceConfigForPod, pkg/kubelet/cm/helpers_linux_test.go:
// burstable-with-pod-level-resources, guaranteed-with-pod-level-resources,
// burstable-partial-limits), taken through the status.
func TestPodExpected(t *testing.T) {
	p := podLevel(plOld, 1)
	if got := PodFiles(allocdrift.PodExpected(p, 100000)); got != "20000 100000/4/209715200" {
		t.Errorf("burstable-with-pod-level-resources: %s", got)
	}
	p = podLevel(req(rl("cpu", "100m", "memory", "100Mi"), rl("cpu", "100m", "memory", "100Mi")), 1)
	p.Status.QOSClass = corev1.PodQOSGuaranteed
	if got := PodFiles(allocdrift.PodExpected(p, 100000)); got != "10000 100000/4/104857600" {
		t.Errorf("guaranteed-with-pod-level-resources: %s", got)
	}
	// Containers only: the status's actuated values, not the spec's.
	q := pod(req(rl("cpu", "100m", "memory", "100Mi"), rl("cpu", "200m", "memory", "200Mi")), req(rl("cpu", "100m", "memory", "100Mi"), rl("cpu", "200m", "memory", "200Mi")))
	q.Spec.Containers = append(q.Spec.Containers, corev1.Container{Name: "side", Resources: req(rl("cpu", "100m", "memory", "100Mi"), nil)})
	if got := PodFiles(allocdrift.PodExpected(q, 100000)); got != "max 100000/8/max" {
		t.Errorf("burstable-partial-limits: %s", got)
	}
	q.Spec.Containers[0].Resources = req(rl("cpu", "900m"), rl("cpu", "2"))
	if got := PodFiles(allocdrift.PodExpected(q, 100000)); got != "max 100000/8/max" {
		t.Errorf("the spec, not the status, was used: %s", got)
	}
}

func PodFiles(r spec.Resources) string {
	return r.CPUMax.String() + "/" + spec.FormatMax(int64(*r.CPUWeight)) + "/" + spec.FormatMax(*r.MemoryMax)
}

type podHarness struct {
	c    *allocdrift.Checker
	node *podNode
	ev   *events
	now  time.Time
	pod  *corev1.Pod
}

func newPodHarness(t *testing.T, policy allocdrift.Policy, writer bool) *podHarness {
	h := &podHarness{node: &podNode{files: map[string]spec.State{}}, ev: &events{}, now: time.Unix(1e9, 0)}
	h.pod = podLevel(plOld, 1)
	h.settle()
	var cg allocdrift.Cgroups = h.node
	if writer {
		cg = writingNode{h.node}
	}
	c, err := allocdrift.New(func() []*corev1.Pod { return []*corev1.Pod{h.pod} }, h.node, cg, allocdrift.Options{
		Policy: policy, Confirm: 3 * time.Second, Recorder: h.ev, Now: func() time.Time { return h.now },
	})
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h
}

// settle puts in the files what the kubelet writes for h.pod: the pod
// cgroup, and the container's, which has the pod-level limits.
func (h *podHarness) settle() {
	h.node.set(ctrPath, stateOf(allocdrift.Expected(podcgroup.ContainerResources(h.pod, corev1.ResourceRequirements{}), 100000)))
	h.node.set(podPath, stateOf(allocdrift.PodExpected(h.pod, 100000)))
}

func (h *podHarness) check(after time.Duration) allocdrift.Result {
	h.now = h.now.Add(after)
	return h.c.Check(context.Background())
}

// A stray write to the pod cgroup's cpu.max is reported once, after the
// confirmation delay, with the agent's Event; nothing is written.
func TestPodCgroupDriftReported(t *testing.T) {
	h := newPodHarness(t, "", true)
	if r := h.check(0); r.Checked != 1 || r.Pods != 1 || r.Drifted != 0 {
		t.Fatalf("clean: %+v", r)
	}
	st := stateOf(allocdrift.PodExpected(h.pod, 100000))
	st.CPUMax = spec.CPUMax{Quota: 5000, Period: 100000}
	h.node.set(podPath, st)
	if r := h.check(time.Second); r.Drifted != 1 || len(r.Findings) != 0 || !r.Recheck {
		t.Fatalf("first sight: %+v", r)
	}
	r := h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionReport || r.Findings[0].Container != "" || r.Findings[0].Cgroup != podPath {
		t.Fatalf("confirmed: %+v", r)
	}
	want := "Warning CgroupDrift: pod cgroup: values differ from what the kubelet writes for the pod's allocation (ResourceConfigForPod): cpu.max 5000 100000 (the kubelet's 20000 100000)"
	if got := strings.Join(h.ev.got, "\n"); got != want {
		t.Fatalf("event %q", got)
	}
	if r := h.check(10 * time.Second); len(r.Findings) != 0 {
		t.Fatalf("acted twice: %+v", r)
	}
	if len(h.node.writes) != 0 {
		t.Fatalf("report wrote %v", h.node.writes)
	}
}

// A pod-level resize by the kubelet is not drift: before the kubelet has
// seen the new generation, and while it says PodResizeInProgress, the pod
// cgroup is not checked; once allocated, the new values are the reference,
// whatever status.resources (read back from the cgroup) says.
func TestPodLevelResizeIsNotDrift(t *testing.T) {
	h := newPodHarness(t, allocdrift.PolicyRestore, true)
	h.check(0)
	// The spec moves; the kubelet has not seen it yet.
	h.pod = podLevel(plOld, 1)
	h.pod.Generation = 2
	h.pod.Spec.Resources = plNew.DeepCopy()
	for range 3 {
		if r := h.check(5 * time.Second); r.Pods != 0 || r.Drifted != 0 {
			t.Fatalf("before the kubelet saw it: %+v", r)
		}
	}
	// Admitted and being actuated: the files hold the new values.
	h.pod = podLevel(plNew, 2)
	h.pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue}}
	h.settle()
	if r := h.check(5 * time.Second); r.Checked != 0 || r.Pods != 0 {
		t.Fatalf("in progress: %+v", r)
	}
	// Done.
	h.pod = podLevel(plNew, 2)
	for range 3 {
		if r := h.check(5 * time.Second); r.Pods != 1 || r.Drifted != 0 {
			t.Fatalf("after the kubelet's resize: %+v", r)
		}
	}
	if got := h.node.files[podPath].CPUMax.String(); got != "40000 100000" {
		t.Fatalf("pod cpu.max %s", got)
	}
	// Deferred: the allocated pod-level values are not in the API; the
	// pod is left alone.
	h.pod = podLevel(plNew, 3)
	h.pod.Spec.Resources.Requests = rl("cpu", "64", "memory", "100Mi")
	h.pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: "Deferred"}}
	if r := h.check(5 * time.Second); r.Checked+r.Pods != 0 {
		t.Fatalf("deferred pod-level change checked: %+v", r)
	}
	// Overhead is in status.allocatedResources (the whole pod's request):
	// settled all the same.
	h.pod = podLevel(plNew, 3)
	h.pod.Spec.Overhead = rl("cpu", "50m", "memory", "10Mi")
	h.pod.Status.AllocatedResources = rl("cpu", "250m", "memory", "110Mi")
	h.settle()
	if r := h.check(5 * time.Second); r.Pods != 1 || r.Drifted != 0 {
		t.Fatalf("pod with overhead: %+v", r)
	}
	h.pod.Status.AllocatedResources = plOld.Requests
	if r := h.check(5 * time.Second); r.Pods != 0 {
		t.Fatalf("allocation behind the spec, checked: %+v", r)
	}
	if len(h.ev.got)+len(h.node.writes) != 0 {
		t.Fatalf("events %v, writes %v", h.ev.got, h.node.writes)
	}
}

// Under restore the differing files of the pod cgroup are written back
// through the cgroup writer; a memory.max below the pod's usage is
// reported, not written; without a writer the drift is reported.
func TestPodCgroupRestore(t *testing.T) {
	h := newPodHarness(t, allocdrift.PolicyRestore, true)
	want := stateOf(allocdrift.PodExpected(h.pod, 100000))
	bad := want
	bad.CPUMax = spec.CPUMax{Quota: spec.Unlimited, Period: 100000}
	h.node.set(podPath, bad)
	h.check(time.Second)
	r := h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionRestore {
		t.Fatalf("restore: %+v", r)
	}
	if len(h.node.writes) != 1 || h.node.writes[0].CPUMax == nil || h.node.writes[0].CPUWeight != nil || h.node.writes[0].MemoryMax != nil {
		t.Fatalf("writes %+v, want cpu.max alone", h.node.writes)
	}
	if got := h.node.files[podPath]; got != want {
		t.Fatalf("pod cgroup %+v, want %+v", got, want)
	}
	if r := h.check(time.Second); r.Drifted != 0 {
		t.Fatalf("after the restore: %+v", r)
	}
	// memory.max raised by someone, and the pod now uses more than the
	// kubelet's limit: writing it back would reclaim or OOM-kill.
	bad = want
	bad.MemoryMax = 1 << 30
	bad.MemoryCurrent = 300 << 20
	h.node.set(podPath, bad)
	h.check(time.Second)
	r = h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionReport || !strings.Contains(r.Findings[0].Message, "reported, not restored") {
		t.Fatalf("memory above the limit: %+v", r)
	}
	if len(h.node.writes) != 1 {
		t.Fatalf("wrote memory.max below usage: %+v", h.node.writes)
	}

	h = newPodHarness(t, allocdrift.PolicyRestore, false)
	h.node.set(podPath, spec.State{CPUMax: spec.CPUMax{Quota: 1000, Period: 100000}, CPUWeight: want.CPUWeight, MemoryMax: want.MemoryMax})
	h.check(time.Second)
	r = h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Action != allocdrift.ActionReport || !strings.Contains(r.Findings[0].Message, "no cgroup writer") {
		t.Fatalf("without a writer: %+v", r)
	}
}

// In a pod with pod-level limits, a container without its own gets the
// pod's (getCPULimit, getMemoryLimit in the kubelet's
// kuberuntime_container_linux.go), its shares from that limit; while the
// kubelet has not seen a pod-level resize, the containers are not checked
// either.
func TestContainerUnderPodLevelLimits(t *testing.T) {
	h := newPodHarness(t, "", true)
	want := allocdrift.Expected(req(nil, rl("cpu", "200m", "memory", "200Mi")), 100000)
	if got := PodFiles(want); got != "20000 100000/"+spec.FormatMax(int64(spec.SharesToWeight(204)))+"/209715200" {
		t.Fatalf("expected %s", got)
	}
	h.node.set(ctrPath, stateOf(want))
	if r := h.check(0); r.Checked != 1 || r.Drifted != 0 {
		t.Fatalf("container holding the pod-level limits: %+v", r)
	}
	h.node.set(ctrPath, state(corev1.ResourceRequirements{}))
	h.check(time.Second)
	if r := h.check(3 * time.Second); len(r.Findings) != 1 || r.Findings[0].Container != "app" {
		t.Fatalf("container without the pod-level limits: %+v", r)
	}
	// After a kubelet resize, the same container has the minimum shares
	// (the kubelet sends an explicit 0 request): the kubelet's too.
	resized := stateOf(want)
	resized.CPUWeight = 1
	h.node.set(ctrPath, resized)
	h.check(time.Second)
	if r := h.check(5 * time.Second); r.Drifted != 0 {
		t.Fatalf("the kubelet's cpu.weight after a resize taken for drift: %+v", r)
	}
	resized.CPUWeight = 7
	h.node.set(ctrPath, resized)
	h.check(time.Second)
	if r := h.check(5 * time.Second); len(r.Findings) != 1 {
		t.Fatalf("a third cpu.weight not reported: %+v", r)
	}
	h.node.set(ctrPath, stateOf(want))
	h.pod.Generation = 2
	h.pod.Spec.Resources = plNew.DeepCopy()
	if r := h.check(5 * time.Second); r.Checked != 0 || r.Pods != 0 {
		t.Fatalf("pod-level resize not yet seen by the kubelet: %+v", r)
	}
}

// A static pod's cgroups carry the kubelet's UID for it, which its mirror
// pod in the API has in an annotation, not as its UID: its pod cgroup is
// checked too.
func TestMirrorPodCgroupChecked(t *testing.T) {
	h := newPodHarness(t, "", false)
	h.pod.UID = "a8f2c1d0-0000-4000-8000-000000000001" // the API server's
	h.pod.Annotations = map[string]string{podcgroup.MirrorAnnotation: "u1"}
	if r := h.check(0); r.Checked != 1 || r.Pods != 1 || r.Drifted != 0 {
		t.Fatalf("clean: %+v, want the container and its pod cgroup checked", r)
	}
	st := stateOf(allocdrift.PodExpected(h.pod, 100000))
	st.CPUMax = spec.CPUMax{Quota: 5000, Period: 100000}
	h.node.set(podPath, st)
	h.check(time.Second)
	if r := h.check(3 * time.Second); len(r.Findings) != 1 || r.Findings[0].Cgroup != podPath {
		t.Fatalf("a stray write to the static pod's cgroup: %+v", r)
	}
}
