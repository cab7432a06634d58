package allocdrift

import (
	"math"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// FileMemoryHigh is compared where the kubelet sets it (MemoryQoS with a
// memoryThrottlingFactor).
const FileMemoryHigh = "memory.high"

// Kubelet is what the check must know of the node's kubelet beyond the
// API: its configuration (agent/kube/kubeletconfig) resolved for its
// release, and the node's allocatable memory.
type Kubelet struct {
	// NoCPUQuota: cpuCFSQuota is false, the kubelet sets no cpu.max quota
	// (calculateLinuxResources; ResourceConfigForPod's enforceCPULimits).
	NoCPUQuota bool
	// MemoryHighFactor is memoryThrottlingFactor where the kubelet sets
	// memory.high from it (MemoryQoS on); 0: memory.high is not compared.
	MemoryHighFactor float64
	// PodLevelResources: the gate is on.
	PodLevelResources bool
	// PodMemoryHigh: the kubelet also sets the pod cgroup's memory.high
	// (ApplyPodLevelMemoryHigh, pkg/kubelet/cm/helpers_linux.go, 1.37).
	PodMemoryHigh bool
	// AllocatableMemory is the node's (bytes): the limit memory.high is
	// taken from for a container without one.
	AllocatableMemory int64
}

// ContainerMemoryHigh is the memory.high the kubelet gives container c
// (its own resources in the spec, the allocation: the pod is settled) of
// pod p under MemoryQoS with k's factor: generateLinuxContainerResources
// in pkg/kubelet/kuberuntime/kuberuntime_container_linux.go (v1.37.2),
// which it calls at creation and at every resize of the container, so the
// file follows the allocation. spec.Unlimited where the kubelet sets none
// (the cgroup keeps "max"); ok false where it is not compared. Memory the
// kubelet adds from DRA claims is not counted.
//
// alt, when not 0, is a second value that is the kubelet's too. A
// container without a memory limit of its own in a pod with a pod-level
// one gets none at creation (the pod cgroup's memory.high throttles it),
// but once the kubelet has resized it, anything of it, CPU included, it
// gets one from the pod's limit: updatePodContainerResources
// (kuberuntime_manager.go) hands generateLinuxContainerResources the
// container with the limit in force (effLimit, the pod's) and its own
// request. Seen on the real node: "max" after creation, 0.8 × 128Mi after
// a CPU resize of the pod, 0.8 × 160Mi after a memory limit resize.
func ContainerMemoryHigh(p *corev1.Pod, c corev1.ResourceRequirements, effLimit int64, k Kubelet, page int64) (high, alt int64, ok bool) {
	if k.MemoryHighFactor <= 0 || page <= 0 {
		return 0, 0, false
	}
	req, lim := c.Requests.Memory().Value(), c.Limits.Memory().Value()
	if lim == 0 && k.PodLevelResources && resourcehelper.IsPodLevelResourcesSet(p) && !p.Spec.Resources.Limits.Memory().IsZero() {
		alt = throttled(req, effLimit, k.MemoryHighFactor, page)
		if alt == spec.Unlimited {
			alt = 0
		}
		return spec.Unlimited, alt, true
	}
	if req == lim && req != 0 {
		return spec.Unlimited, 0, true
	}
	if lim == 0 {
		lim = k.AllocatableMemory
	}
	return throttled(req, lim, k.MemoryHighFactor, page), 0, true
}

// PodMemoryHigh is the memory.high the kubelet 1.37 gives the cgroup of a
// pod with pod-level resources (ApplyPodLevelMemoryHigh), p being the pod
// with its allocation (podcgroup.Allocated): when every container has a memory limit or the pod level
// sets one. ok false where it is not compared.
func PodMemoryHigh(p *corev1.Pod, k Kubelet, page int64) (high int64, ok bool) {
	if k.MemoryHighFactor <= 0 || !k.PodMemoryHigh || !k.PodLevelResources || page <= 0 || !resourcehelper.IsPodLevelResourcesSet(p) {
		return 0, false
	}
	declared := true
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if c.Resources.Limits.Memory().IsZero() {
			declared = false
		}
	}
	if !p.Spec.Resources.Limits.Memory().IsZero() {
		declared = true
	}
	if !declared {
		return spec.Unlimited, true
	}
	reqs := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	lims := resourcehelper.PodLimits(p, resourcehelper.PodResourcesOptions{})
	req, lim := reqs.Memory().Value(), lims.Memory().Value()
	if (req == lim && req != 0) || lim == 0 {
		return spec.Unlimited, true
	}
	return throttled(req, lim, k.MemoryHighFactor, page), true
}

// throttled is KEP-2570's floor((request + factor × (limit − request)) /
// page) × page, or spec.Unlimited where that is not above the request.
func throttled(req, lim int64, factor float64, page int64) int64 {
	if lim <= 0 {
		return spec.Unlimited
	}
	h := int64(math.Floor((float64(req)+(float64(lim)-float64(req))*factor)/float64(page))) * page
	if h <= 0 || h <= req {
		return spec.Unlimited
	}
	return h
}
