package capacity_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/resizer/resize-agent/agent/kube/capacity"
	"github.com/resizer/resize-agent/agent/kube/fit"
)

const nodeName = "node-a"

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func node(cpu string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Status: corev1.NodeStatus{
			Allocatable: rl("cpu", cpu, "memory", "8Gi", "pods", "110"),
			NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
		},
	}
}

// pod is a running one-container Burstable pod whose kubelet allocated
// cpu (request) and limit.
func pod(name, cpu, limit string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Generation: 1},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{
			Name: "app", Resources: corev1.ResourceRequirements{Requests: rl("cpu", cpu), Limits: rl("cpu", limit)},
		}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable, ObservedGeneration: 1,
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				AllocatedResources: rl("cpu", cpu),
				Resources:          &corev1.ResourceRequirements{Requests: rl("cpu", cpu), Limits: rl("cpu", limit)},
			}},
		},
	}
}

// resize is p with container app's spec asking for cpu and limit, one
// generation on.
func resize(p *corev1.Pod, cpu, limit string) *corev1.Pod {
	q := p.DeepCopy()
	q.Generation++
	q.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: rl("cpu", cpu), Limits: rl("cpu", limit)}
	return q
}

func startView(t *testing.T, objs ...any) (*capacity.View, *fake.Clientset) {
	t.Helper()
	var rts []any
	rts = append(rts, objs...)
	cs := fake.NewClientset()
	for _, o := range rts {
		var err error
		switch o := o.(type) {
		case *corev1.Node:
			_, err = cs.CoreV1().Nodes().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = cs.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	v, err := capacity.New(cs, nodeName, capacity.Options{NodeEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return v, cs
}

func run(t *testing.T, v *capacity.View) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if !v.WaitSynced(wctx) {
		t.Fatal("view not synced")
	}
}

// The issue's example: allocatable 3700m, other pods 3350m, a container
// raised from 500m to 3000m is Deferred with the numbers; within what is
// free it fits; above allocatable the API server (1.37) refuses it.
func TestPredictIssueExample(t *testing.T) {
	target := pod("web", "500m", "1")
	other := pod("other", "2850m", "3")
	other.Spec.NodeName = nodeName
	elsewhere := pod("elsewhere", "3", "3")
	elsewhere.Spec.NodeName = "node-b" // not counted: another node's
	v, _ := startView(t, node("3700m"), target, other, elsewhere)
	if _, err := v.Predict(resize(target, "3", "3")); !errors.Is(err, capacity.ErrNotSynced) {
		t.Fatalf("before sync: %v, want ErrNotSynced", err)
	}
	run(t, v)
	for _, tc := range []struct {
		cpu     string
		want    fit.Verdict
		summary string
	}{
		{"3", fit.Deferred, "Deferred: cpu needed 3000m, free 850m of 3700m allocatable"},
		{"850m", fit.Fit, "Fit"},
		{"851m", fit.Deferred, "Deferred: cpu needed 851m, free 850m of 3700m allocatable"},
		{"3701m", fit.Refused, "Refused: cpu needed 3701m, 3700m allocatable"},
	} {
		p, err := v.Predict(resize(target, tc.cpu, tc.cpu))
		if err != nil {
			t.Fatal(err)
		}
		if p.Verdict != tc.want || capacity.Summary(p) != tc.summary {
			t.Errorf("raise to %s: %s (%q), want %s (%q)", tc.cpu, p.Verdict, capacity.Summary(p), tc.want, tc.summary)
		}
	}
	if _, err := v.Predict(elsewhere); !errors.Is(err, capacity.ErrNotOnNode) {
		t.Errorf("a pod of another node: %v, want ErrNotOnNode", err)
	}
}

// The view follows the API: a pod that leaves frees its allocation, and a
// new Node allocatable counts at the next read.
func TestViewFollowsPodsAndNode(t *testing.T) {
	target := pod("web", "500m", "1")
	other := pod("other", "3", "3")
	v, cs := startView(t, node("3700m"), target, other)
	run(t, v)
	want := resize(target, "1", "1")
	eventually(t, func() string {
		p, _ := v.Predict(want)
		if p.Verdict != fit.Deferred {
			return "before: " + capacity.Summary(p)
		}
		return ""
	})
	if err := cs.CoreV1().Pods("default").Delete(context.Background(), "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if p, _ := v.Predict(want); p.Verdict != fit.Fit {
			return "after the other pod left: " + capacity.Summary(p)
		}
		return ""
	})
	if _, err := cs.CoreV1().Nodes().Update(context.Background(), node("900m"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if p, _ := v.Predict(want); p.Verdict != fit.Refused {
			return "after allocatable fell to 900m: " + capacity.Summary(p)
		}
		return ""
	})
}

func TestKubeletMinor(t *testing.T) {
	for in, want := range map[string]int{"v1.37.2": 37, "v1.33.0-eks-1": 33, "1.36.1": 36, "v1.34+": 34} {
		if got, err := capacity.KubeletMinor(in); err != nil || got != want {
			t.Errorf("%s: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "v2.1.0", "v1", "vx.y"} {
		if _, err := capacity.KubeletMinor(in); !errors.Is(err, fit.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", in, err)
		}
	}
	// A kubelet the predictions are not written for gives an error, not
	// a guess.
	n := node("4")
	n.Status.NodeInfo.KubeletVersion = "v1.32.0"
	target := pod("web", "500m", "1")
	v, _ := startView(t, n, target)
	run(t, v)
	if _, err := v.Predict(resize(target, "1", "1")); !errors.Is(err, fit.ErrInvalid) {
		t.Errorf("kubelet 1.32: %v, want ErrInvalid", err)
	}
}

type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counts) Observe(p, a string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[p+"/"+a]++
}

func (c *counts) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

func cond(typ corev1.PodConditionType, reason string, gen int64) corev1.PodCondition {
	return corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, Reason: reason, ObservedGeneration: gen}
}

// The observer predicts at the spec change and counts once the kubelet
// decides: Deferred, Infeasible, InProgress, or a resize done without a
// condition seen; an older generation's condition is not this resize's.
func TestObserver(t *testing.T) {
	target := pod("web", "500m", "1")
	other := pod("other", "2850m", "3")
	v, _ := startView(t, node("3700m"), target, other)
	c := &counts{m: map[string]int{}}
	var outcomes []capacity.Outcome
	o, err := capacity.NewObserver(v, c, func(x capacity.Outcome) { outcomes = append(outcomes, x) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, v)

	// Deferred, predicted Deferred; a stale condition of generation 1
	// first does not count.
	want := resize(target, "3", "3")
	o.Update(target, want)
	if o.Pending() != 1 {
		t.Fatalf("pending %d after the spec change", o.Pending())
	}
	stale := want.DeepCopy()
	stale.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonDeferred, 1)}
	o.Update(want, stale)
	if o.Pending() != 1 || c.get("Deferred/Deferred") != 0 {
		t.Fatalf("counted a condition of generation 1 for generation 2: %v", c.m)
	}
	deferred := want.DeepCopy()
	deferred.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonDeferred, 2)}
	o.Update(stale, deferred)
	if c.get("Deferred/Deferred") != 1 || o.Pending() != 0 {
		t.Fatalf("counts %v, pending %d", c.m, o.Pending())
	}
	// Counted once.
	o.Update(deferred, deferred)
	if c.get("Deferred/Deferred") != 1 {
		t.Fatalf("counted twice: %v", c.m)
	}

	// Within what is free, accepted: InProgress.
	fits := resize(deferred, "800m", "800m")
	o.Update(deferred, fits)
	inProgress := fits.DeepCopy()
	inProgress.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizeInProgress, "", 3)}
	o.Update(fits, inProgress)
	if c.get("Fit/Fit") != 1 {
		t.Fatalf("InProgress not counted as Fit: %v", c.m)
	}

	// Done between two status updates: no condition, the status holds the
	// spec at the generation.
	down := resize(inProgress, "600m", "600m")
	down.Status.Conditions = nil
	o.Update(inProgress, down)
	done := down.DeepCopy()
	done.Status.ObservedGeneration = down.Generation
	done.Status.ContainerStatuses[0].AllocatedResources = rl("cpu", "600m")
	done.Status.ContainerStatuses[0].Resources = &corev1.ResourceRequirements{Requests: rl("cpu", "600m"), Limits: rl("cpu", "600m")}
	o.Update(down, done)
	if c.get("Fit/Fit") != 2 {
		t.Fatalf("a resize done without a condition not counted: %v", c.m)
	}

	// A kubelet that says Infeasible where the agent predicted Fit (a
	// static CPU manager policy the agent was not told of): a mismatch.
	again := resize(done, "700m", "700m")
	o.Update(done, again)
	inf := again.DeepCopy()
	inf.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonInfeasible, again.Generation)}
	o.Update(again, inf)
	if c.get("Fit/Infeasible") != 1 {
		t.Fatalf("mismatch not counted: %v", c.m)
	}
	if len(outcomes) != 4 || !outcomes[0].Agrees() || outcomes[3].Agrees() {
		t.Fatalf("outcomes %+v", outcomes)
	}

	// A spec change that is not a resize predicts nothing.
	other2 := inf.DeepCopy()
	other2.Generation++
	other2.Spec.ActiveDeadlineSeconds = new(int64)
	o.Update(inf, other2)
	if o.Pending() != 0 {
		t.Fatal("a change of activeDeadlineSeconds was taken for a resize")
	}
}

func eventually(t *testing.T, f func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		if last = f(); last == "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal(strings.TrimSpace(last))
}
