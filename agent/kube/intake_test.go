package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

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
	stop   func()
	in     *Intake
}

// newFixture starts an intake; with policy, deploy's annotation policy and
// its binding are in the API server first.
func newFixture(t *testing.T, policy bool) *fixture {
	f := &fixture{t: t, client: fake.NewClientset(), ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}), rec: &recorder{}}
	if policy {
		f.installPolicy()
	}
	f.start()
	t.Cleanup(func() { f.stop() })
	return f
}

// start runs an intake on the fixture's client and agent; stop ends it.
func (f *fixture) start() {
	in, err := New(f.client, f.ra.Agent, Options{NodeName: "node-a", Recorder: f.rec, Logger: quiet, PolicyCheck: 50 * time.Millisecond, VerifyRetry: 20 * time.Millisecond,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Resync: time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	f.stop = func() { cancel(); <-done }
	f.in = in
}

// synced waits until the intake has listed the pods (and so watches the
// agent's intents).
func (f *fixture) synced() {
	f.t.Helper()
	select {
	case <-f.in.Ready():
	case <-time.After(10 * time.Second):
		f.t.Fatal("the intake is not ready after 10 s")
	}
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

// conditions renders the pod's conditions of the agent's type and the
// kubelet's resize types as "Type=Status/Reason:Message".
func (f *fixture) conditions(name string) string {
	p, err := f.client.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, c := range p.Status.Conditions {
		if c.Type == ConditionType || c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
			parts = append(parts, fmt.Sprintf("%s=%s/%s:%s", c.Type, c.Status, c.Reason, c.Message))
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

func (f *fixture) installPolicy() {
	f.t.Helper()
	ctx := context.Background()
	fail := admissionv1.Fail
	expr := "authorizer.group('').resource('pods').subresource('resize').namespace(object.metadata.namespace).name(object.metadata.name).check('patch').allowed() || '" + AnnotationResources + "' == ''"
	if _, err := f.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: AnnotationPolicy},
		Spec:       admissionv1.ValidatingAdmissionPolicySpec{FailurePolicy: &fail, Validations: []admissionv1.Validation{{Expression: expr}}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: AnnotationPolicy},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: AnnotationPolicy, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// kubelet plays the kubelet's part on pod name: it sets the status
// conditions and resources, and writes the container's cgroup files as
// runc would.
func (f *fixture) kubelet(name string, mut func(*corev1.Pod)) {
	f.t.Helper()
	p, err := f.client.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	mut(p)
	if _, err := f.client.CoreV1().Pods("ns").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) writeFile(p *corev1.Pod, file, value string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.ra.Root, cgroupOf(p.UID, "web"), file), []byte(value), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) intentState(uid string) string {
	var last intent.Intent
	for _, it := range f.ours() {
		if it.Spec.Target.PodUID == uid {
			last = it
		}
	}
	return string(last.Status.State) + "/" + last.Status.Reason + ": " + last.Status.Message
}

func (f *fixture) waitIntent(uid string, prefix string) string {
	f.t.Helper()
	var got string
	eventually(f.t, "intent of "+uid, func() string {
		if got = f.intentState(uid); !strings.HasPrefix(got, prefix) {
			return got
		}
		return ""
	})
	return got
}

// kubeletWrites lists the writes of the kubelet's resize conditions or the
// kubelet's Event reasons by the intake: there must be none.
func (f *fixture) kubeletWrites() []string {
	var out []string
	for _, a := range f.client.Actions() {
		if pa, ok := a.(k8stesting.PatchAction); ok && pa.GetSubresource() == "status" {
			var patch struct {
				Status struct {
					Conditions []struct {
						Type corev1.PodConditionType `json:"type"`
					} `json:"conditions"`
				} `json:"status"`
			}
			if err := json.Unmarshal(pa.GetPatch(), &patch); err != nil {
				out = append(out, err.Error())
			}
			for _, c := range patch.Status.Conditions {
				if c.Type != ConditionType {
					out = append(out, string(pa.GetPatch()))
				}
			}
		}
	}
	for _, e := range f.rec.all() {
		for _, r := range []string{"ResizeStarted", "ResizeCompleted", "ResizeDeferred", "ResizeInfeasible", "ResizeError"} {
			if strings.Contains(e, " "+r+":") {
				out = append(out, e)
			}
		}
	}
	return out
}

func (f *fixture) resizePatches() []string {
	var out []string
	for _, a := range f.client.Actions() {
		if pa, ok := a.(k8stesting.PatchAction); ok && pa.GetSubresource() == "resize" {
			out = append(out, string(pa.GetPatch()))
		}
	}
	return out
}

// The whole course of an annotation resize: a pods/resize patch, the
// kubelet's verdicts followed (Deferred, in progress), Completed only once
// the status shows the resources and the cgroup files hold them; the
// agent writes no cgroup file and none of the kubelet's conditions.
func TestAnnotationBecomesPodsResize(t *testing.T) {
	f := newFixture(t, true)
	p := f.pod("a", burstable, "", true)
	f.annotate("a", `{"web": {"limits": {"cpu": "2", "memory": "512Mi"}}}`)
	eventually(t, "the pods/resize patch", func() string {
		got, _ := f.client.CoreV1().Pods("ns").Get(context.Background(), "a", metav1.GetOptions{})
		if l := got.Spec.Containers[0].Resources.Limits; l.Cpu().String() != "2" || l.Memory().String() != "512Mi" {
			return fmt.Sprintf("spec limits %v; patches %q", l, f.resizePatches())
		}
		return ""
	})
	f.waitIntent("uid-a", "Proposed/Patched")
	if got := f.ra.File(t, cgroupOf(p.UID, "web"), "cpu.max"); got != "max 100000" {
		t.Errorf("the agent wrote cpu.max %q", got)
	}
	f.kubelet("a", func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodResizePending, Status: corev1.ConditionTrue,
			Reason: corev1.PodReasonDeferred, Message: "Node didn't have enough resource: cpu"})
	})
	f.waitIntent("uid-a", "Deferred/Deferred: kubelet: Node didn't have enough resource: cpu")
	f.kubelet("a", func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue}}
	})
	f.waitIntent("uid-a", "InProgress/KubeletResizing")
	want := corev1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "128Mi"), Limits: rl("cpu", "2", "memory", "512Mi")}
	f.kubelet("a", func(p *corev1.Pod) {
		p.Status.Conditions = nil
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Resources: &want, AllocatedResources: want.Requests}}
	})
	// The status says done, the files do not hold it yet.
	f.waitIntent("uid-a", "InProgress/CgroupNotVerified")
	f.waitConditions("a", func(s string) bool { return strings.HasPrefix(s, ConditionType+"=False/CgroupNotVerified") })
	f.writeFile(p, "cpu.max", "200000 100000")
	f.writeFile(p, "memory.max", fmt.Sprint(512<<20))
	f.writeFile(p, "cpu.weight", fmt.Sprint(cgroupWeight(500)))
	f.waitIntent("uid-a", "Completed/Verified: actuated by the kubelet and verified")
	f.waitConditions("a", func(s string) bool { return strings.HasPrefix(s, ConditionType+"=True/Verified") })
	eventually(t, "event", func() string {
		if f.rec.find("a", "Normal ResizeVerified") == "" {
			return fmt.Sprint(f.rec.all())
		}
		return ""
	})
	if w := f.kubeletWrites(); len(w) > 0 {
		t.Errorf("the intake wrote the kubelet's conditions or reasons: %q", w)
	}
	if n := len(f.resizePatches()); n != 1 {
		t.Errorf("%d pods/resize patches, want 1: %q", n, f.resizePatches())
	}
	// A restart of the intake follows the same intent again.
	f.stop()
	f.start()
	time.Sleep(300 * time.Millisecond)
	if its := f.ours(); len(its) != 1 {
		t.Errorf("after a re-list: %v", ids(its))
	}
}

