package actuate

import (
	"context"
	"math"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// Member is one managed container of a pod, as the pod's cgroup sums it.
type Member struct {
	RuntimeID string // "" for a bare cgroup
	Resources intent.Resources
	// CPU and Memory say which resources an intent has declared; the agent
	// writes only the files of declared resources.
	CPU, Memory bool
}

// ContainerFiles is what a container's cgroup at path must hold for r, of
// the declared resources (cpu, mem): what apply writes, verification checks
// and the drift check compares with.
func (x *Actuator) ContainerFiles(path string, r intent.Resources, cpu, mem bool) cgroup.Resources {
	return x.stored(path, r.Cgroup(x.Period, cpu, mem))
}

// PodFiles is what the pod cgroup at path must hold: the kubelet's sum
// (podResources) over its managed members and the running containers the
// runtime lists for podUID that are not managed (listed), for the resources
// any member declares. A pod cgroup summed over the managed containers
// alone would throttle the others.
func (x *Actuator) PodFiles(path, podUID string, members []Member, listed []cri.Container) cgroup.Resources {
	var cpu, mem bool
	for _, m := range members {
		cpu, mem = cpu || m.CPU, mem || m.Memory
	}
	sum := podResources(podSum(podUID, members, listed))
	r := sum.Cgroup(x.Period, cpu, mem)
	if r.CPUWeight != nil {
		// The kubelet's own conversion, not runc's (spec.SharesToPodWeight).
		w := cgroup.MilliCPUToPodWeight(sum.CPURequest)
		r.CPUWeight = &w
	}
	return x.stored(path, r)
}

// podSum lists the resources the pod cgroup sums over: the members', and
// those of the listed containers of the pod that are not members, by what
// the runtime reports of them.
func podSum(podUID string, members []Member, listed []cri.Container) []intent.Resources {
	managed := map[string]bool{}
	all := make([]intent.Resources, 0, len(members)+len(listed))
	for _, m := range members {
		managed[m.RuntimeID] = true
		all = append(all, m.Resources)
	}
	for _, o := range listed {
		if !managed[o.ID] && o.PodUID == podUID {
			all = append(all, FromRuntime(o.Resources))
		}
	}
	return all
}

// podResources is the pod-level cgroup for these containers, as the kubelet
// computes it (pkg/kubelet/cm/helpers_linux.go, ResourceConfigForPod):
// cpu.weight from the sum of the CPU requests; cpu.max from the sum of the
// CPU limits, but only when every container has one; memory.max likewise.
func podResources(containers []intent.Resources) intent.Resources {
	var sum intent.Resources
	cpuLimited, memLimited := true, true
	for _, r := range containers {
		sum.CPURequest += r.CPURequest
		sum.CPULimit += r.CPULimit
		sum.MemoryLimit += r.MemoryLimit
		cpuLimited = cpuLimited && r.CPULimit > 0
		memLimited = memLimited && r.MemoryLimit > 0
	}
	if !cpuLimited {
		sum.CPULimit = 0
	}
	if !memLimited {
		sum.MemoryLimit = 0
	}
	return sum
}

// criResources is what the kubelet sends the runtime for these resources
// (pkg/kubelet/kuberuntime/kuberuntime_container_linux.go,
// calculateLinuxResources): shares from the CPU request, quota and period
// from the limit, the memory limit; "no limit" is 0 for both, as the
// kubelet's milliCPUToQuota and its memory limit leave it, so that the
// runtime's record of the container is a kubelet-driven node's. Fields of a
// resource not being changed are 0 too: the runtime leaves them as they
// are (a limit is never removed in place: see the agent's admission).
func criResources(r intent.Resources, cpu, mem bool, period uint64) cri.Resources {
	var out cri.Resources
	if cpu {
		out.CPUPeriod = int64(period)
		if r.CPULimit > 0 {
			out.CPUQuota = cgroup.MilliCPUToQuota(r.CPULimit, period)
		}
		out.CPUShares = int64(cgroup.MilliCPUToShares(r.CPURequest))
	}
	if mem && r.MemoryLimit > 0 {
		out.MemoryLimit = r.MemoryLimit
	}
	return out
}

// FromRuntime is what a runtime's record of a container's resources says
// of its requests and limits: the inverse of criResources, the CPU request
// rounded up as the kubelet's sharesToMilliCPU
// (pkg/kubelet/kuberuntime/helpers_linux.go) reads it. Memory requests do
// not reach the runtime and stay 0; they do not enter the pod cgroup.
func FromRuntime(r cri.Resources) intent.Resources {
	var out intent.Resources
	if r.CPUQuota > 0 && r.CPUPeriod > 0 {
		out.CPULimit = r.CPUQuota * 1000 / r.CPUPeriod
	}
	if r.CPUShares > cgroup.MinShares { // the kubelet's floor, for no request
		out.CPURequest = (r.CPUShares*1000 + cgroup.SharesPerCPU - 1) / cgroup.SharesPerCPU
	}
	if r.MemoryLimit > 0 {
		out.MemoryLimit = r.MemoryLimit
	}
	return out
}

// RuntimeDiffers reports, per resource, whether giving a container want
// changes what the runtime reports for it (CRI ContainerStatus resources:
// cpu_shares, cpu_quota/cpu_period; memory_limit_in_bytes), which is what
// the kubelet judges a resize by when it decides to restart a container
// for a RestartContainer policy (computePodResizeAction compares the
// desired shares, quota and memory limit with the container's status).
// The memory request does not reach the runtime and is not judged here.
func RuntimeDiffers(reported cri.Resources, want intent.Resources, period uint64) (cpu, mem bool) {
	w := criResources(want, true, true, period)
	shares := func(v int64) int64 { return max(v, cgroup.MinShares) }
	limited := func(q, p int64) bool { return q > 0 && p > 0 }
	switch {
	case shares(w.CPUShares) != shares(reported.CPUShares):
		cpu = true
	case limited(w.CPUQuota, w.CPUPeriod) != limited(reported.CPUQuota, reported.CPUPeriod):
		cpu = true
	case limited(w.CPUQuota, w.CPUPeriod):
		// The same rate on another period is the same limit.
		cpu = w.CPUQuota*reported.CPUPeriod != reported.CPUQuota*w.CPUPeriod
	}
	return cpu, max(w.MemoryLimit, 0) != max(reported.MemoryLimit, 0)
}

// storer is the optional part of Cgroups that says what the files will hold
// once r is written to a path: with the systemd driver, CPU quotas rounded
// up to whole 10 ms per second as systemd (and runc) store them.
// *cgroup.Manager has it.
type storer interface {
	Stored(path string, r cgroup.Resources) cgroup.Resources
}

// stored is what path's files will hold once r is written there, so that
// comparisons with the files (no change, verification, drift) are not
// fooled by the driver's rounding.
func (x *Actuator) stored(path string, r cgroup.Resources) cgroup.Resources {
	if s, ok := x.Cgroups.(storer); ok {
		return s.Stored(path, r)
	}
	return r
}

// podLister is the optional part of a Runtime that lists a pod's
// containers; *cri.Client has it.
type podLister interface {
	PodContainers(ctx context.Context, podUID string) ([]cri.Container, error)
}

// PodContainers lists the running containers of a pod as the runtime
// reports them, for PodFiles. It is nil, nil without a runtime that lists
// pods or without a pod UID: the pod cgroup then follows the managed
// containers only.
func (x *Actuator) PodContainers(ctx context.Context, podUID string) ([]cri.Container, error) {
	pl, ok := x.Runtime.(podLister)
	if !ok || podUID == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, runtimeTimeout)
	defer cancel()
	return pl.PodContainers(ctx, podUID)
}

