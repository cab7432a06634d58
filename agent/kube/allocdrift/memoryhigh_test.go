package allocdrift_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/kube/allocdrift"
	"github.com/resizer/resize-agent/cgroup/spec"
	"github.com/resizer/resize-agent/cri"
)

const mi = 1 << 20

// The kubelet's own cases (TestGenerateContainerConfigWithMemoryQoSEnforced,
// pkg/kubelet/kuberuntime/kuberuntime_container_linux_test.go, v1.37.2:
// factor 0.9, 4 KiB pages).
func TestContainerMemoryHigh(t *testing.T) {
	k := allocdrift.Kubelet{MemoryHighFactor: 0.9, PodLevelResources: true, AllocatableMemory: 8 << 30}
	plain := pod(corev1.ResourceRequirements{}, corev1.ResourceRequirements{})
	withPodLimit := podLevel(req(rl("memory", "128Mi"), rl("memory", "256Mi")), 1)
	cases := []struct {
		name      string
		p         *corev1.Pod
		res       corev1.ResourceRequirements
		k         allocdrift.Kubelet
		want, alt int64
		ok        bool
	}{
		// floor((128Mi + 0.9 × 128Mi) / 4 KiB) × 4 KiB
		{"burstable 128Mi/256Mi", plain, req(rl("memory", "128Mi"), rl("memory", "256Mi")), k, 62259 * 4096, 0, true},
		// No limit: the node's allocatable memory stands for it.
		{"no limit", plain, req(rl("memory", "128Mi"), nil), k, 1890713 * 4096, 0, true},
		{"guaranteed", plain, req(rl("memory", "256Mi"), rl("memory", "256Mi")), k, spec.Unlimited, 0, true},
		// kubernetes#137685: a BestEffort container gets memory.high from
		// the allocatable memory too.
		{"best effort", plain, corev1.ResourceRequirements{}, k, 1887436 * 4096, 0, true},
		// None at creation; after a resize, from the pod's 256Mi (seen on
		// the real node, TestPodLevelDrift).
		{"no limit, pod-level limit", withPodLimit, req(rl("memory", "64Mi"), nil), k, spec.Unlimited, 60620 * 4096, true},
		{"no request nor limit, pod-level limit", withPodLimit, corev1.ResourceRequirements{}, k, spec.Unlimited, 58982 * 4096, true},
		{"own limit in a pod with a pod-level one", withPodLimit, req(rl("memory", "64Mi"), rl("memory", "128Mi")), k, 31129 * 4096, 0, true},
		{"no factor", plain, req(rl("memory", "128Mi"), rl("memory", "256Mi")), allocdrift.Kubelet{}, 0, 0, false},
	}
	for _, c := range cases {
		got, alt, ok := allocdrift.ContainerMemoryHigh(c.p, c.res, 256*mi, c.k, 4096)
		if got != c.want || alt != c.alt || ok != c.ok {
			t.Errorf("%s: %d %d %v, want %d %d %v", c.name, got, alt, ok, c.want, c.alt, c.ok)
		}
	}
}

