package k8s_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/kube"
)

const ns = "e2e"

func repoRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("RESIZE_AGENT_E2E_DEBUG") == "1" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(&tlog{t}, &slog.HandlerOptions{Level: level}))
}

type tlog struct{ t testing.TB }

func (w *tlog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// env is one agent with its intake, for one node, on the real API server.
type env struct {
	t      *testing.T
	cp     *ControlPlane
	admin  kubernetes.Interface
	node   string
	ra     *agenttest.RuntimeAgent
	client kubernetes.Interface // the agent's; cp.Agent() when nil
	cancel context.CancelFunc
	done   chan struct{}
}

// startIntake runs the intake as the agent's service account: the client
// has only the agent's token, so the test proves deploy's RBAC is enough.
func (e *env) startIntake() {
	c := e.client
	if c == nil {
		c = e.cp.Agent()
	}
	in, err := kube.New(c, e.ra.Agent, kube.Options{NodeName: e.node, Logger: testLogger(e.t),
		RetryBase: 100 * time.Millisecond, RetryMax: 2 * time.Second, Resync: time.Minute, PolicyCheck: time.Second})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan struct{})
	go func() { defer close(e.done); in.Run(ctx) }()
	e.t.Cleanup(e.stopIntake)
}

func (e *env) stopIntake() {
	if e.cancel != nil {
		e.cancel()
		<-e.done
		e.cancel = nil
	}
}

func cgroupOf(uid types.UID, ctr string) string {
	return "/kubepods/burstable/pod" + string(uid) + "/" + ctr
}

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

var burstable = corev1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "64Mi"), Limits: rl("cpu", "1", "memory", "128Mi")}

// pod creates a pod bound to the env's node (there is no scheduler and no
// kubelet: spec.nodeName is set directly) and starts its container "web"
// in the fake runtime, in a fake cgroup.
func (e *env) pod(name string, res corev1.ResourceRequirements, sidecar bool) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      e.node,
			AutomountServiceAccountToken:  new(false),
			TerminationGracePeriodSeconds: new(int64(0)),
			Containers:                    []corev1.Container{{Name: "web", Image: "busybox", Resources: res}},
		},
	}
	if sidecar {
		p.Spec.InitContainers = []corev1.Container{{Name: "proxy", Image: "busybox", RestartPolicy: new(corev1.ContainerRestartPolicyAlways),
			Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "200m", "memory", "64Mi")}}}
	}
	p, err := e.admin.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.ra.AddContainer(e.t, string(p.UID), "web", cgroupOf(p.UID, "web"))
	if sidecar {
		e.ra.AddContainer(e.t, string(p.UID), "proxy", cgroupOf(p.UID, "proxy"))
	}
	return p
}

