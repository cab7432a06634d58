package main

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// Verdicts. The kubelet's four are read from the pod as the kubelet 1.37
// reports them:
//   - pkg/kubelet/allocation/allocation_manager.go handlePodResourcesResize:
//     a resize it cannot admit gets PodResizePending with the admit
//     handler's reason; pkg/kubelet/status/status_manager.go
//     SetPodResizePendingCondition keeps Infeasible and turns every other
//     reason (OutOfcpu, OutOfmemory, ...) into Deferred, with the
//     handler's message and the pod's generation as observedGeneration.
//     Infeasible comes from allocation/handlers.go (swap, static CPU or
//     memory manager with a Guaranteed pod, memory-backed volumes, gates).
//   - A resize it admits: allocated, PodResizePending cleared,
//     PodResizeInProgress set (no reason) with the pod's generation.
//   - pkg/kubelet/kubelet.go SyncPod: a ResizePodInPlace action that fails
//     sets PodResizeInProgress reason Error with the runtime's message; the
//     condition keeps the generation it was set with.
//   - Once actuated (allocated == actual), kubelet.go SyncPod clears
//     PodResizeInProgress (and records the ResizeCompleted event), and
//     status.containerStatuses[].resources report the new values.
const (
	Completed  = "Completed"
	Deferred   = "Deferred"
	Infeasible = "Infeasible"
	Error      = "Error"
	Refused    = "Refused"  // the API server refused the patch
	Accepted   = "Accepted" // --wait=false: the spec changed, no verdict awaited
	Timeout    = "Timeout"  // no verdict within --timeout
)

// exitCode maps a verdict onto resizectl's exit codes.
func exitCode(v string) int {
	switch v {
	case Completed, Deferred, Accepted:
		return exitOK
	case Infeasible, Error:
		return exitOutcome
	}
	return exitError
}

// reading is what the pod says about the resize of one generation.
type reading struct {
	verdict string // "" while undecided
	reason  string
	message string
	status  *corev1.ContainerStatus
	state   string // while undecided: what it waits for, for a timeout
}

// readVerdict reads the kubelet's verdict on the resize that made
// generation gen, for container t with the wanted values.
func readVerdict(p *corev1.Pod, gen int64, t target, want []change) reading {
	var r reading
	statuses := p.Status.ContainerStatuses
	if t.sidecar {
		statuses = p.Status.InitContainerStatuses
	}
	for i := range statuses {
		if statuses[i].Name == t.name {
			r.status = &statuses[i]
		}
	}
	// A condition set for an older generation is about an older resize
	// (a kubelet before 1.34 sets no observedGeneration: take it as ours).
	current := func(c corev1.PodCondition) bool { return c.ObservedGeneration == 0 || c.ObservedGeneration >= gen }
	var inProgress bool
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue || !current(c) {
			continue
		}
		switch c.Type {
		case corev1.PodResizePending:
			v := Deferred
			if c.Reason == corev1.PodReasonInfeasible {
				v = Infeasible
			}
			return reading{verdict: v, reason: c.Reason, message: c.Message, status: r.status}
		case corev1.PodResizeInProgress:
			if c.Reason == corev1.PodReasonError {
				return reading{verdict: Error, reason: c.Reason, message: c.Message, status: r.status}
			}
			inProgress = true
		}
	}
	switch {
	case inProgress:
		r.state = "the kubelet is actuating it (PodResizeInProgress)"
	case p.Status.ObservedGeneration != 0 && p.Status.ObservedGeneration < gen:
		r.state = fmt.Sprintf("the kubelet has not seen generation %d yet (status.observedGeneration %d)", gen, p.Status.ObservedGeneration)
	case r.status == nil || r.status.Resources == nil:
		r.state = "the kubelet reports no resources for the container yet"
	default:
		if diff := mismatch(*r.status.Resources, want); diff != "" {
			r.state = "status.containerStatuses[].resources: " + diff
		} else {
			r.verdict = Completed
		}
	}
	return r
}

// mismatch says which wanted value the reported resources do not show yet.
func mismatch(got corev1.ResourceRequirements, want []change) string {
	for _, c := range want {
		l, kind := got.Requests, "requests"
		if c.limit {
			l, kind = got.Limits, "limits"
		}
		q, ok := l[c.resource]
		if !ok {
			return fmt.Sprintf("%s.%s not reported, want %s", kind, c.resource, c.value.String())
		}
		if q.Cmp(c.value) != 0 {
			return fmt.Sprintf("%s.%s is %s, want %s", kind, c.resource, q.String(), c.value.String())
		}
	}
	return ""
}
