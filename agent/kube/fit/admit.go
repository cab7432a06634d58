package fit

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// allocatedPods is the kubelet's getAllocatedPods seen from the API: the
// active pods but the resized one, each with its spec requests replaced by
// what the kubelet allocated (the kubelet reads its checkpoint; it reports
// the same values in status.containerStatuses[].allocatedResources and,
// from 1.36, status.allocatedResources for pod-level resources).
func allocatedPods(minor int, pods []*corev1.Pod, desired *corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.UID == desired.UID || !active(p) {
			continue
		}
		// 1.37 counts only pods the kubelet has admitted (with an
		// allocation); a pod it has not admitted yet has no container
		// status written by it. Before, every active pod counted, with
		// its spec where it had no allocation.
		if minor >= 37 && len(p.Status.ContainerStatuses)+len(p.Status.InitContainerStatuses) == 0 {
			continue
		}
		out = append(out, allocatedView(minor, p))
	}
	return out
}

// active is the kubelet's filterOutInactivePods from the outside: not in a
// terminal phase, and not deleted with every container stopped.
func active(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	if p.DeletionTimestamp == nil {
		return true
	}
	sts := slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
	return len(sts) == 0 || slices.ContainsFunc(sts, func(s corev1.ContainerStatus) bool { return s.State.Terminated == nil })
}

func allocatedView(minor int, p *corev1.Pod) *corev1.Pod {
	v := p.DeepCopy()
	for _, cs := range [][]corev1.Container{v.Spec.InitContainers, v.Spec.Containers} {
		for i := range cs {
			st := status(v, cs[i].Name)
			if st == nil || st.AllocatedResources == nil {
				continue
			}
			req := cs[i].Resources.Requests.DeepCopy()
			if req == nil {
				req = corev1.ResourceList{}
			}
			for r, q := range st.AllocatedResources {
				req[r] = q.DeepCopy()
			}
			cs[i].Resources.Requests = req
		}
	}
	// Pod-level resources are allocated and resized from 1.36
	// (InPlacePodLevelResourcesVerticalScaling beta).
	if minor >= 36 && resourcehelper.IsPodLevelRequestsSet(v) && v.Status.AllocatedResources != nil {
		for r := range v.Spec.Resources.Requests {
			if q, ok := v.Status.AllocatedResources[r]; ok && resourcehelper.IsSupportedPodLevelResource(r) {
				v.Spec.Resources.Requests[r] = q.DeepCopy()
			}
		}
	}
	return v
}

// amounts are requests in the scheduler's units (framework.Resource).
type amounts map[corev1.ResourceName]int64

func toAmounts(l corev1.ResourceList) amounts {
	a := amounts{}
	for r, q := range l {
		if r == corev1.ResourceCPU {
			a[r] = q.MilliValue()
		} else {
			a[r] = q.Value()
		}
	}
	return a
}

// admit is the predicate admit handler for a resize (lifecycle/predicate.go
// generalFilter, scheduler AdmissionCheck, noderesources fitsRequest): the
// desired pod's whole request against allocatable less the other pods'
// requests. Pods first, then cpu, memory, ephemeral-storage and the scalar
// resources; the kubelet reports the first shortfall.
func admit(minor int, others []*corev1.Pod, desired *corev1.Pod, alloc corev1.ResourceList) *Shortfall {
	capacity := toAmounts(alloc)
	// The pods count is checked whatever the requests.
	if n := int64(len(others)); n+1 > capacity[corev1.ResourcePods] {
		return &Shortfall{Resource: corev1.ResourcePods, Requested: 1, Used: n, Capacity: capacity[corev1.ResourcePods]}
	}
	// The resized pod's request from its spec alone
	// (noderesources computePodResourceRequest); pod-level resources count
	// from 1.34 (PodLevelResources beta).
	want := toAmounts(resourcehelper.PodRequests(desired, resourcehelper.PodResourcesOptions{SkipPodLevelResources: minor < 34}))
	// predicate.go removeMissingExtendedResources: extended resources the
	// node does not list are not the kubelet's to check.
	for r := range want {
		if _, listed := alloc[r]; !listed && extended(r) {
			delete(want, r)
		}
	}
	// The other pods as the scheduler's NodeInfo counts them: the maximum
	// of spec (here: allocated), allocated and actuated (status) requests.
	used := amounts{}
	for _, p := range others {
		for r, v := range toAmounts(resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{
			UseStatusResources: true,
			InPlacePodLevelResourcesVerticalScalingEnabled: minor >= 36,
			SkipPodLevelResources:                          minor < 34,
		})) {
			used[r] += v
		}
	}
	order := []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage}
	var scalars []corev1.ResourceName
	for r := range want {
		if scalar(r) {
			scalars = append(scalars, r)
		}
	}
	slices.Sort(scalars)
	for _, r := range append(order, scalars...) {
		if w := want[r]; w > 0 && w > capacity[r]-used[r] {
			return &Shortfall{Resource: r, Requested: w, Used: used[r], Capacity: capacity[r]}
		}
	}
	return nil
}

// extended is v1helper.IsExtendedResourceName: a qualified name outside the
// kubernetes.io domain and not a quota "requests." name.
func extended(r corev1.ResourceName) bool {
	s := string(r)
	return strings.Contains(s, "/") && !strings.Contains(s, corev1.ResourceDefaultNamespacePrefix) &&
		!strings.HasPrefix(s, corev1.DefaultResourceRequestsPrefix)
}

// scalar is what the scheduler keeps as ScalarResources: hugepages and
// every qualified name (extended, kubernetes.io-prefixed, attachable
// volumes).
func scalar(r corev1.ResourceName) bool {
	s := string(r)
	return strings.HasPrefix(s, corev1.ResourceHugePagesPrefix) || strings.Contains(s, "/") ||
		strings.HasPrefix(s, corev1.ResourceAttachableVolumesPrefix)
}