func (e *env) annotate(p *corev1.Pod, value string) {
	e.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, kube.AnnotationResources, value)
	if _, err := e.admin.CoreV1().Pods(ns).Patch(context.Background(), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// updatePodStatus sets a pod's status as the kubelet would, on the latest
// version: the agent writes its own condition to the same pod, so a write
// from a stale copy can meet a conflict, which the kubelet also retries.
func updatePodStatus(t *testing.T, c kubernetes.Interface, namespace, name string, mutate func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(p)
		out, err = c.CoreV1().Pods(namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func eventually(t *testing.T, timeout time.Duration, what string, fn func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := fn()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %s: %s", timeout, what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) waitFile(p *corev1.Pod, ctr, file, want string) {
	e.t.Helper()
	eventually(e.t, 30*time.Second, fmt.Sprintf("%s %s %s", p.Name, ctr, file), func() string {
		if got := e.ra.File(e.t, cgroupOf(p.UID, ctr), file); got != want {
			return fmt.Sprintf("%q, want %q", got, want)
		}
		return ""
	})
}

// conditions renders the pod's resize conditions as "Type=Reason:Message"
// joined by " | ", as the API server holds them.
func (e *env) conditions(p *corev1.Pod) string {
	got, err := e.admin.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		return "error: " + err.Error()
	}
	var parts []string
	for _, c := range got.Status.Conditions {
		if c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
			parts = append(parts, fmt.Sprintf("%s=%s:%s", c.Type, c.Reason, c.Message))
			if c.Status != corev1.ConditionTrue || c.LastTransitionTime.IsZero() || c.ObservedGeneration != got.Generation {
				parts = append(parts, fmt.Sprintf("(bad condition %+v)", c))
			}
		}
	}
	return strings.Join(parts, " | ")
}

func (e *env) waitConditions(p *corev1.Pod, want string) {
	e.t.Helper()
	eventually(e.t, 30*time.Second, "conditions of "+p.Name, func() string {
		if got := e.conditions(p); got != want {
			return fmt.Sprintf("%q, want %q", got, want)
		}
		return ""
	})
}

// settled checks that nothing writes the pod any more (no patch loop):
// its resourceVersion stays the same for a second.
func (e *env) settled(p *corev1.Pod) {
	e.t.Helper()
	rv := func() string {
		got, err := e.admin.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		return got.ResourceVersion
	}
	before := rv()
	time.Sleep(time.Second)
	if after := rv(); after != before {
		e.t.Errorf("pod %s is still being written: resourceVersion %s -> %s", p.Name, before, after)
	}
}

// waitEvent waits for an Event on the pod with this type and reason whose
// message contains msg, and returns it.
func (e *env) waitEvent(p *corev1.Pod, typ, reason, msg string) corev1.Event {
	e.t.Helper()
	var found corev1.Event
	eventually(e.t, 30*time.Second, fmt.Sprintf("%s event %s on %s", typ, reason, p.Name), func() string {
		l, err := e.admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
		if err != nil {
			return err.Error()
		}
		var seen []string
		for _, ev := range l.Items {
			if ev.Type == typ && ev.Reason == reason && strings.Contains(ev.Message, msg) && ev.InvolvedObject.UID == p.UID {
				found = ev
				return ""
			}
			seen = append(seen, ev.Type+"/"+ev.Reason+": "+ev.Message)
		}
		return fmt.Sprintf("events so far: %q", seen)
	})
	// A refusal of the whole annotation names no container.
	if found.Source.Component != kube.ReportingController || found.Source.Host != e.node || found.InvolvedObject.FieldPath != "" && !strings.HasPrefix(found.InvolvedObject.FieldPath, "spec.") {
		e.t.Errorf("event %+v", found)
	}
	return found
}

// intentOf is the newest intent the intake submitted for the container.
func (e *env) intentOf(p *corev1.Pod, ctr string) intent.Intent {
	var last intent.Intent
	for _, it := range e.ra.List(agentFilter(ctr), "") {
		if strings.HasPrefix(it.ID, kube.IDPrefix) && it.Spec.Target.PodUID == string(p.UID) {
			last = it
		}
	}
	return last
}

func (e *env) waitState(p *corev1.Pod, ctr string, st intent.State) intent.Intent {
	e.t.Helper()
	var it intent.Intent
	eventually(e.t, 30*time.Second, fmt.Sprintf("intent of %s/%s %s", p.Name, ctr, st), func() string {
		if it = e.intentOf(p, ctr); it.Status.State != st {
			return fmt.Sprintf("%s is %s (%s)", it.ID, it.Status.State, it.Status.Message)
		}
		return ""
	})
	return it
}

// checkRBAC: the agent's token can do what the intake needs and nothing
// else that matters.
func checkRBAC(t *testing.T, cp *ControlPlane) {
	ctx := context.Background()
	agent := cp.Agent()
	if _, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"}); err != nil {
		t.Errorf("list pods: %v", err)
	}
	forbidden := map[string]func() error{
		"get secrets": func() error { _, err := agent.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err },
		"list nodes":  func() error { _, err := agent.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err },
		"delete pods": func() error { return agent.CoreV1().Pods(ns).Delete(ctx, "x", metav1.DeleteOptions{}) },
		"patch pods": func() error {
			_, err := agent.CoreV1().Pods(ns).Patch(ctx, "x", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
			return err
		},
		"update pods/resize": func() error {
			_, err := agent.CoreV1().Pods(ns).UpdateResize(ctx, "x", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.UpdateOptions{})
			return err
		},
		"delete events": func() error { return agent.CoreV1().Events(ns).Delete(ctx, "x", metav1.DeleteOptions{}) },
		"events.k8s.io events": func() error {
			_, err := agent.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"clusterroles": func() error {
			_, err := agent.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
	}
	for what, fn := range forbidden {
		if err := fn(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
}
