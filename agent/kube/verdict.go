package kube

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/intent"
)

// verdict is what the kubelet says, on the pod, of one container's resize.
type verdict struct {
	State   intent.State
	Reason  string
	Message string
	// Actuated: no resize condition is left and the container's status
	// shows the resources asked for (allocated and actual); the caller
	// checks the cgroup files before it calls the intent Completed.
	Actuated bool
}

// Reasons of followed intents (intent.Status.Reason), beside the kubelet's
// own Deferred, Infeasible and Error which are passed on as they are.
const (
	// ReasonPatched: the pods/resize patch was admitted; the kubelet has
	// not answered yet.
	ReasonPatched = "Patched"
	// ReasonPatchRefused: the API server refused the pods/resize patch
	// (RBAC, ResourceQuota, LimitRange, PodResizeValidator, validation).
	ReasonPatchRefused = "PatchRefused"
	// ReasonKubeletResizing: PodResizeInProgress without an error.
	ReasonKubeletResizing = "KubeletResizing"
	// ReasonVerified: the kubelet reports the resources and the agent read
	// them back from the container's cgroup files.
	ReasonVerified = "Verified"
	// ReasonNotVerified: the kubelet reports the resources but the cgroup
	// files hold something else (or could not be read).
	ReasonNotVerified = "CgroupNotVerified"
	// ReasonSpecChanged: the pod's spec no longer asks for these resources
	// (another resize came after).
	ReasonSpecChanged = "SpecChanged"
)

// kubeletVerdict reads the kubelet's verdict on a resize of container ctr
// to want, patched at generation gen, from the pod. What the kubelet 1.33+
// writes (kubernetes pkg/kubelet/status/status_manager.go
// SetPodResizePendingCondition, SetPodResizeInProgressCondition;
// pkg/kubelet/kubelet_pods.go generateAPIPodStatus;
// pkg/kubelet/kuberuntime/kuberuntime_manager.go, which reports a failed
// actuation as PodResizeInProgress with reason Error):
//
//   - PodResizePending, reason Infeasible or Deferred, with its message:
//     the resize is not admitted (yet);
//   - PodResizeInProgress: admitted and being actuated; with reason Error
//     and a message, the actuation failed (the kubelet retries);
//   - neither, and status.containerStatuses[].allocatedResources and
//     .resources equal to the spec: done.
//
// A condition whose observedGeneration (1.34+) is older than gen is about
// an earlier spec and is not taken as the answer to this resize.
func kubeletVerdict(pod *corev1.Pod, ctr string, want corev1.ResourceRequirements, gen int64) verdict {
	current := func(c *corev1.PodCondition) bool {
		return c != nil && c.Status == corev1.ConditionTrue && (c.ObservedGeneration == 0 || c.ObservedGeneration >= gen)
	}
	if c := findCondition(pod, corev1.PodResizePending); current(c) {
		switch c.Reason {
		case corev1.PodReasonInfeasible:
			return verdict{State: intent.Infeasible, Reason: intent.ReasonInfeasible, Message: "kubelet: " + c.Message}
		default:
			// Any other reason is Deferred (SetPodResizePendingCondition).
			return verdict{State: intent.Deferred, Reason: intent.ReasonDeferred, Message: "kubelet: " + c.Message}
		}
	}
	if c := findCondition(pod, corev1.PodResizeInProgress); current(c) {
		if c.Reason == corev1.PodReasonError {
			return verdict{State: intent.Failed, Reason: corev1.PodReasonError, Message: "kubelet: " + c.Message}
		}
		return verdict{State: intent.InProgress, Reason: ReasonKubeletResizing, Message: "the kubelet is resizing the container"}
	}
	st := containerStatus(pod, ctr)
	if st == nil || st.Resources == nil {
		return verdict{State: intent.Proposed, Reason: ReasonPatched, Message: "waiting for the kubelet: no status of the container's resources yet"}
	}
	w := toResources(want)
	if a := toResources(corev1.ResourceRequirements{Requests: st.AllocatedResources}); st.AllocatedResources != nil &&
		(a.CPURequest != w.CPURequest || a.MemoryRequest != w.MemoryRequest) {
		return verdict{State: intent.Proposed, Reason: ReasonPatched, Message: fmt.Sprintf("waiting for the kubelet: allocated %s", describe(corev1.ResourceRequirements{Requests: st.AllocatedResources}))}
	}
	if got := toResources(*st.Resources); got != w {
		return verdict{State: intent.Proposed, Reason: ReasonPatched, Message: "waiting for the kubelet: status shows " + describe(*st.Resources)}
	}
	return verdict{State: intent.InProgress, Reason: ReasonKubeletResizing, Message: "the kubelet reports " + describe(*st.Resources), Actuated: true}
}

func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, l := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}

// specOf is the container's cpu and memory requirements in the pod's spec,
// normalized as Desired's (fromSpec without an annotation).
func specOf(pod *corev1.Pod, name string) (corev1.ResourceRequirements, bool) {
	c, ok := resizable(pod)[name]
	if !ok {
		return corev1.ResourceRequirements{}, false
	}
	rr, _ := fromSpec(c.Resources, nil)
	return rr, true
}
