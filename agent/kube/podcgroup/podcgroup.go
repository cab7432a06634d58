package podcgroup

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// Values are a pod cgroup's resources in the kubelet's units.
type Values struct {
	QOS corev1.PodQOSClass
	// CPURequest is the pod's CPU request in millicores; the shares come
	// from it (0 for a BestEffort pod: the minimum shares).
	CPURequest int64
	// CPULimit is the pod's CPU limit in millicores; 0: the kubelet sets
	// no quota (cpu.max "max").
	CPULimit int64
	// MemoryLimit is the pod's memory limit in bytes; 0: none
	// (memory.max "max").
	MemoryLimit int64
}

// Shares are the pod cgroup's cpu shares (MilliCPUToShares of the request;
// MinShares for a BestEffort pod).
func (v Values) Shares() uint64 {
	if v.QOS == corev1.PodQOSBestEffort {
		return spec.MinShares
	}
	return spec.MilliCPUToShares(v.CPURequest)
}

// Resources are the files the kubelet leaves in the pod cgroup for v with
// CFS period (µs): cpu.max from the limit ("max" and the kernel's default
// period without one: the kubelet sets no period then), cpu.weight by the
// kubelet's linear rule, memory.max.
func (v Values) Resources(period uint64) spec.Resources {
	cpuMax := spec.CPUMax{Quota: spec.Unlimited, Period: spec.DefaultPeriod}
	if v.CPULimit > 0 {
		cpuMax = spec.CPUMax{Quota: spec.MilliCPUToQuota(v.CPULimit, period), Period: period}
	}
	w := spec.SharesToPodWeight(v.Shares())
	mem := int64(spec.Unlimited)
	if v.MemoryLimit > 0 {
		mem = v.MemoryLimit
	}
	return spec.Resources{CPUMax: &cpuMax, CPUWeight: &w, MemoryMax: &mem}
}

// ForPod is ResourceConfigForPod (pkg/kubelet/cm/helpers_linux.go) for p as
// its spec stands: give it Allocated(p) for what the kubelet allocated.
// Pod-level resources count (PodLevelResources, beta and on from 1.34).
func ForPod(p *corev1.Pod) Values {
	reqs := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	lims := resourcehelper.PodLimits(p, resourcehelper.PodResourcesOptions{})
	// A limit is declared when every container, init containers
	// included, has one (podutil.ContainerIter over InitContainers and
	// Containers in 1.37.2), or the pod level sets it.
	cpuDeclared, memDeclared := true, true
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if c.Resources.Limits.Cpu().IsZero() {
			cpuDeclared = false
		}
		if c.Resources.Limits.Memory().IsZero() {
			memDeclared = false
		}
	}
	if resourcehelper.IsPodLevelResourcesSet(p) {
		cpuDeclared = cpuDeclared || !p.Spec.Resources.Limits.Cpu().IsZero()
		memDeclared = memDeclared || !p.Spec.Resources.Limits.Memory().IsZero()
	}
	v := Values{QOS: QOS(p), CPURequest: reqs.Cpu().MilliValue()}
	switch v.QOS {
	case corev1.PodQOSGuaranteed:
		v.CPULimit, v.MemoryLimit = lims.Cpu().MilliValue(), lims.Memory().Value()
	case corev1.PodQOSBurstable:
		if cpuDeclared {
			v.CPULimit = lims.Cpu().MilliValue()
		}
		if memDeclared {
			v.MemoryLimit = lims.Memory().Value()
		}
	default:
		v.CPURequest = 0
	}
	return v
}

