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

// ownedConditions are the only pod conditions the agent writes: its own
// type. The kubelet's PodResizePending and PodResizeInProgress are never
// written (kubelet pkg/kubelet/types/pod_status.go PodConditionsByKubelet:
// its status manager drops any it did not generate).
var ownedConditions = []corev1.PodConditionType{ConditionType}

// Reasons of the agent's own condition.
const (
	// CondVerified (status True): every container's resize was actuated by
	// the kubelet and read back from its cgroup files by the agent.
	CondVerified = "Verified"
	// CondWaiting (False): the kubelet has not finished; its own conditions
	// say where it stands.
	CondWaiting = "WaitingForKubelet"
	// CondRefused (False): the annotation was refused before any patch
	// (malformed, a quantity meaning no limit, the annotation policy not in
	// force).
	CondRefused = "Refused"
	// CondPatchRefused (False): the API server refused the pods/resize
	// patch (RBAC, quota, LimitRange, PodResizeValidator).
	CondPatchRefused = "PatchRefused"
	// CondNotVerified (False): the kubelet reports the resources, the
	// cgroup files hold something else.
	CondNotVerified = "CgroupNotVerified"
	// CondKubeletFailed (False): the kubelet reported an error, or said
	// Infeasible.
	CondKubeletFailed = "KubeletRefused"
)

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

// desiredCondition derives the agent's own condition from the containers'
// states: what only the agent knows (refusals before the patch, the API
// server's refusal of the patch, the cgroup check), nil when there is
// nothing to say. The first that applies, in this order: refused, patch
// refused, kubelet failed or infeasible, not verified, waiting, verified.
func desiredCondition(states []containerState, generation int64) *corev1.PodCondition {
	if len(states) == 0 {
		return nil
	}
	sort.Slice(states, func(i, j int) bool { return states[i].Container < states[j].Container })
	var refused, patch, kubelet, unverified, waiting []containerState
	for _, s := range states {
		switch {
		case s.Refused:
			refused = append(refused, s)
		case s.Reason == ReasonPatchRefused:
			patch = append(patch, s)
		case s.State == intent.Failed || s.State == intent.Infeasible:
			kubelet = append(kubelet, s)
		case s.Reason == ReasonNotVerified:
			unverified = append(unverified, s)
		case s.State != intent.Completed && s.State != intent.Superseded:
			waiting = append(waiting, s)
		}
	}
	cond := func(st corev1.ConditionStatus, reason string, ss []containerState) *corev1.PodCondition {
		return &corev1.PodCondition{Type: ConditionType, Status: st, Reason: reason, Message: joinMessages(ss), ObservedGeneration: generation}
	}
	switch {
	case len(refused) > 0:
		return cond(corev1.ConditionFalse, CondRefused, refused)
	case len(patch) > 0:
		return cond(corev1.ConditionFalse, CondPatchRefused, patch)
	case len(kubelet) > 0:
		return cond(corev1.ConditionFalse, CondKubeletFailed, kubelet)
	case len(unverified) > 0:
		return cond(corev1.ConditionFalse, CondNotVerified, unverified)
	case len(waiting) > 0:
		c := cond(corev1.ConditionFalse, CondWaiting, nil)
		c.Message = "the kubelet has not finished the resize: see its PodResizePending and PodResizeInProgress conditions"
		return c
	}
	var done []containerState
	for _, s := range states {
		if s.State == intent.Completed {
			done = append(done, s)
		}
	}
	if len(done) == 0 {
		return nil
	}
	return cond(corev1.ConditionTrue, CondVerified, done)
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

// conditionPatch returns the patch that makes the agent's own condition
// what want says (a nil entry: the condition is removed), or nil
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
// request the kubelet makes for pod status. deploy/base/nodescope.yaml
// admits it only if it changes nothing but this condition type.
// metadata.uid is a
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

// hasOwnedCondition reports whether the pod carries the agent's condition.
func hasOwnedCondition(pod *corev1.Pod) bool {
	for _, t := range ownedConditions {
		if findCondition(pod, t) != nil {
			return true
		}
	}
	return false
}
