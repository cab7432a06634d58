package kube

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/agent/intent"
)

// ownedConditions are the only pod conditions the agent writes.
var ownedConditions = []corev1.PodConditionType{corev1.PodResizePending, corev1.PodResizeInProgress}

// containerState is where one container's latest resize request stands.
type containerState struct {
	Container string
	// State is the intent's state; "" for a request refused before it
	// became an intent (Refused is then set).
	State   intent.State
	Reason  string
	Message string
	Refused bool
}

// desiredConditions derives the two resize conditions from the containers'
// states, as the kubelet reports an in-place resize:
//
//   - PodResizePending, status True, reason Infeasible (it can never fit
//     the node) or Deferred (not now; retried when capacity frees), message
//     the agent's;
//   - PodResizeInProgress, status True while an intent is accepted or being
//     applied (no reason), and with reason Error and the agent's message
//     when the intent ended Failed or the request was refused;
//
// and neither once every container's resize has completed (or there is
// none). Infeasible wins over Deferred, Error over plain progress; with
// several containers in the same condition, the message names each.
func desiredConditions(states []containerState, generation int64) (pending, progress *corev1.PodCondition) {
	sort.Slice(states, func(i, j int) bool { return states[i].Container < states[j].Container })
	var infeasible, deferred, failed, running []containerState
	for _, s := range states {
		switch {
		case s.Refused || s.State == intent.Failed:
			failed = append(failed, s)
		case s.State == intent.Infeasible:
			infeasible = append(infeasible, s)
		case s.State == intent.Deferred:
			deferred = append(deferred, s)
		case s.State == intent.Proposed || s.State == intent.InProgress:
			running = append(running, s)
		}
	}
	cond := func(t corev1.PodConditionType, reason string, ss []containerState) *corev1.PodCondition {
		return &corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: joinMessages(ss), ObservedGeneration: generation}
	}
	switch {
	case len(infeasible) > 0:
		pending = cond(corev1.PodResizePending, corev1.PodReasonInfeasible, infeasible)
	case len(deferred) > 0:
		pending = cond(corev1.PodResizePending, corev1.PodReasonDeferred, deferred)
	}
	switch {
	case len(failed) > 0:
		progress = cond(corev1.PodResizeInProgress, corev1.PodReasonError, failed)
	case len(running) > 0:
		progress = cond(corev1.PodResizeInProgress, "", nil)
	}
	return pending, progress
}

// joinMessages is the message of one container as the agent wrote it, or,
// for several, each prefixed by its container's name. Messages are bounded,
// as the API server bounds nothing here but readers do.
func joinMessages(ss []containerState) string {
	if len(ss) == 1 {
		return truncate(ss[0].Message, 4096)
	}
	parts := make([]string, 0, len(ss))
	for _, s := range ss {
		if s.Message != "" {
			parts = append(parts, fmt.Sprintf("container %s: %s", s.Container, s.Message))
		}
	}
	return truncate(strings.Join(parts, "; "), 4096)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// conditionPatch returns the patch that makes the pod's two resize
// conditions what want says (a nil entry: the condition is removed), or nil
// when they already are. Conditions whose status does not change keep their
// lastTransitionTime.
//
// It is a strategic merge patch on the pods/status subresource. Pod
// conditions are a list merged by their "type" key, so the patch carries
// only the entries of the two condition types the agent owns (a full entry
// to set one, a {"type": ..., "$patch": "delete"} directive to remove one)
// and no $setElementOrder: every other condition (Ready, PodScheduled, the
// kubelet's) is left exactly as it is, whoever wrote it. Server-side apply
// with a "resize-agent" field manager would do the same for fields the
// agent alone owns, but on a node whose kubelet also writes these two types
// it would either fail with conflicts or, forced, take the kubelet's fields
// over; and the merge patch needs no managedFields bookkeeping, works
// against any API server version with these conditions, and is the same
// request the kubelet makes for pod status. metadata.uid is a
// precondition: a patch meant for a pod that was deleted and re-created
// under the same name fails with a conflict instead of landing on the new
// one. The patch does not carry a resourceVersion, so a concurrent writer
// (the kubelet updating Ready) cannot make it fail; a conflict or a failed
// request is retried with backoff by the caller.
func conditionPatch(pod *corev1.Pod, want map[corev1.PodConditionType]*corev1.PodCondition, now time.Time, owned bool) []byte {
	var entries, deletes []any
	for _, t := range ownedConditions {
		cur := findCondition(pod, t)
		w := want[t]
		switch {
		case w == nil && owned:
			del := map[string]any{"type": t, "$patch": "delete"}
			if cur != nil {
				entries = append(entries, del)
			} else {
				// Deleting what is not there is a no-op: sent along with
				// another change, it clears a condition that the cached pod
				// does not show yet.
				deletes = append(deletes, del)
			}
		case w == nil:
		case cur == nil || cur.Status != w.Status || cur.Reason != w.Reason || cur.Message != w.Message || cur.ObservedGeneration != w.ObservedGeneration:
			c := *w
			c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
			if cur != nil && cur.Status == w.Status {
				c.LastTransitionTime = cur.LastTransitionTime
			}
			c.LastProbeTime = metav1.NewTime(now.Truncate(time.Second))
			entries = append(entries, c)
		}
	}
	if len(entries) == 0 {
		return nil
	}
	entries = append(entries, deletes...)
	b, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   map[string]any{"conditions": entries},
	})
	if err != nil {
		panic(err) // plain maps and API types always marshal
	}
	return b
}

func findCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// hasOwnedCondition reports whether the pod carries either resize condition.
func hasOwnedCondition(pod *corev1.Pod) bool {
	for _, t := range ownedConditions {
		if findCondition(pod, t) != nil {
			return true
		}
	}
	return false
}
