package latency

import (
	"path"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// plPod is a pod with pod-level resources spec (its container has none of
// its own) whose status reports actuated: allocatedResources, and
// status.resources as the kubelet reads it back from the pod cgroup.
func plPod(gen int64, spec, actuated corev1.ResourceRequirements, observed int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: uid, Generation: gen},
		Spec:       corev1.PodSpec{NodeName: node, Resources: spec.DeepCopy(), Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{
			QOSClass: corev1.PodQOSBurstable, ObservedGeneration: observed,
			AllocatedResources: actuated.Requests.DeepCopy(),
			Resources:          &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: actuated.Requests[corev1.ResourceCPU]}, Limits: actuated.Limits.DeepCopy()},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "app", ContainerID: ctrID, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				Resources: &corev1.ResourceRequirements{},
			}},
		},
	}
}

// A resize of the pod-level resources alone (spec.resources, 1.36+) is a
// resize: its cgroup phase is the pod cgroup holding what the kubelet
// writes for the new spec (200m -> 400m limit: cpu.max 40000, its linear
// cpu.weight 8 for 200m), its status phase status.resources reporting it.
func TestPodLevelResize(t *testing.T) {
	f := newFixture(t)
	podCg := path.Dir(ctrCgroup)
	cgrouptest.AddFake(t, f.root, podCg)
	podFiles := func(cpuMax, weight, mem string) {
		cgrouptest.SetFile(t, f.root, podCg, "cpu.max", cpuMax)
		cgrouptest.SetFile(t, f.root, podCg, "cpu.weight", weight)
		cgrouptest.SetFile(t, f.root, podCg, "memory.max", mem)
	}
	podFiles("20000 100000", "4", "209715200")
	old, cur := res("100m", "200m", "100Mi", "200Mi"), res("200m", "400m", "100Mi", "200Mi")
	f.observe(plPod(1, old, old, 1))
	f.at(time.Second)
	f.observe(plPod(2, cur, old, 1))
	f.at(200 * time.Millisecond)
	r := only(t, f.tr)
	if !r.PodLevel || len(r.Containers) != 0 || r.Outcome != "open" {
		t.Fatalf("pod-level resize: %+v", r)
	}
	if o := f.tr.pods[uid].open; o == nil || !o.cgroupAt.IsZero() || !strings.HasPrefix(o.mismatch, "pod cgroup: cpu.max 20000 100000") {
		t.Fatalf("cgroup phase before the pod cgroup held the new values: %+v", o)
	}
	podFiles("40000 100000", "8", "209715200")
	f.at(300 * time.Millisecond)
	f.clock = f.clock.Add(time.Second)
	f.observe(plPod(2, cur, cur, 2))
	r = only(t, f.tr)
	ph := phases(r)
	if ph["cgroup"] < 0.49 || ph["cgroup"] > 0.51 || ph["status"] < 1.49 || ph["status"] > 1.51 || r.AdmittedBy != "cgroup" {
		t.Fatalf("phases %v admitted by %s", ph, r.AdmittedBy)
	}
	for range 7 {
		f.at(5 * time.Second)
	}
	e := <-f.rec.Events
	if !strings.HasPrefix(e, "Normal ResizeMeasured generation 2 (pod-level resources) completed:") {
		t.Fatalf("event %q", e)
	}
}

// status.resources comes back from the pod cgroup's shares and quota: 1m
// reads as 2m and is the same request.
func TestPodReported(t *testing.T) {
	q := resource.MustParse
	want := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("1m"), corev1.ResourceMemory: q("64Mi")},
		Limits: corev1.ResourceList{corev1.ResourceCPU: q("1500m"), corev1.ResourceMemory: q("128Mi")}}
	st := &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("2m")},
		Limits: corev1.ResourceList{corev1.ResourceCPU: q("1500m"), corev1.ResourceMemory: q("128Mi")}}
	if !podReported(st, want) {
		t.Error("2m read back for 1m not taken as reported")
	}
	st.Limits[corev1.ResourceCPU] = q("1")
	if podReported(st, want) || podReported(nil, want) {
		t.Error("an old limit, or no status, taken as reported")
	}
}
