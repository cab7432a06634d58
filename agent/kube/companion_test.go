package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/resizer/resize-agent/agent/kube/allocdrift"
	"github.com/resizer/resize-agent/agent/kube/fit"
	"github.com/resizer/resize-agent/agent/kube/kubeletconfig"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup/spec"
	"github.com/resizer/resize-agent/cri"
)

// companionNode is a runtime and cgroupfs holding one container whose
// cpu.max someone changed.
type companionNode struct{}

func (companionNode) Get(context.Context, string) (cri.Container, error) {
	return cri.Container{State: "CONTAINER_RUNNING", PID: 7}, nil
}
func (companionNode) Update(context.Context, string, cri.Resources) error { return nil }
func (companionNode) PathOf(int) (string, error)                          { return "/kubepods/c", nil }
func (companionNode) PageSize() int64                                     { return 4096 }
func (companionNode) Read(string) (spec.State, error) {
	return spec.State{CPUMax: spec.CPUMax{Quota: 1000, Period: 100000}, CPUWeight: 39, MemoryMax: spec.Unlimited}, nil
}

// The companion wiring: the verdict observer counts into the metric, the
// drift check reports through Count, both fed by one view.
func TestCompanion(t *testing.T) {
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("1")}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Generation: 1},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "app", Resources: res}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ObservedGeneration: 1, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", ContainerID: "containerd://c", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			AllocatedResources: res.Requests, Resources: &res,
		}}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("1Gi"), corev1.ResourcePods: q("10")},
		NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
	}}
	client := fake.NewClientset(node, pod)
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	drifts := map[string]int{}
	c := CapacityConfig{NodeName: "n", Logger: quiet, Predictor: &LivePredictor{}, Predictions: metrics.NewVerdictPredictions(reg), Drift: DriftConfig{
		Policy: allocdrift.PolicyReport, Interval: 20 * time.Millisecond, Runtime: companionNode{}, Cgroups: companionNode{},
		Count: func(r, a string) { mu.Lock(); drifts[r+"/"+a]++; mu.Unlock() },
	}}
	view, stop, err := startCompanion(context.Background(), c, client)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !view.WaitSynced(ctx) {
		t.Fatal("view not synced")
	}
	// The intake's Predictor answers from the view.
	if p := c.Predictor.Predict(pod); p == nil || p.Verdict != "Fit" {
		t.Fatalf("LivePredictor: %+v", p)
	}
	if p := (&LivePredictor{}).Predict(pod); p != nil {
		t.Fatalf("a LivePredictor without a view predicted %+v", p)
	}
	// The drift first: the container's cpu.max is not the kubelet's
	// "max 100000" (after the 3 s confirmation).
	waitFor(ctx, t, "the drift report", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return drifts["cpu/report"] == 1
	})
	// Then a resize to 1.5 CPUs, alone on a 2-CPU node: predicted Fit,
	// and the kubelet's InProgress says Fit.
	up := pod.DeepCopy()
	up.Generation = 2
	up.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = q("1500m")
	if _, err := client.CoreV1().Pods("ns").Update(ctx, up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the view to see the resize", func() bool {
		for _, p := range view.Pods() {
			if p.Generation == 2 {
				return true
			}
		}
		return false
	})
	up.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue, ObservedGeneration: 2}}
	if _, err := client.CoreV1().Pods("ns").UpdateStatus(ctx, up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "a Fit/Fit prediction counted", func() bool {
		n, err := testutil.GatherAndCount(reg, "resize_agent_kubelet_verdict_predictions_total")
		if err != nil || n == 0 {
			return false
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["predicted"] == "Fit" && l["actual"] == "Fit" && m.GetCounter().GetValue() == 1 {
					return true
				}
			}
		}
		return false
	})
}

func waitFor(ctx context.Context, t *testing.T, what string, f func() bool) {
	t.Helper()
	for !f() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The kubelet's configuration file reaches the prediction (its CPU manager
// policy) and the drift check (its CPU quota and MemoryQoS factor, for the
// release the Node reports).
func TestCompanionTakesTheKubeletsConfiguration(t *testing.T) {
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("64Mi")},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "g", Namespace: "ns", UID: "u", Generation: 1},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "app", Resources: res}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSGuaranteed, ObservedGeneration: 1,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://c",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, AllocatedResources: res.Requests, Resources: &res}}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: q("4"), corev1.ResourceMemory: q("1Gi"), corev1.ResourcePods: q("10")},
		NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
	}}
	up := pod.DeepCopy()
	up.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = q("2")
	up.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = q("2")
	off, factor := false, 0.8
	for _, c := range []struct {
		file kubeletconfig.File
		want fit.Verdict
	}{
		{kubeletconfig.File{}, fit.Fit},
		{kubeletconfig.File{CPUManagerPolicy: "static", CPUCFSQuota: &off, MemoryThrottlingFactor: &factor}, fit.Infeasible},
	} {
		cfg := CapacityConfig{NodeName: "n", Logger: quiet, Predictor: &LivePredictor{}, Kubelet: c.file}
		view, stop, err := startCompanion(context.Background(), cfg, fake.NewClientset(node, pod))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if !view.WaitSynced(ctx) {
			t.Fatal("view not synced")
		}
		waitFor(ctx, t, "the Node read", func() bool { _, _, err := view.Node(); return err == nil })
		if p := cfg.Predictor.Predict(up); p == nil || p.Verdict != c.want {
			t.Errorf("cpuManagerPolicy %q: a CPU resize of a Guaranteed pod predicted %+v, want %s", c.file.CPUManagerPolicy, p, c.want)
		}
		k, ok := driftKubelet(view, c.file)
		want := allocdrift.Kubelet{PodLevelResources: true, PodMemoryHigh: true, AllocatableMemory: 1 << 30}
		if c.file.CPUCFSQuota != nil {
			want.NoCPUQuota, want.MemoryHighFactor = true, 0.8
		}
		if !ok || k != want {
			t.Errorf("drift check's kubelet %+v %v, want %+v", k, ok, want)
		}
		cancel()
		stop()
	}
}