func ids(its []intent.Intent) []string {
	var out []string
	for _, it := range its {
		out = append(out, it.ID+"="+string(it.Status.State))
	}
	return out
}

func cgroupWeight(milli int64) uint64 {
	r := intent.Resources{CPURequest: milli}
	return *r.Cgroup(100000, true, false).CPUWeight
}

// Without deploy's annotation policy anyone who may patch a pod could
// resize it through the agent: no annotation is acted on, and the pod and
// the log say why. Once the policy is in, the annotation goes through.
func TestNoAnnotationWithoutThePolicy(t *testing.T) {
	f := newFixture(t, false)
	f.pod("a", burstable, `{"web": {"limits": {"cpu": "2"}}}`, true)
	got := f.waitConditions("a", func(s string) bool { return strings.HasPrefix(s, ConditionType+"=False/Refused") })
	if !strings.Contains(got, "ValidatingAdmissionPolicy "+AnnotationPolicy) {
		t.Errorf("condition %q", got)
	}
	if p := f.resizePatches(); len(p) > 0 || len(f.ours()) > 0 {
		t.Fatalf("acted without the policy: patches %q, intents %v", p, ids(f.ours()))
	}
	f.installPolicy()
	f.waitIntent("uid-a", "Proposed/Patched")
}

// Quantities that would mean no limit, or wrap, are refused before any
// patch.
func TestNoLimitQuantitiesRefused(t *testing.T) {
	f := newFixture(t, true)
	for i, ann := range []string{
		`{"web": {"limits": {"cpu": "0"}}}`,
		`{"web": {"limits": {"memory": "0"}}}`,
		`{"web": {"limits": {"memory": "1e18"}}}`,
		`{"web": {"limits": {"cpu": "1e99"}}}`,
		`{"web": {"requests": {"cpu": "-1"}}}`,
		`{"web": {"limits": {"cpu": "1e18"}}}`,
	} {
		name := fmt.Sprintf("q%d", i)
		f.pod(name, burstable, ann, true)
		got := f.waitConditions(name, func(s string) bool { return strings.HasPrefix(s, ConditionType+"=False/Refused") })
		if !strings.Contains(got, "no limit") && !strings.Contains(got, "negative") && !strings.Contains(got, "wrap") {
			t.Errorf("%s: condition %q", ann, got)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if p := f.resizePatches(); len(p) > 0 {
		t.Errorf("patched: %q", p)
	}
}

// The kubelet's Infeasible and Error are passed on with its message.
func TestKubeletInfeasibleAndError(t *testing.T) {
	f := newFixture(t, true)
	f.pod("a", burstable, `{"web": {"requests": {"cpu": "64"}, "limits": {"cpu": "64"}}}`, true)
	f.waitIntent("uid-a", "Proposed/Patched")
	f.kubelet("a", func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonInfeasible, Message: "Node didn't have enough capacity: cpu, requested: 64000, capacity: 4000"}}
	})
	f.waitIntent("uid-a", "Infeasible/Infeasible: kubelet: Node didn't have enough capacity")
	f.waitConditions("a", func(s string) bool { return strings.HasPrefix(s, ConditionType+"=False/KubeletRefused") })
	f.kubelet("a", func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue, Reason: corev1.PodReasonError, Message: "runtime said no"}}
	})
	f.waitIntent("uid-a", "Failed/Error: kubelet: runtime said no")
	if w := f.kubeletWrites(); len(w) > 0 {
		t.Errorf("the intake wrote the kubelet's conditions or reasons: %q", w)
	}
}

func TestOtherNodesPodsAreIgnored(t *testing.T) {
	f := newFixture(t, true)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "o", Namespace: "ns", UID: "uid-o",
		Annotations: map[string]string{AnnotationResources: `{"web": {"limits": {"cpu": "2"}}}`}},
		Spec: corev1.PodSpec{NodeName: "node-b", Containers: []corev1.Container{{Name: "web", Resources: burstable}}}}
	if _, err := f.client.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if its := f.ours(); len(its) != 0 || len(f.resizePatches()) != 0 {
		t.Errorf("resized a pod of another node: %v", ids(its))
	}
}
