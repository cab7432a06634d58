package kube

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/resizer/resize-agent/agent/intent"
)

func TestDesiredCondition(t *testing.T) {
	for name, tc := range map[string]struct {
		states []containerState
		want   string // "status/reason:message", "" for none
	}{
		"none":       {nil, ""},
		"verified":   {[]containerState{{Container: "a", State: intent.Completed, Reason: ReasonVerified, Message: "ok"}, {Container: "b", State: intent.Superseded}}, "True/Verified:ok"},
		"waiting":    {[]containerState{{Container: "a", State: intent.Deferred, Message: "later"}}, "False/WaitingForKubelet:the kubelet has not finished the resize: see its PodResizePending and PodResizeInProgress conditions"},
		"infeasible": {[]containerState{{Container: "a", State: intent.Infeasible, Message: "too big"}}, "False/KubeletRefused:too big"},
		"refused":    {[]containerState{{Container: "a", Refused: true, Message: "bad"}, {Container: "b", State: intent.Failed, Message: "x"}}, "False/Refused:bad"},
		"patch":      {[]containerState{{Container: "a", State: intent.Failed, Reason: ReasonPatchRefused, Message: "quota"}}, "False/PatchRefused:quota"},
		"unverified": {[]containerState{{Container: "a", State: intent.InProgress, Reason: ReasonNotVerified, Message: "files"}}, "False/CgroupNotVerified:files"},
		"two": {[]containerState{{Container: "b", State: intent.Failed, Message: "x"}, {Container: "a", State: intent.Failed, Message: "y"}},
			"False/KubeletRefused:container a: y; container b: x"},
	} {
		c := desiredCondition(tc.states, 3)
		got := ""
		if c != nil {
			if c.Type != ConditionType || c.ObservedGeneration != 3 {
				t.Errorf("%s: %+v", name, c)
			}
			got = string(c.Status) + "/" + c.Reason + ":" + c.Message
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}

// The patch, applied as the API server applies a strategic merge patch,
// changes the two resize conditions and nothing else.
func TestConditionPatchTouchesOnlyItsConditions(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	now := time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u1"}, Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: t0},
		{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue, LastTransitionTime: t0},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t0},
	}}}
	// The kubelet's conditions are not the agent's: asking for them does
	// nothing.
	if p := conditionPatch(pod, map[corev1.PodConditionType]*corev1.PodCondition{
		corev1.PodResizePending: {Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: "Deferred"},
	}, now, true); p != nil && strings.Contains(string(p), string(corev1.PodResizePending)) {
		t.Errorf("patch of a kubelet condition: %s", p)
	}
	want := map[corev1.PodConditionType]*corev1.PodCondition{
		ConditionType: {Type: ConditionType, Status: corev1.ConditionFalse, Reason: "WaitingForKubelet", Message: "later"},
	}
	patch := conditionPatch(pod, want, now, true)
	if !strings.Contains(string(patch), `"metadata":{"uid":"u1"}`) || strings.Contains(string(patch), "setElementOrder") {
		t.Errorf("patch %s", patch)
	}
	got := apply(t, pod, patch)
	if len(got.Status.Conditions) != 4 {
		t.Fatalf("conditions %+v", got.Status.Conditions)
	}
	// The others are untouched and keep their order (a new entry may come
	// first: pod conditions are a map keyed by type).
	var others []corev1.PodCondition
	for _, c := range got.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.PodScheduled {
			others = append(others, c)
		}
	}
	if len(others) != 2 || !apiequality.Semantic.DeepEqual(others, []corev1.PodCondition{pod.Status.Conditions[0], pod.Status.Conditions[2]}) {
		t.Errorf("other conditions changed: %+v", others)
	}
	if c := findCondition(got, corev1.PodResizeInProgress); c == nil || c.Reason != "" || !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("the kubelet's condition changed: %+v", c)
	}
	if c := findCondition(got, ConditionType); c.Message != "later" || !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("own %+v", c)
	}
	if conditionPatch(got, want, now, true) != nil {
		t.Error("a second patch for the same conditions")
	}

	// Nothing to say: it goes, the others stay.
	patch = conditionPatch(got, map[corev1.PodConditionType]*corev1.PodCondition{}, now, true)
	got = apply(t, got, patch)
	if len(got.Status.Conditions) != 3 || !apiequality.Semantic.DeepEqual(got.Status.Conditions, pod.Status.Conditions) {
		t.Errorf("after removal: %+v (patch %s)", got.Status.Conditions, patch)
	}
	// Conditions the intake has no reason to think are its own stay.
	if conditionPatch(pod, nil, now, false) != nil {
		t.Error("removed conditions it does not own")
	}
}

func apply(t *testing.T, pod *corev1.Pod, patch []byte) *corev1.Pod {
	t.Helper()
	orig, _ := json.Marshal(pod)
	b, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.Pod{})
	if err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}