// QOS is the pod's QoS class: status.qosClass, which the API server sets
// at creation and no resize changes, or, without it, the class computed
// the way ComputePodQOS does (pkg/apis/core/helper/qos/qos.go, 1.34-1.37):
// pod-level cpu and memory decide alone when set; otherwise every
// container's, init containers included.
func QOS(p *corev1.Pod) corev1.PodQOSClass {
	if p.Status.QOSClass != "" {
		return p.Status.QOSClass
	}
	var levels []corev1.ResourceRequirements
	if resourcehelper.IsPodLevelResourcesSet(p) {
		levels = append(levels, *p.Spec.Resources)
	} else {
		for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
			levels = append(levels, c.Resources)
		}
	}
	set, guaranteed := false, true
	for _, r := range levels {
		for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			q, hasReq := r.Requests[n]
			l, hasLim := r.Limits[n]
			hasReq, hasLim = hasReq && !q.IsZero(), hasLim && !l.IsZero()
			set = set || hasReq || hasLim
			// The API server defaults a missing request to the limit.
			if !hasLim || (hasReq && q.Cmp(l) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case !set:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// Allocated is p with the resources the kubelet allocated to its
// containers in place of the spec's, the pod ResourceConfigForPod is given
// (the kubelet's allocation manager, UpdatePodFromAllocation): each
// container's CPU and memory from status.containerStatuses[].resources
// (actuated: for a running container what the runtime reports, for
// another the allocation), else its allocatedResources for the requests.
// The pod-level resources stay the spec's: the API shows no allocated
// pod-level values of their own (status.allocatedResources is the pod's
// whole request, PodRequests of the allocated pod, overhead included), and
// status.resources is no reference, since the kubelet reads it back from
// the pod cgroup itself (convertToAPIPodLevelResourcesStatus in
// pkg/kubelet/kubelet_pods.go, 1.36-1.37): it follows a stray write. The
// caller checks the spec's pod-level values against
// status.allocatedResources (Requests) before it trusts them.
func Allocated(p *corev1.Pod) *corev1.Pod {
	a := p.DeepCopy()
	for _, cs := range [][]corev1.Container{a.Spec.InitContainers, a.Spec.Containers} {
		for i := range cs {
			st := status(a, cs[i].Name)
			switch {
			case st == nil:
			case st.Resources != nil:
				cs[i].Resources.Requests = replaced(cs[i].Resources.Requests, st.Resources.Requests)
				cs[i].Resources.Limits = replaced(cs[i].Resources.Limits, st.Resources.Limits)
			case st.AllocatedResources != nil:
				cs[i].Resources.Requests = replaced(cs[i].Resources.Requests, st.AllocatedResources)
			}
		}
	}
	return a
}

// Requests is the pod's whole request as the kubelet reports it in
// status.allocatedResources for its allocated pod (PodRequests: pod-level
// values, overhead, init containers; kubelet_pods.go generateAPIPodStatus).
func Requests(p *corev1.Pod) corev1.ResourceList {
	return resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
}

// replaced is l with its cpu and memory entries those of from (removed
// where from has none).
func replaced(l, from corev1.ResourceList) corev1.ResourceList {
	out := l.DeepCopy()
	if out == nil {
		out = corev1.ResourceList{}
	}
	for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := from[n]; ok {
			out[n] = q.DeepCopy()
		} else {
			delete(out, n)
		}
	}
	return out
}

func status(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, l := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}

// ContainerResources is r, a container's resources in pod p, as the
// kubelet hands them to the runtime: with pod-level resources, a container
// without its own CPU or memory limit gets the pod-level one
// (getCPULimit, getMemoryLimit in
// pkg/kubelet/kuberuntime/kuberuntime_container_linux.go), so that its
// cgroup holds the pod's limit, and its shares, without a request, come
// from that limit (calculateLinuxResources).
func ContainerResources(p *corev1.Pod, r corev1.ResourceRequirements) corev1.ResourceRequirements {
	if !resourcehelper.IsPodLevelResourcesSet(p) {
		return r
	}
	out := *r.DeepCopy()
	for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		own := out.Limits[n]
		pod, ok := p.Spec.Resources.Limits[n]
		if !own.IsZero() || !ok || pod.IsZero() {
			continue
		}
		if out.Limits == nil {
			out.Limits = corev1.ResourceList{}
		}
		out.Limits[n] = pod.DeepCopy()
	}
	return out
}