// The kubelet's pod cases (TestApplyPodLevelMemoryHigh,
// pkg/kubelet/cm/helpers_linux_test.go, v1.37.2).
func TestPodMemoryHigh(t *testing.T) {
	k := allocdrift.Kubelet{MemoryHighFactor: 0.9, PodLevelResources: true, PodMemoryHigh: true}
	p := podLevel(req(rl("cpu", "1", "memory", "128Mi"), rl("cpu", "1", "memory", "256Mi")), 1)
	if got, ok := allocdrift.PodMemoryHigh(p, k, 4096); got != 62259*4096 || !ok {
		t.Errorf("pod-level 128Mi/256Mi: %d %v", got, ok)
	}
	// Overhead counts in both the request and the limit.
	p.Spec.Overhead = rl("memory", "64Mi")
	if got, _ := allocdrift.PodMemoryHigh(p, k, 4096); got != 78643*4096 {
		t.Errorf("with 64Mi overhead: %d", got)
	}
	// cpu only at the pod level, and one container without a memory
	// limit: none.
	p = podLevel(corev1.ResourceRequirements{Limits: rl("cpu", "2")}, 1)
	p.Spec.Containers = []corev1.Container{
		{Name: "a", Resources: req(rl("cpu", "100m", "memory", "100Mi"), rl("cpu", "200m", "memory", "200Mi"))},
		{Name: "b", Resources: req(rl("cpu", "100m", "memory", "100Mi"), nil)},
	}
	if got, ok := allocdrift.PodMemoryHigh(p, k, 4096); got != spec.Unlimited || !ok {
		t.Errorf("mixed limits: %d %v", got, ok)
	}
	// Pods without pod-level resources, kubelets before 1.37 or without a
	// factor: not compared.
	for name, c := range map[string]struct {
		p *corev1.Pod
		k allocdrift.Kubelet
	}{
		"containers only": {pod(req(rl("memory", "1Mi"), rl("memory", "2Mi")), req(rl("memory", "1Mi"), rl("memory", "2Mi"))), k},
		"1.36":            {podLevel(plOld, 1), allocdrift.Kubelet{MemoryHighFactor: 0.9, PodLevelResources: true}},
		"no factor":       {podLevel(plOld, 1), allocdrift.Kubelet{PodLevelResources: true, PodMemoryHigh: true}},
	} {
		if _, ok := allocdrift.PodMemoryHigh(c.p, c.k, 4096); ok {
			t.Errorf("%s: compared", name)
		}
	}
}

// highNode is a writingNode with memory.high files, and a runtime that
// records its updates.
type highNode struct {
	writingNode
	hmu     sync.Mutex
	high    map[string]int64
	updates []cri.Resources
}

func (f *highNode) ReadMemoryHigh(p string) (int64, error) {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	return f.high[p], nil
}

func (f *highNode) SetMemoryHigh(p string, v int64) error {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	f.high[p] = v
	return nil
}

func (f *highNode) Update(_ context.Context, _ string, r cri.Resources) error {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	f.updates = append(f.updates, r)
	if r.MemoryHigh == cri.MemoryHighMax {
		f.high[ctrPath] = spec.Unlimited
	} else if r.MemoryHigh > 0 {
		f.high[ctrPath] = r.MemoryHigh
	}
	return nil
}

// podHigh: the pod-level pod of podLevel with a memory request below its
// limit (100Mi, 200Mi), factor 0.8: the pod cgroup's memory.high is
// floor((100Mi + 0.8 × 100Mi) / 4 KiB) × 4 KiB = 180Mi; its container has
// no limit of its own, so it keeps "max".
func newHighHarness(t *testing.T, policy allocdrift.Policy) (*podHarness, *highNode) {
	t.Helper()
	h := &podHarness{node: &podNode{files: map[string]spec.State{}}, ev: &events{}, now: time.Unix(1e9, 0)}
	h.pod = podLevel(plOld, 1)
	h.settle()
	n := &highNode{writingNode: writingNode{h.node}, high: map[string]int64{podPath: 180 * mi, ctrPath: spec.Unlimited}}
	k := allocdrift.Kubelet{MemoryHighFactor: 0.8, PodLevelResources: true, PodMemoryHigh: true, AllocatableMemory: 2 << 30}
	c, err := allocdrift.New(func() []*corev1.Pod { return []*corev1.Pod{h.pod} }, n, n, allocdrift.Options{
		Policy: policy, Confirm: 3 * time.Second, Recorder: h.ev, Now: func() time.Time { return h.now },
		Kubelet: func() (allocdrift.Kubelet, bool) { return k, true },
	})
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h, n
}

