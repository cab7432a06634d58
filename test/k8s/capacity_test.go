package k8s_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/resizer/resize-agent/agent/kube/capacity"
	"github.com/resizer/resize-agent/agent/kube/fit"
)

const capNS = "capacity"

type verdictCounts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *verdictCounts) Observe(p, a string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[p+"/"+a]++
}

func (c *verdictCounts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.m)
}

// TestCapacityView feeds the capacity view from a real kube-apiserver
// with the agent's own token (deploy's RBAC: list and watch pods, get its
// Node): the example (allocatable 3700m, other pods 3350m, a
// container raised from 500m to 3000m) is Deferred with the numbers; the
// API server itself refuses a resize above allocatable, as predicted
// (PodResizeValidator); the observer counts a verdict the kubelet writes
// in the status. No kubelet runs here: the test writes the status as the
// kubelet would (allocatedResources, conditions with observedGeneration).
func TestCapacityView(t *testing.T) {
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	cp := StartControlPlane(t)
	admin := cp.Admin()
	ctx := context.Background()
	for _, obj := range loadManifests(t, filepath.Join(repoRoot(t), "deploy", "base"), "namespace.yaml", "serviceaccount.yaml", "rbac.yaml") {
		createObject(t, admin, obj)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: capNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(capNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node-a", "node-b"} {
		node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Capacity = rl("cpu", "4", "memory", "8Gi", "pods", "110")
		node.Status.Allocatable = rl("cpu", "3700m", "memory", "7Gi", "pods", "110")
		node.Status.NodeInfo.KubeletVersion = "v1.37.2"
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	target := capPod(t, admin, "node-a", "target", "500m")
	capPod(t, admin, "node-a", "other", "2850m")
	capPod(t, admin, "node-b", "elsewhere", "3") // another node's: not counted

	v, err := capacity.New(cp.Agent(), "node-a", capacity.Options{NodeEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	counts := &verdictCounts{m: map[string]int{}}
	var outcomes []capacity.Outcome
	var omu sync.Mutex
	if _, err := capacity.NewObserver(v, counts, func(o capacity.Outcome) { omu.Lock(); outcomes = append(outcomes, o); omu.Unlock() },
		func(p types.NamespacedName, err error) { t.Errorf("%s not predicted: %v", p, err) }); err != nil {
		t.Fatal(err)
	}
	vctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { v.Run(vctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if !v.WaitSynced(wctx) {
		t.Fatal("the view did not sync with the agent's token")
	}
	if n := len(v.Pods()); n != 2 {
		t.Fatalf("%d pods in the view of node-a, want 2", n)
	}

	cur, err := admin.CoreV1().Pods(capNS).Get(ctx, target.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	desired := cur.DeepCopy()
	desired.Spec.Containers[0].Resources = req("3", "3")
	p, err := v.Predict(desired)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := capacity.Summary(p), "Deferred: cpu needed 3000m, free 850m of 3700m allocatable"; got != want || p.Verdict != fit.Deferred {
		t.Fatalf("the issue's example: %q, want %q", got, want)
	}

	// Above allocatable: predicted Refused, and the API server refuses.
	desired.Spec.Containers[0].Resources = req("3800m", "3800m")
	if p, _ := v.Predict(desired); p.Verdict != fit.Refused {
		t.Errorf("3800m on 3700m allocatable: %s, want Refused", capacity.Summary(p))
	}
	_, err = admin.CoreV1().Pods(capNS).Patch(ctx, target.Name, types.StrategicMergePatchType,
		[]byte(`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"3800m"},"limits":{"cpu":"3800m"}}}]}}`),
		metav1.PatchOptions{}, "resize")
	if err == nil || !strings.Contains(err.Error(), "allocatable") {
		t.Errorf("pods/resize above allocatable: %v, want the API server's refusal (PodResizeValidator)", err)
	}

	// Through pods/resize to 3 CPUs: the observer predicts at the spec
	// change, and counts when the kubelet's condition comes.
	resized, err := admin.CoreV1().Pods(capNS).Patch(ctx, target.Name, types.StrategicMergePatchType,
		[]byte(`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"3"},"limits":{"cpu":"3"}}}]}}`),
		metav1.PatchOptions{}, "resize")
	if err != nil {
		t.Fatal(err)
	}
	updatePodStatus(t, admin, capNS, resized.Name, func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonDeferred,
			ObservedGeneration: resized.Generation, LastTransitionTime: metav1.Now(),
			Message: "Node didn't have enough resource: cpu, requested: 3000, used: 2850, capacity: 3700",
		})
	})
	eventually(t, 30*time.Second, "the observer to count the Deferred verdict", func() string {
		omu.Lock()
		defer omu.Unlock()
		if len(outcomes) != 1 || !outcomes[0].Agrees() || outcomes[0].Actual != fit.Deferred {
			return fmt.Sprintf("outcomes %+v, counts %s", outcomes, counts)
		}
		return ""
	})

	// The other pod leaves: the view frees its 2850m.
	if err := admin.CoreV1().Pods(capNS).Delete(ctx, "other", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the view to free the other pod's allocation", func() string {
		cur, err := admin.CoreV1().Pods(capNS).Get(ctx, target.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p, err := v.Predict(cur); err != nil || p.Verdict != fit.Fit {
			return fmt.Sprintf("%s, %v", capacity.Summary(p), err)
		}
		return ""
	})
}

func req(cpu, limit string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: rl("cpu", cpu, "memory", "64Mi"), Limits: rl("cpu", limit, "memory", "128Mi")}
}

// capPod creates a running pod on node with container app's cpu request
// and status as the kubelet reports an admitted pod.
func capPod(t *testing.T, c kubernetes.Interface, node, name, cpu string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := c.CoreV1().Pods(capNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: capNS},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "app", Image: "busybox", Resources: req(cpu, "4")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.ObservedGeneration = p.Generation
	res := req(cpu, "4")
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Image: "busybox", ImageID: "busybox", ContainerID: "containerd://" + name,
		Ready: true, Started: new(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		AllocatedResources: res.Requests, Resources: &res}}
	p, err = c.CoreV1().Pods(capNS).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