// DefaultMemoryThrottlingFactor is the kubelet's memoryThrottlingFactor
// that KEP-2570 documents (0.9; the kubelet's default until 1.36, nil, which
// sets no memory.high, since).
const DefaultMemoryThrottlingFactor = 0.9

// KubeletMemoryHigh is the memory.high the kubelet gives a container under
// MemoryQoS for its memory request and limit: floor((request + factor ×
// (limit − request)) / page) × page, when the request is not the limit (or
// is 0) and the result is above the request (generateLinuxContainerResources
// in pkg/kubelet/kuberuntime/kuberuntime_container_linux.go, 1.27 to 1.37).
// cri.MemoryHighMax when the kubelet sets none for it, which leaves the
// cgroup's max; 0 for a container without a limit, for which the kubelet
// takes the node's allocatable memory that the agent does not know: its
// memory.high is then left as it is.
func KubeletMemoryHigh(request, limit, page int64, factor float64) int64 {
	if limit <= 0 || page <= 0 {
		return 0
	}
	if request == limit && request != 0 {
		return cri.MemoryHighMax
	}
	high := int64(math.Floor((float64(request)+(float64(limit)-float64(request))*factor)/float64(page))) * page
	if high <= request || high == 0 {
		return cri.MemoryHighMax
	}
	return high
}

// runtimeResources is what an update through the runtime sends for r:
// criResources, and, for a container whose runtime record holds the
// kubelet's MemoryQoS memory.high, the memory.high the kubelet would set
// for r, so that a new memory.max is not held at the old memory.high (see
// cri.Resources.MemoryHigh).
func (x *Actuator) runtimeResources(j *Job, r intent.Resources, cpu, mem bool) cri.Resources {
	out := criResources(r, cpu, mem, x.Period)
	if mem && j.KubeletMemoryHigh {
		f := x.MemoryThrottlingFactor
		if f <= 0 {
			f = DefaultMemoryThrottlingFactor
		}
		out.MemoryHigh = KubeletMemoryHigh(r.MemoryRequest, r.MemoryLimit, x.Cgroups.PageSize(), f)
	}
	return out
}
