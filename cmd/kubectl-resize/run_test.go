package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"
)

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// fakeCluster is a fake clientset whose pods/resize patch bumps the
// generation as the API server does, and whose pod reads run kubelet, a
// stand-in for the node's kubelet, on the pod first.
type fakeCluster struct {
	*fake.Clientset
	mu      sync.Mutex
	patches []string
	kubelet func(p *corev1.Pod, reads int) // reads since the patch
	reads   int
	patched bool
	refuse  error
}

func newFakeCluster(t *testing.T, p *corev1.Pod, objs ...runtime.Object) *fakeCluster {
	f := &fakeCluster{Clientset: fake.NewClientset(append([]runtime.Object{p}, objs...)...)}
	tr := f.Tracker()
	f.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		if pa.GetSubresource() != "resize" {
			t.Errorf("patched %q, not pods/resize", pa.GetSubresource())
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.patches = append(f.patches, string(pa.GetPatch()))
		if f.refuse != nil {
			return true, nil, f.refuse
		}
		obj, err := tr.Get(podsGVR, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*corev1.Pod)
		orig, _ := json.Marshal(cur)
		merged, err := strategicpatch.StrategicMergePatch(orig, pa.GetPatch(), corev1.Pod{})
		if err != nil {
			return true, nil, err
		}
		var np corev1.Pod
		if err := json.Unmarshal(merged, &np); err != nil {
			return true, nil, err
		}
		if np.UID != cur.UID {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, np.Name, fmt.Errorf("uid changed"))
		}
		np.Generation++
		f.patched = true
		return true, &np, tr.Update(podsGVR, &np, np.Namespace)
	})
	f.PrependReactor("get", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		obj, err := tr.Get(podsGVR, a.GetNamespace(), a.(k8stesting.GetAction).GetName())
		if err != nil || !f.patched || f.kubelet == nil {
			return true, obj, err
		}
		p := obj.(*corev1.Pod).DeepCopy()
		f.reads++
		f.kubelet(p, f.reads)
		return true, p, tr.Update(podsGVR, p, p.Namespace)
	})
	return f
}

func webPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", UID: "uid-web", Generation: 1},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app",
			Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "64Mi")}}}},
		Status: corev1.PodStatus{ObservedGeneration: 1, ContainerStatuses: []corev1.ContainerStatus{{Name: "app",
			Resources: &corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "64Mi")}}}},
	}
}

// actuate is the kubelet's resize as 1.37 reports it: in progress for a
// read, then the status shows the spec.
func actuate(p *corev1.Pod, reads int) {
	p.Status.ObservedGeneration = p.Generation
	if reads == 1 {
		p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizeInProgress, "", "", p.Generation)}
		return
	}
	p.Status.Conditions = nil
	r := p.Spec.Containers[0].Resources
	p.Status.ContainerStatuses[0].Resources = &r
}

func agentEventOn(p *corev1.Pod, name, reason, msg string, at time.Time) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: p.Namespace, UID: types.UID("ev-" + name), ResourceVersion: "1"},
		InvolvedObject:      corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Reason:              reason,
		Message:             msg,
		Type:                corev1.EventTypeNormal,
		ReportingController: agentController,
		ReportingInstance:   "node-1",
		EventTime:           metav1.NewMicroTime(at),
	}
}

func (f *fakeCluster) client(*genericclioptions.ConfigFlags, io.Writer) (kubernetes.Interface, string, error) {
	return f, "team", nil
}

func runFake(t *testing.T, f *fakeCluster, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	// Fast polls, for the test's sake.
	code := runWith(context.Background(), args, &out, &errb, f.client, 5*time.Millisecond)
	return code, out.String(), errb.String()
}

func TestRunCompletedWithTheAgentsMeasurement(t *testing.T) {
	p := webPod()
	// An Event the agent posted before: not about this resize.
	old := agentEventOn(p, "old", "ResizeMeasured", "an older resize", time.Now().Add(-time.Hour))
	f := newFakeCluster(t, p, old)
	f.kubelet = func(p *corev1.Pod, reads int) {
		actuate(p, reads)
		if reads == 2 {
			// The agent reports when the kubelet is done.
			ev := agentEventOn(p, "new", "ResizeMeasured", "latency admit=1ms actuate=40ms verify=3ms; psi some avg10 2.0 -> 0.1", time.Now())
			if err := f.Tracker().Add(ev); err != nil {
				t.Error(err)
			}
		}
	}
	code, out, errs := runFake(t, f, "web", "--cpu-limit", "800m", "--memory-limit", "96Mi", "--agent-wait", "2s")
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	for _, want := range []string{
		"pod team/web container app on node node-1: Completed (generation 2",
		"spec:   requests cpu=100m memory=32Mi, limits cpu=800m memory=96Mi",
		"status: requests cpu=100m memory=32Mi, limits cpu=800m memory=96Mi (restarts 0)",
		"agent:  ResizeMeasured", "on node-1: latency admit=1ms actuate=40ms verify=3ms; psi some avg10 2.0 -> 0.1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "an older resize") {
		t.Errorf("printed the agent's Event of an older resize:\n%s", out)
	}
	if want := `{"metadata":{"uid":"uid-web"},"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"800m","memory":"96Mi"}}}]}}`; len(f.patches) != 1 || f.patches[0] != want {
		t.Errorf("patches %q, want [%s]", f.patches, want)
	}
}

