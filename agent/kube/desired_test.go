package kube

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/agent/intent"
)

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func testPod(ann string) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "0b9a1d6e-1111-4222-8333-944455556666"},
		Spec: corev1.PodSpec{
			NodeName: "node-a",
			InitContainers: []corev1.Container{
				{Name: "setup", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m")}},
				{Name: "proxy", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("memory", "64Mi")}},
			},
			Containers: []corev1.Container{
				{Name: "web", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "128Mi"), Limits: rl("cpu", "1", "memory", "256Mi")},
					ResizePolicy: []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}},
				{Name: "idle"},
			},
		},
	}
	if ann != "" {
		p.Annotations = map[string]string{AnnotationResources: ann}
	}
	return p
}

func TestParseAnnotationIsStrict(t *testing.T) {
	good := `{"web": {"requests": {"cpu": "750m"}, "limits": {"cpu": "2"}, "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]}}`
	if m, err := ParseAnnotation(good); err != nil || len(m) != 1 || m["web"].ResizePolicy[0].ResourceName != "cpu" {
		t.Fatalf("ParseAnnotation(good) = %v, %v", m, err)
	}
	for name, v := range map[string]string{
		"unknown field":  `{"web": {"limit": {"cpu": "2"}}}`,
		"trailing":       `{"web": {"limits": {"cpu": "2"}}} {}`,
		"bad quantity":   `{"web": {"limits": {"cpu": "two"}}}`,
		"other resource": `{"web": {"limits": {"nvidia.com/gpu": "1"}}}`,
		"empty entry":    `{"web": {}}`,
		"empty":          `{}`,
		"not json":       `web=2`,
		"slow exponent":  `{"web": {"limits": {"cpu": "1e-9999999"}}}`,
	} {
		start := time.Now()
		if _, err := ParseAnnotation(v); err == nil {
			t.Errorf("%s: %s accepted", name, v)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: refusing took %v", name, d) // the unscreened parser takes minutes
		}
	}
}

func TestDesiredFromAnnotationOverridesSpec(t *testing.T) {
	pod := testPod(`{"web": {"limits": {"cpu": "2"}}, "proxy": {"limits": {"memory": "128Mi"}}}`)
	ds, refusals := DesiredFor(pod)
	if len(refusals) != 0 || len(ds) != 2 {
		t.Fatalf("desired %+v refusals %+v", ds, refusals)
	}
	proxy, web := ds[0], ds[1]
	// web: the cpu limit changes; the request and memory stay the spec's.
	if got := describe(web.Spec.Resources); got != "requests cpu=500m memory=128Mi, limits cpu=2 memory=256Mi" {
		t.Errorf("web: %s", got)
	}
	if web.Spec.Target != (intent.Target{Name: "web", PodUID: string(pod.UID)}) || web.FieldPath != "spec.containers{web}" {
		t.Errorf("web target %+v %s", web.Spec.Target, web.FieldPath)
	}
	if len(web.Spec.ResizePolicy) != 1 || web.Spec.ResizePolicy[0].RestartPolicy != corev1.RestartContainer {
		t.Errorf("web keeps its spec's resizePolicy: %+v", web.Spec.ResizePolicy)
	}
	// The native sidecar is a container too; cpu without a limit has none.
	if got := describe(proxy.Spec.Resources); got != "requests cpu=100m memory=32Mi, limits cpu=none memory=128Mi" || proxy.FieldPath != "spec.initContainers{proxy}" {
		t.Errorf("proxy: %s %s", got, proxy.FieldPath)
	}
	for _, d := range ds {
		if _, _, err := intent.Validate(withID(d, 0)); err != nil {
			t.Errorf("%s: the agent would refuse it: %v", d.Container, err)
		}
	}
}

func withID(d Desired, n int) intent.Spec {
	s := d.Spec
	s.ID = IntentID(d, n)
	return s
}

func TestAnnotationRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		ann, want string
	}{
		"init container": {`{"setup": {"limits": {"cpu": "1"}}}`, "not a container or a native sidecar"},
		"unknown":        {`{"nope": {"limits": {"cpu": "1"}}}`, `container "nope"`},
		"malformed":      {`{"web": {"limits": {"cpu": "1"}}`, "annotation " + AnnotationResources},
	} {
		ds, refusals := DesiredFor(testPod(tc.ann))
		if len(refusals) == 0 || !strings.Contains(refusals[0].Message, tc.want) {
			t.Errorf("%s: refusals %+v, want %q", name, refusals, tc.want)
		}
		if len(ds) != 0 {
			t.Errorf("%s: desired %+v", name, ds)
		}
	}
	be := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u", Annotations: map[string]string{AnnotationResources: `{"c": {"requests": {"cpu": "100m"}}}`}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	if _, r := DesiredFor(be); len(r) != 1 || !strings.Contains(r[0].Message, "from BestEffort to Burstable") {
		t.Errorf("best effort: %+v", r)
	}
	// A Guaranteed pod stays Guaranteed only if requests move with limits.
	g := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u", Annotations: map[string]string{AnnotationResources: `{"c": {"limits": {"cpu": "2"}}}`}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "1Gi"), Limits: rl("cpu", "1", "memory", "1Gi")}}}}}
	if _, r := DesiredFor(g); len(r) != 1 || !strings.Contains(r[0].Message, "from Guaranteed to Burstable") {
		t.Errorf("guaranteed: %+v", r)
	}
	g.Annotations[AnnotationResources] = `{"c": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}`
	if ds, r := DesiredFor(g); len(r) != 0 || len(ds) != 1 {
		t.Errorf("guaranteed, both moved: %+v %+v", ds, r)
	}
}

