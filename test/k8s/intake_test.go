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
	"k8s.io/klog/v2"

	"github.com/resizer/resize-agent/agent/admission"
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
	mode   kube.Mode
	cancel context.CancelFunc
	done   chan struct{}
}

// startIntake runs the intake as the agent's service account: the client
// has only the agent's token, so the test proves deploy's RBAC is enough.
func (e *env) startIntake() {
	in, err := kube.New(e.cp.Agent(), e.ra.Agent, kube.Options{NodeName: e.node, Mode: e.mode, Logger: testLogger(e.t),
		RetryBase: 100 * time.Millisecond, RetryMax: 2 * time.Second, Resync: time.Minute})
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
	if found.Source.Component != kube.ReportingController || found.Source.Host != e.node || !strings.HasPrefix(found.InvolvedObject.FieldPath, "spec.") {
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

func TestKubernetesIntake(t *testing.T) {
	start := time.Now()
	// client-go logs through klog: its warnings and errors (a watch cut by
	// the API server's restart, an event retried) to stderr, not its chatter.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	cp := StartControlPlane(t)
	t.Logf("control plane up in %s", time.Since(start).Round(time.Millisecond))
	admin := cp.Admin()
	ctx := context.Background()

	// deploy's namespace, service account and RBAC, as kubectl would
	// apply them: the agent's token is only what they grant.
	for _, obj := range loadManifests(t, filepath.Join(repoRoot(t), "deploy", "base"), "namespace.yaml", "serviceaccount.yaml", "rbac.yaml") {
		createObject(t, admin, obj)
	}
	for _, o := range []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: ns}}} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No controller manager runs: make the "default" service account the
	// ServiceAccount admission plugin wants for pods.
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The nodes, with what a kubelet would report as allocatable: the API
	// server checks a resize of the spec against it. 8 CPUs, while each
	// agent has only 4 to give: a spec resize can pass the API server and
	// still be Infeasible for the agent.
	for _, n := range []string{"node-a", "node-b"} {
		node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Capacity = rl("cpu", "8", "memory", "16Gi", "pods", "110")
		node.Status.Allocatable = node.Status.Capacity
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("rbac is least privilege", func(t *testing.T) { checkRBAC(t, cp) })

	// The agent has 4 CPUs and 8Gi to give.
	e := &env{t: t, cp: cp, admin: admin, node: "node-a", mode: kube.ModeAnnotation,
		ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 << 30})}
	e.startIntake()
	p1 := e.pod("p1", burstable, true)

	t.Run("annotation resize completes", func(t *testing.T) {
		e.t = t
		e.annotate(p1, `{"web": {"limits": {"cpu": "2", "memory": "256Mi"}}, "proxy": {"requests": {"cpu": "150m"}}}`)
		e.waitFile(p1, "web", "cpu.max", "200000 100000")
		e.waitFile(p1, "web", "memory.max", fmt.Sprint(256<<20))
		e.waitFile(p1, "web", "cpu.weight", "59") // 500m -> 512 shares -> runc's weight
		e.waitFile(p1, "proxy", "cpu.max", "20000 100000")
		it := e.waitState(p1, "web", intent.Completed)
		e.waitConditions(p1, "")
		e.waitEvent(p1, corev1.EventTypeNormal, kube.EventResizeCompleted, it.Status.Message)
		e.waitState(p1, "proxy", intent.Completed)
		e.settled(p1)
	})

	t.Run("infeasible", func(t *testing.T) {
		e.t = t
		p2 := e.pod("p2", burstable, false)
		e.annotate(p2, `{"web": {"requests": {"cpu": "64"}, "limits": {"cpu": "64"}}}`)
		it := e.waitState(p2, "web", intent.Infeasible)
		if !strings.Contains(it.Status.Message, "requested 64") {
			t.Errorf("message %q", it.Status.Message)
		}
		e.waitConditions(p2, "PodResizePending=Infeasible:"+it.Status.Message)
		e.waitEvent(p2, corev1.EventTypeWarning, kube.EventResizeInfeasible, it.Status.Message)
		e.settled(p2)
		if got := e.ra.File(t, cgroupOf(p2.UID, "web"), "cpu.max"); got != "max 100000" {
			t.Errorf("an infeasible resize wrote cpu.max %q", got)
		}
	})

	// Another client of the agent (resizectl, say) holds capacity with a
	// container Kubernetes does not know: 2 CPUs. With p1's 500m and the
	// sidecar's 150m, 1350m are free.
	hog := e.ra.AddContainer(t, "not-a-pod", "hog", "/other/hog")
	holdHog := func(t *testing.T, cpu string) {
		t.Helper()
		_, _, err := e.ra.Submit(intent.Spec{ID: "hog-" + cpu, Target: intent.Target{Name: "hog", PodUID: hog.PodUID},
			Resources: corev1.ResourceRequirements{Requests: rl("cpu", cpu)}})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "hog", func() string {
			if it, _ := e.ra.Get("hog-" + cpu); it.Status.State != intent.Completed {
				return string(it.Status.State) + " " + it.Status.Message
			}
			return ""
		})
	}

	t.Run("deferred until capacity frees", func(t *testing.T) {
		e.t = t
		holdHog(t, "2")
		p3 := e.pod("p3", burstable, false)
		e.annotate(p3, `{"web": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}`)
		e.waitState(p3, "web", intent.Completed) // 350m left
		p4 := e.pod("p4", burstable, false)
		e.annotate(p4, `{"web": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}`)
		it := e.waitState(p4, "web", intent.Deferred)
		if !strings.Contains(it.Status.Message, "free 350m") {
			t.Errorf("message %q", it.Status.Message)
		}
		e.waitConditions(p4, "PodResizePending=Deferred:"+it.Status.Message)
		e.waitEvent(p4, corev1.EventTypeWarning, kube.EventResizeDeferred, it.Status.Message)
		// p3 shrinks through its annotation: 800m free up, and p4 goes ahead.
		e.annotate(p3, `{"web": {"requests": {"cpu": "200m"}, "limits": {"cpu": "2"}}}`)
		e.waitFile(p4, "web", "cpu.max", "200000 100000")
		e.waitState(p4, "web", intent.Completed)
		e.waitConditions(p4, "")
		e.waitConditions(p3, "")
	})

	t.Run("api server restart", func(t *testing.T) {
		e.t = t
		// 150m free: p5 is Deferred.
		p5 := e.pod("p5", burstable, false)
		e.annotate(p5, `{"web": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}`)
		it := e.waitState(p5, "web", intent.Deferred)
		e.waitConditions(p5, "PodResizePending=Deferred:"+it.Status.Message)

		down := time.Now()
		cp.StopAPIServer()
		// While the API server is down, capacity frees: p5's resize is done
		// by the agent, and the intake cannot say so yet.
		holdHog(t, "500m")
		e.waitState(p5, "web", intent.Completed)
		e.waitFile(p5, "web", "cpu.max", "200000 100000")
		time.Sleep(2 * time.Second) // the status patch fails and is retried
		cp.StartAPIServer()
		t.Logf("API server down for %s", time.Since(down).Round(time.Millisecond))
		// The pending status update lands once the API server is back ...
		e.waitConditions(p5, "")
		// ... and the informer has listed again: a new request goes through.
		e.annotate(p1, `{"web": {"limits": {"cpu": "3", "memory": "256Mi"}}}`)
		e.waitFile(p1, "web", "cpu.max", "300000 100000")
		e.waitConditions(p1, "")
		e.waitEvent(p1, corev1.EventTypeNormal, kube.EventResizeCompleted, e.waitState(p1, "web", intent.Completed).Status.Message)
	})

	t.Run("restart of the intake resubmits nothing", func(t *testing.T) {
		e.t = t
		before := len(e.ra.List(agentFilter(""), ""))
		updates := e.ra.Runtime.Updates()
		e.stopIntake()
		e.startIntake()
		time.Sleep(2 * time.Second)
		if n := len(e.ra.List(agentFilter(""), "")); n != before || e.ra.Runtime.Updates() != updates {
			t.Errorf("after the intake restarted: %d intents (was %d), %d runtime updates (was %d)", n, before, e.ra.Runtime.Updates(), updates)
		}
		e.waitConditions(p1, "")
	})
	e.stopIntake()

	t.Run("the daemon's wiring: kube.Start with a kubeconfig", func(t *testing.T) {
		d := &env{t: t, cp: cp, admin: admin, node: "node-a", mode: kube.ModeAnnotation,
			ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 << 30})}
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kubeconfig, []byte(cp.Kubeconfig(cp.agentToken)), 0o600); err != nil {
			t.Fatal(err)
		}
		// Start points klog at this logger too: stderr, which outlives the
		// subtest (t.Log does not).
		stderr := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		stop, err := kube.Start(context.Background(), kube.Config{Kubeconfig: kubeconfig, NodeName: "node-a", Intake: "annotation", Logger: stderr}, d.ra.Agent)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		d1 := d.pod("d1", burstable, false)
		d.annotate(d1, `{"web": {"limits": {"memory": "96Mi"}}}`)
		d.waitFile(d1, "web", "memory.max", fmt.Sprint(96<<20))
		d.waitConditions(d1, "")
	})

	t.Run("spec mode through the resize subresource", func(t *testing.T) {
		s := &env{t: t, cp: cp, admin: admin, node: "node-b", mode: kube.ModeSpec,
			ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 << 30})}
		s.startIntake()
		s1 := s.pod("s1", burstable, false)
		// The spec is the truth in this mode: the cgroup follows it at once.
		s.waitFile(s1, "web", "cpu.max", "100000 100000")
		s.waitFile(s1, "web", "memory.max", fmt.Sprint(128<<20))
		resize := `{"spec":{"containers":[{"name":"web","resources":{"requests":{"cpu":"750m","memory":"64Mi"},"limits":{"cpu":"1500m","memory":"192Mi"}}}]}}`
		got, err := admin.CoreV1().Pods(ns).Patch(context.Background(), s1.Name, types.StrategicMergePatchType, []byte(resize), metav1.PatchOptions{}, "resize")
		if err != nil {
			t.Fatalf("resize subresource: %v", err)
		}
		if got.Generation <= s1.Generation {
			t.Errorf("generation %d after the resize (was %d)", got.Generation, s1.Generation)
		}
		s.waitFile(s1, "web", "cpu.max", "150000 100000")
		s.waitFile(s1, "web", "memory.max", fmt.Sprint(192<<20))
		it := s.waitState(s1, "web", intent.Completed)
		s.waitConditions(s1, "")
		s.waitEvent(s1, corev1.EventTypeNormal, kube.EventResizeCompleted, it.Status.Message)
		// An infeasible spec resize is reported the same way.
		resize = `{"spec":{"containers":[{"name":"web","resources":{"requests":{"cpu":"6"},"limits":{"cpu":"6"}}}]}}`
		if _, err := admin.CoreV1().Pods(ns).Patch(context.Background(), s1.Name, types.StrategicMergePatchType, []byte(resize), metav1.PatchOptions{}, "resize"); err != nil {
			t.Fatalf("resize subresource: %v", err)
		}
		it = s.waitState(s1, "web", intent.Infeasible)
		s.waitConditions(s1, "PodResizePending=Infeasible:"+it.Status.Message)
		// node-a's pods are not this intake's.
		for _, it := range s.ra.List(agentFilter(""), "") {
			if it.Spec.Target.PodUID != string(s1.UID) {
				t.Errorf("node-b's agent got an intent for another pod: %s", it.ID)
			}
		}
		s.stopIntake()
	})
	t.Logf("whole test: %s", time.Since(start).Round(time.Millisecond))
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
