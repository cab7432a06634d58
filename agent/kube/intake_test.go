package kube

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const gi = 1 << 30

// recorder keeps the Events the intake records.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Event(obj runtime.Object, eventtype, reason, message string) {
	ref := obj.(*corev1.ObjectReference)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%s %s %s %s: %s", ref.Name, ref.FieldPath, eventtype, reason, message))
}

func (r *recorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recorder) find(sub ...string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		ok := true
		for _, s := range sub {
			ok = ok && strings.Contains(e, s)
		}
		if ok {
			return e
		}
	}
	return ""
}

type fixture struct {
	t      *testing.T
	client *fake.Clientset
	ra     *agenttest.RuntimeAgent
	rec    *recorder
	mode   Mode
	stop   func()
}

func newFixture(t *testing.T, mode Mode, alloc admission.Capacity) *fixture {
	f := &fixture{t: t, client: fake.NewClientset(), ra: agenttest.NewRuntimeAgent(t, alloc), rec: &recorder{}, mode: mode}
	f.start()
	t.Cleanup(func() { f.stop() })
	return f
}

// start runs an intake on the fixture's client and agent; stop ends it.
func (f *fixture) start() {
	in, err := New(f.client, f.ra.Agent, Options{NodeName: "node-a", Mode: f.mode, Recorder: f.rec, Logger: quiet,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Resync: time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	f.stop = func() { cancel(); <-done }
}

func cgroupOf(uid types.UID, ctr string) string {
	return "/kubepods/burstable/pod" + string(uid) + "/" + ctr
}

// pod creates a pod on node-a with one container "web" and starts the
// container in the runtime (unless running is false).
func (f *fixture) pod(name string, res corev1.ResourceRequirements, ann string, running bool) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "web", Resources: res}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ann != "" {
		p.Annotations = map[string]string{AnnotationResources: ann}
	}
	if running {
		f.ra.AddContainer(f.t, string(p.UID), "web", cgroupOf(p.UID, "web"))
	}
	p, err := f.client.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) update(name string, mut func(*corev1.Pod)) {
	f.t.Helper()
	p, err := f.client.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	mut(p)
	if _, err := f.client.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) annotate(name, ann string) {
	f.update(name, func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[AnnotationResources] = ann
	})
}

func eventually(t *testing.T, what string, fn func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		msg := fn()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *fixture) waitFile(p *corev1.Pod, file, want string) {
	f.t.Helper()
	eventually(f.t, "cgroup "+file, func() string {
		if got := f.ra.File(f.t, cgroupOf(p.UID, "web"), file); got != want {
			return fmt.Sprintf("%s is %q, want %q", file, got, want)
		}
		return ""
	})
}

// conditions renders the pod's resize conditions as "Type=Reason:Message".
func (f *fixture) conditions(name string) string {
	p, err := f.client.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
			parts = append(parts, fmt.Sprintf("%s=%s:%s", c.Type, c.Reason, c.Message))
		}
	}
	return strings.Join(parts, ",")
}

func (f *fixture) waitConditions(name string, want func(string) bool) string {
	f.t.Helper()
	var got string
	eventually(f.t, "conditions of "+name, func() string {
		if got = f.conditions(name); !want(got) {
			return fmt.Sprintf("%q", got)
		}
		return ""
	})
	return got
}

func none(s string) bool { return s == "" }

func (f *fixture) ours() []intent.Intent {
	var out []intent.Intent
	for _, it := range f.ra.List(agent.Filter{}, "") {
		if strings.HasPrefix(it.ID, IDPrefix) {
			out = append(out, it)
		}
	}
	return out
}

var burstable = corev1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "128Mi"), Limits: rl("cpu", "1", "memory", "256Mi")}