func TestRunAgentNotSeen(t *testing.T) {
	f := newFakeCluster(t, webPod())
	f.kubelet = actuate
	code, out, _ := runFake(t, f, "web", "--cpu-request", "200m", "--agent-wait", "50ms", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var r result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Verdict != Completed || r.Agent == nil || r.Agent.Seen || !strings.Contains(r.Agent.Note, "not seen within 50ms: no resize-agent on node node-1, or it has not reported yet") {
		t.Errorf("result %+v agent %+v", r, r.Agent)
	}
	if r.Status == nil || r.Status.Requests.Cpu().String() != "200m" || r.ExitCode != 0 || r.Generation != 2 {
		t.Errorf("result %+v", r)
	}
}

func TestRunVerdicts(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "web", fmt.Errorf(`User "dev" cannot patch resource "pods/resize"`))
	for _, tc := range []struct {
		name    string
		kubelet func(*corev1.Pod, int)
		refuse  error
		code    int
		verdict string
		out     string
	}{
		{name: "infeasible", code: 3, verdict: Infeasible, out: "kubelet: Infeasible: Resize is infeasible",
			kubelet: func(p *corev1.Pod, _ int) {
				p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonInfeasible, "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"", p.Generation)}
			}},
		{name: "deferred", code: 0, verdict: Deferred, out: "kubelet: Deferred: Node didn't have enough resource: cpu",
			kubelet: func(p *corev1.Pod, _ int) {
				p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonDeferred, "Node didn't have enough resource: cpu, requested: 4000, used: 600, capacity: 1000", p.Generation)}
			}},
		{name: "error", code: 3, verdict: Error, out: "kubelet: Error: failed to update",
			kubelet: func(p *corev1.Pod, _ int) {
				p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizeInProgress, corev1.PodReasonError, "failed to update container resources", p.Generation)}
			}},
		{name: "timeout", code: 1, verdict: Timeout, out: "no verdict from the kubelet within 200ms: the kubelet is actuating it",
			kubelet: func(p *corev1.Pod, _ int) {
				p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodResizeInProgress, "", "", p.Generation)}
			}},
		{name: "refused", refuse: forbidden, code: 1, verdict: Refused, out: `API server: Forbidden: pods "web" is forbidden: User "dev" cannot patch resource "pods/resize"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster(t, webPod())
			f.kubelet, f.refuse = tc.kubelet, tc.refuse
			code, out, errs := runFake(t, f, "web", "--cpu-limit", "4", "--timeout", "200ms", "--agent-wait", "0")
			if code != tc.code || !strings.Contains(out, ": "+tc.verdict) || !strings.Contains(out, tc.out) {
				t.Errorf("exit %d (want %d), output:\n%s\nwant %s and %q; stderr %s", code, tc.code, out, tc.verdict, tc.out, errs)
			}
			if tc.refuse != nil && !strings.Contains(errs, "refused the resize (Forbidden)") {
				t.Errorf("stderr %q", errs)
			}
			if tc.refuse != nil && !strings.Contains(out, "spec:   requests cpu=100m memory=32Mi, limits cpu=500m") {
				t.Errorf("a refused resize printed a spec it did not make:\n%s", out)
			}
		})
	}
}

// Bad input is refused before anything is sent.
func TestRunRefusesBadInputAndSendsNothing(t *testing.T) {
	two := webPod()
	two.Spec.Containers = append(two.Spec.Containers, corev1.Container{Name: "log"})
	for _, tc := range []struct {
		pod  *corev1.Pod
		args []string
		code int
		err  string
	}{
		{webPod(), []string{"web", "--cpu-request", "600m"}, 2, "cpu request 600m would be above its limit 500m"},
		{webPod(), []string{"web", "--cpu-limit", "500m"}, 2, "nothing to change"},
		{webPod(), []string{"web", "--cpu-limit", "-1"}, 2, "must not be negative"},
		{two, []string{"web", "--cpu-limit", "1"}, 2, "pick one with -c: app, log"},
		{webPod(), []string{"nope", "--cpu-limit", "1"}, 1, `pods "nope" not found`},
	} {
		f := newFakeCluster(t, tc.pod)
		code, _, errs := runFake(t, f, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.err) {
			t.Errorf("%v: exit %d stderr %q; want %d %q", tc.args, code, errs, tc.code, tc.err)
		}
		if len(f.patches) != 0 {
			t.Errorf("%v: sent %q", tc.args, f.patches)
		}
	}
}

func TestRunNoWaitAndYAML(t *testing.T) {
	f := newFakeCluster(t, webPod())
	code, out, _ := runFake(t, f, "pod/web", "--memory-request", "48Mi", "--wait=false", "-o", "yaml")
	var r result
	if err := yaml.Unmarshal([]byte(out), &r); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	if r.Verdict != Accepted || r.Spec.Requests.Memory().String() != "48Mi" || r.Spec.Limits.Memory().String() != "64Mi" || r.Agent != nil {
		t.Errorf("%+v", r)
	}
}

func TestSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain message": "plain message",
		"a\x1b[31mred":  `a\x1b[31mred`,
		"two\nlines":    `two\nlines`,
		"c1\u009bx":     `c1\u009bx`,
		"bad\xffutf8":   `bad\xffutf8`,
		"ünïcode":       "ünïcode",
	} {
		if got := safe(in); got != want {
			t.Errorf("safe(%q) = %q, want %q", in, got, want)
		}
	}
	if got := escapeC1("{\"m\":\"\u009b\"}"); got != `{"m":"\u009b"}` {
		t.Errorf("escapeC1: %q", got)
	}
}