// A stray write to the pod cgroup's memory.high is drift, reported with
// the kubelet's value and written back under restore; the container's
// memory.high is compared too and restored through the runtime.
func TestMemoryHighDrift(t *testing.T) {
	h, n := newHighHarness(t, allocdrift.PolicyRestore)
	if r := h.check(0); r.Checked != 1 || r.Pods != 1 || r.Drifted != 0 {
		t.Fatalf("clean: %+v", r)
	}
	n.SetMemoryHigh(podPath, 50*mi)
	h.check(time.Second)
	r := h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Container != "" || r.Findings[0].Action != allocdrift.ActionRestore {
		t.Fatalf("pod memory.high: %+v", r)
	}
	if got := strings.Join(h.ev.got, "\n"); !strings.Contains(got, "memory.high 52428800 (the kubelet's 188743680)") {
		t.Fatalf("event %q", got)
	}
	if n.high[podPath] != 180*mi || len(n.writes) != 0 {
		t.Fatalf("restore: memory.high %d, other writes %v", n.high[podPath], n.writes)
	}
	if r := h.check(10 * time.Second); r.Drifted != 0 {
		t.Fatalf("after the restore: %+v", r)
	}
	// The container: "max" is the kubelet's, and so is 0.8 × the pod's
	// 200Mi, what it writes once it has resized the pod.
	n.SetMemoryHigh(ctrPath, 160*mi)
	for range 2 {
		if r := h.check(5 * time.Second); r.Drifted != 0 {
			t.Fatalf("the kubelet's memory.high after a resize: %+v", r)
		}
	}
	n.SetMemoryHigh(ctrPath, 64*mi)
	h.check(time.Second)
	r = h.check(3 * time.Second)
	if len(r.Findings) != 1 || r.Findings[0].Container != "app" || len(n.updates) != 1 || n.updates[0].MemoryHigh != cri.MemoryHighMax {
		t.Fatalf("container memory.high: %+v, updates %+v", r, n.updates)
	}
	if n.high[ctrPath] != spec.Unlimited {
		t.Fatalf("container memory.high %d after the restore", n.high[ctrPath])
	}
}

// The kubelet writes the pod cgroup's memory.high only with its memory
// limit: a change of the request alone keeps the value of the request
// before, and is not drift; a new limit brings the value of the request
// at that time.
func TestPodMemoryHighFollowsTheLimit(t *testing.T) {
	h, n := newHighHarness(t, allocdrift.PolicyReport)
	h.check(0)
	// Request 100Mi -> 150Mi: the kubelet leaves memory.high at 180Mi.
	h.pod = podLevel(req(rl("cpu", "100m", "memory", "150Mi"), rl("cpu", "200m", "memory", "200Mi")), 2)
	h.settle()
	for range 3 {
		if r := h.check(5 * time.Second); r.Drifted != 0 {
			t.Fatalf("request alone: %+v", r)
		}
	}
	// Limit 200Mi -> 300Mi: floor((150Mi + 0.8 × 150Mi) / 4 KiB) × 4 KiB.
	h.pod = podLevel(req(rl("cpu", "100m", "memory", "150Mi"), rl("cpu", "200m", "memory", "300Mi")), 3)
	h.settle()
	n.SetMemoryHigh(podPath, 270*mi)
	for range 3 {
		if r := h.check(5 * time.Second); r.Drifted != 0 {
			t.Fatalf("new limit: %+v", r)
		}
	}
	// The value of the request before is drift now.
	n.SetMemoryHigh(podPath, 180*mi)
	h.check(time.Second)
	if r := h.check(3 * time.Second); len(r.Findings) != 1 {
		t.Fatalf("old value after a new limit: %+v", r)
	}
}

// An agent that starts after a change of the request alone finds a value
// of some request under the limit: the kubelet's. A value no request
// gives is drift.
func TestPodMemoryHighFirstSight(t *testing.T) {
	h, n := newHighHarness(t, allocdrift.PolicyReport)
	n.SetMemoryHigh(podPath, 170*mi) // 50Mi requested when the limit was set
	for range 3 {
		if r := h.check(5 * time.Second); r.Drifted != 0 {
			t.Fatalf("a value of an earlier request: %+v", r)
		}
	}
	h2, n2 := newHighHarness(t, allocdrift.PolicyReport)
	n2.SetMemoryHigh(podPath, 100*mi) // below 0.8 × 200Mi: no request gives it
	h2.check(0)
	if r := h2.check(3 * time.Second); len(r.Findings) != 1 {
		t.Fatalf("a value no request gives: %+v", r)
	}
}
