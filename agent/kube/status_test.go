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

func TestDesiredConditions(t *testing.T) {
	for name, tc := range map[string]struct {
		states            []containerState
		pending, progress string // "reason:message", "" for none
	}{
		"none":       {nil, "", ""},
		"completed":  {[]containerState{{Container: "a", State: intent.Completed}, {Container: "b", State: intent.Superseded}}, "", ""},
		"infeasible": {[]containerState{{Container: "a", State: intent.Infeasible, Message: "too big"}}, "Infeasible:too big", ""},
		"deferred":   {[]containerState{{Container: "a", State: intent.Deferred, Message: "later"}}, "Deferred:later", ""},
		"running":    {[]containerState{{Container: "a", State: intent.InProgress}}, "", ":"},
		"failed":     {[]containerState{{Container: "a", State: intent.Failed, Message: "EINVAL"}}, "", "Error:EINVAL"},
		"refused":    {[]containerState{{Container: "a", Refused: true, Message: "bad"}}, "", "Error:bad"},
		"mixed": {[]containerState{
			{Container: "b", State: intent.Deferred, Message: "later"},
			{Container: "a", State: intent.Infeasible, Message: "too big"},
			{Container: "c", State: intent.InProgress},
		}, "Infeasible:too big", ":"},
		"two failed": {[]containerState{{Container: "b", State: intent.Failed, Message: "x"}, {Container: "a", State: intent.Failed, Message: "y"}},
			"", "Error:container a: y; container b: x"},
	} {
		p, g := desiredConditions(tc.states, 3)
		str := func(c *corev1.PodCondition, typ corev1.PodConditionType) string {
			if c == nil {
				return ""
			}
			if c.Type != typ || c.Status != corev1.ConditionTrue || c.ObservedGeneration != 3 {
				t.Errorf("%s: %+v", name, c)
			}
			return c.Reason + ":" + c.Message
		}
		if got := str(p, corev1.PodResizePending); got != tc.pending {
			t.Errorf("%s: pending %q, want %q", name, got, tc.pending)
		}
		if got := str(g, corev1.PodResizeInProgress); got != tc.progress {
			t.Errorf("%s: in progress %q, want %q", name, got, tc.progress)
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
	want := map[corev1.PodConditionType]*corev1.PodCondition{
		corev1.PodResizePending:    {Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: "Deferred", Message: "later"},
		corev1.PodResizeInProgress: {Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue, Reason: "Error", Message: "EINVAL"},
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
	if c := findCondition(got, corev1.PodResizeInProgress); c.Reason != "Error" || !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("in progress %+v: the status did not change, so its transition time must not", c)
	}
	if c := findCondition(got, corev1.PodResizePending); c.Message != "later" || !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("pending %+v", c)
	}
	if conditionPatch(got, want, now, true) != nil {
		t.Error("a second patch for the same conditions")
	}

	// Done: both go, the others stay.
	patch = conditionPatch(got, map[corev1.PodConditionType]*corev1.PodCondition{}, now, true)
	got = apply(t, got, patch)
	if len(got.Status.Conditions) != 2 || !apiequality.Semantic.DeepEqual(got.Status.Conditions, []corev1.PodCondition{pod.Status.Conditions[0], pod.Status.Conditions[2]}) {
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