func TestAnnotationResizeCompletesAndIsIdempotent(t *testing.T) {
	f := newFixture(t, ModeAnnotation, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := f.pod("a", burstable, "", true)
	f.annotate("a", `{"web": {"limits": {"cpu": "2", "memory": "512Mi"}}}`)
	f.waitFile(p, "cpu.max", "200000 100000")
	f.waitFile(p, "memory.max", fmt.Sprint(512<<20))
	f.waitFile(p, "cpu.weight", "59") // 500m -> 512 shares -> runc's weight
	f.waitConditions("a", none)
	eventually(t, "event", func() string {
		if e := f.rec.find("a spec.containers{web} Normal ResizeCompleted: container web:"); e == "" {
			return fmt.Sprint(f.rec.all())
		}
		return ""
	})
	its := f.ours()
	if len(its) != 1 || its[0].Status.State != intent.Completed || its[0].Spec.Target.PodUID != "uid-a" {
		t.Fatalf("intents %+v", its)
	}

	// A restart of the intake (a re-list) submits the same intent again:
	// nothing new, nothing written.
	f.stop()
	updates := f.ra.Runtime.Updates()
	f.start()
	time.Sleep(300 * time.Millisecond)
	if its := f.ours(); len(its) != 1 || f.ra.Runtime.Updates() != updates {
		t.Errorf("after a re-list: %d intents, %d updates (was %d)", len(its), f.ra.Runtime.Updates(), updates)
	}
}

func TestSameResourcesAgainAfterOthers(t *testing.T) {
	f := newFixture(t, ModeAnnotation, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := f.pod("a", burstable, `{"web": {"limits": {"cpu": "2"}}}`, true)
	f.waitFile(p, "cpu.max", "200000 100000")
	f.annotate("a", `{"web": {"limits": {"cpu": "3"}}}`)
	f.waitFile(p, "cpu.max", "300000 100000")
	f.annotate("a", `{"web": {"limits": {"cpu": "2"}}}`)
	f.waitFile(p, "cpu.max", "200000 100000")
	its := f.ours()
	if len(its) != 3 || !strings.HasSuffix(its[2].ID, ".1") || strings.TrimSuffix(its[2].ID, ".1") != its[0].ID {
		t.Errorf("intents %v", ids(its))
	}
}

func ids(its []intent.Intent) []string {
	var out []string
	for _, it := range its {
		out = append(out, it.ID+"="+string(it.Status.State))
	}
	return out
}

func TestInfeasibleAndDeferred(t *testing.T) {
	f := newFixture(t, ModeAnnotation, admission.Capacity{MilliCPU: 2000, Memory: 8 * gi})
	big := f.pod("big", burstable, `{"web": {"requests": {"cpu": "64"}, "limits": {"cpu": "64"}}}`, true)
	got := f.waitConditions("big", func(s string) bool {
		return strings.HasPrefix(s, "PodResizePending=Infeasible:") && !strings.Contains(s, "PodResizeInProgress")
	})
	its := f.ours()
	if len(its) != 1 || got != "PodResizePending=Infeasible:"+its[0].Status.Message || !strings.Contains(got, "requested 64") {
		t.Errorf("condition %q, intents %+v", got, its)
	}
	eventually(t, "event", func() string {
		if f.rec.find("big", "Warning ResizeInfeasible", its[0].Status.Message) == "" {
			return fmt.Sprintf("no Warning event: %v", f.rec.all())
		}
		return ""
	})
	if got := f.ra.File(t, cgroupOf(big.UID, "web"), "cpu.max"); got != "max 100000" {
		t.Errorf("an infeasible resize wrote cpu.max %s", got)
	}

	// x takes 1500m of the 2000m; y's 1000m fits the node but not now.
	f.pod("x", burstable, `{"web": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "2"}}}`, true)
	f.waitConditions("x", none)
	eventually(t, "x completed", func() string {
		for _, it := range f.ours() {
			if it.Spec.Target.PodUID == "uid-x" && it.Status.State == intent.Completed {
				return ""
			}
		}
		return fmt.Sprint(ids(f.ours()))
	})
	y := f.pod("y", burstable, `{"web": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}`, true)
	got = f.waitConditions("y", func(s string) bool {
		return strings.HasPrefix(s, "PodResizePending=Deferred:") && !strings.Contains(s, "PodResizeInProgress")
	})
	if !strings.Contains(got, "free 500m") {
		t.Errorf("deferred message %q", got)
	}
	eventually(t, "event", func() string {
		if f.rec.find("y", "Warning ResizeDeferred") == "" {
			return fmt.Sprintf("no Deferred event: %v", f.rec.all())
		}
		return ""
	})
	// x goes: its capacity frees and y's resize goes ahead.
	if err := f.client.CoreV1().Pods("ns").Delete(context.Background(), "x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFile(y, "cpu.max", "200000 100000")
	f.waitConditions("y", none)
	// The infeasible one stays as it was.
	if got := f.conditions("big"); !strings.HasPrefix(got, "PodResizePending=Infeasible:") {
		t.Errorf("big: %q", got)
	}
}

func TestRefusedAnnotationThenFixed(t *testing.T) {
	f := newFixture(t, ModeAnnotation, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := f.pod("a", burstable, `{"web": {"limits": {"cpu": "two"}}}`, true)
	got := f.waitConditions("a", func(s string) bool {
		return strings.HasPrefix(s, "PodResizeInProgress=Error:annotation "+AnnotationResources)
	})
	if e := f.rec.find("a", "Warning ResizeError", "annotation"); e == "" {
		t.Errorf("no event for %q: %v", got, f.rec.all())
	}
	// The agent refuses a request above its limit.
	f.annotate("a", `{"web": {"requests": {"cpu": "3"}}}`)
	got = f.waitConditions("a", func(s string) bool { return strings.Contains(s, "must be less than or equal to cpu limit") })
	if !strings.HasPrefix(got, "PodResizeInProgress=Error:") {
		t.Errorf("conditions %q", got)
	}
	f.annotate("a", `{"web": {"requests": {"cpu": "750m"}}}`)
	f.waitFile(p, "cpu.weight", fmt.Sprint(cgroupWeight(750)))
	f.waitConditions("a", none)
}

func cgroupWeight(milli int64) uint64 {
	r := intent.Resources{CPURequest: milli}
	return *r.Cgroup(100000, true, false).CPUWeight
}

func TestWaitsForTheContainer(t *testing.T) {
	f := newFixture(t, ModeAnnotation, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := f.pod("a", burstable, `{"web": {"limits": {"cpu": "2"}}}`, false)
	time.Sleep(200 * time.Millisecond)
	if its := f.ours(); len(its) != 0 {
		t.Fatalf("intents before the container runs: %v", ids(its))
	}
	f.ra.AddContainer(t, string(p.UID), "web", cgroupOf(p.UID, "web"))
	f.waitFile(p, "cpu.max", "200000 100000")
}

func TestOtherNodesPodsAreIgnored(t *testing.T) {
	f := newFixture(t, ModeBoth, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "o", Namespace: "ns", UID: "uid-o",
		Annotations: map[string]string{AnnotationResources: `{"web": {"limits": {"cpu": "2"}}}`}},
		Spec: corev1.PodSpec{NodeName: "node-b", Containers: []corev1.Container{{Name: "web", Resources: burstable}}}}
	f.ra.AddContainer(t, "uid-o", "web", cgroupOf("uid-o", "web"))
	if _, err := f.client.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if its := f.ours(); len(its) != 0 {
		t.Errorf("resized a pod of another node: %v", ids(its))
	}
}

func TestSpecModeFollowsThePodSpec(t *testing.T) {
	f := newFixture(t, ModeSpec, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := f.pod("a", burstable, `{"web": {"limits": {"cpu": "3"}}}`, true)
	// The spec's values are applied, the annotation is not read.
	f.waitFile(p, "cpu.max", "100000 100000")
	f.waitFile(p, "memory.max", fmt.Sprint(256<<20))
	f.update("a", func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "128Mi"), Limits: rl("cpu", "2", "memory", "384Mi")}
		p.Generation++
	})
	f.waitFile(p, "cpu.max", "200000 100000")
	f.waitFile(p, "memory.max", fmt.Sprint(384<<20))
	f.waitConditions("a", none)
	if e := f.rec.find("a", "ResizeCompleted"); e == "" {
		t.Errorf("events %v", f.rec.all())
	}
}