func TestModes(t *testing.T) {
	if ds, r := DesiredFor(testPod("")); len(ds) != 0 || len(r) != 0 {
		t.Errorf("no annotation: %+v %+v", ds, r)
	}
	for _, s := range []string{"annotation", "off", ""} {
		if _, err := ParseMode(s); err != nil {
			t.Error(err)
		}
	}
	// spec and both are gone: the kubelet resizes from the spec itself.
	for _, s := range []string{"spec", "both", "all"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("mode %s accepted", s)
		}
	}
}

// Quantities that would mean no limit, or wrap, are refused.
func TestNoLimitQuantities(t *testing.T) {
	for _, v := range []string{
		`{"web": {"limits": {"cpu": "0"}}}`, `{"web": {"limits": {"memory": "0"}}}`,
		`{"web": {"limits": {"memory": "1e18"}}}`, `{"web": {"limits": {"cpu": "1e99"}}}`,
		`{"web": {"requests": {"memory": "-1"}}}`, `{"web": {"limits": {"cpu": "200k"}}}`,
		`{"web": {"limits": {"memory": "2Pi"}}}`,
		`{"web": {"limits": {"memory": "1Gi"}, "allowMemoryBelowUsage": true}}`,
	} {
		if _, err := ParseAnnotation(v); err == nil {
			t.Errorf("%s accepted", v)
		}
	}
	for _, v := range []string{`{"web": {"limits": {"cpu": "100k", "memory": "1Pi"}}}`, `{"web": {"requests": {"cpu": "0"}}}`} {
		if _, err := ParseAnnotation(v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

func TestIntentIDIsDeterministic(t *testing.T) {
	a, _ := DesiredFor(testPod(`{"web": {"limits": {"cpu": "2"}}}`))
	b, _ := DesiredFor(testPod(`{"web": {"limits": {"cpu": "2000m"}}}`))
	c, _ := DesiredFor(testPod(`{"web": {"limits": {"cpu": "3"}}}`))
	if IntentID(a[0], 0) != IntentID(b[0], 0) {
		t.Errorf("the same resources written another way got another ID: %s %s", IntentID(a[0], 0), IntentID(b[0], 0))
	}
	if IntentID(a[0], 0) == IntentID(c[0], 0) || IntentID(a[0], 0) == IntentID(a[0], 1) {
		t.Error("other resources or another round share an ID")
	}
	id := IntentID(a[0], 0)
	if !strings.HasPrefix(id, IDPrefix+"0b9a1d6e-1111-4222-8333-944455556666.web.") {
		t.Errorf("id %s", id)
	}
	long := a[0]
	long.Container = strings.Repeat("c", 63)
	long.Spec.Target.PodUID = strings.Repeat("u", 63)
	for _, d := range []Desired{a[0], long} {
		s := withID(d, 999)
		if _, _, err := intent.Validate(s); err != nil || len(s.ID) > 128 {
			t.Errorf("id %q: %v", s.ID, err)
		}
	}
	// The spec hashed is the spec submitted.
	b1, _ := json.Marshal(a[0].Spec)
	b2, _ := json.Marshal(b[0].Spec)
	if string(b1) != string(b2) {
		t.Errorf("%s != %s", b1, b2)
	}
}

// With pod-level resources the QoS class is the pod level's alone
// (ComputePodQOS): giving a container without resources a request is no
// QoS change, where the containers alone would go BestEffort -> Burstable.
func TestDesiredPodLevelQOS(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "0b9a1d6e-1111-4222-8333-944455556667",
			Annotations: map[string]string{AnnotationResources: `{"app": {"requests": {"cpu": "100m"}}}`}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "app"}},
			Resources: &corev1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "1Gi"), Limits: rl("cpu", "1", "memory", "1Gi")}},
	}
	if ds, refusals := DesiredFor(pod); len(refusals) != 0 || len(ds) != 1 {
		t.Fatalf("desired %+v refusals %+v", ds, refusals)
	}
	pod.Spec.Resources = nil
	if _, refusals := DesiredFor(pod); len(refusals) != 1 || !strings.Contains(refusals[0].Message, "QoS class") {
		t.Fatalf("without pod-level resources, refusals %+v", refusals)
	}
}

// A mirror pod's annotation is refused here, as the API server would
// refuse its pods/resize patch: no desired resize, one refusal saying why.
func TestMirrorPodIsNotResized(t *testing.T) {
	pod := testPod(`{"web": {"limits": {"cpu": "2"}}}`)
	pod.Annotations["kubernetes.io/config.mirror"] = "6d8cb1b8f5a3b1c0e0f2a9d4c7e6b5a4"
	ds, refusals := DesiredFor(pod)
	if len(ds) != 0 || len(refusals) != 1 || !strings.Contains(refusals[0].Message, "static pod cannot be resized") {
		t.Fatalf("desired %+v refusals %+v: want none, one refusal naming the static pod", ds, refusals)
	}
}
