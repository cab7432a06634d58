package allocdrift

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
	"github.com/resizer/resize-agent/cri"
)

// Expected is what the container's cgroup holds when the kubelet has
// actuated res with CFS period (µs): calculateLinuxResources in
// kubernetes pkg/kubelet/kuberuntime/kuberuntime_container_linux.go
// (1.33-1.37) gives the runtime shares from the CPU request (from the
// limit when there is no request), a quota from the CPU limit and the
// memory limit; runc turns the shares into cpu.weight with its own
// formula (spec.SharesToWeight) and a zero quota or limit into "max".
func Expected(res corev1.ResourceRequirements, period uint64) spec.Resources {
	req, lim := res.Requests.Cpu().MilliValue(), res.Limits.Cpu().MilliValue()
	shares := spec.MilliCPUToShares(req)
	if req == 0 && lim != 0 {
		shares = spec.MilliCPUToShares(lim)
	}
	weight := spec.SharesToWeight(shares)
	mem := spec.Unlimited
	if m := res.Limits.Memory().Value(); m > 0 {
		mem = m
	}
	return spec.Resources{
		CPUMax:    &spec.CPUMax{Quota: spec.MilliCPUToQuota(lim, period), Period: period},
		CPUWeight: &weight,
		MemoryMax: &mem,
	}
}

// RuntimeResources is the UpdateContainerResources the kubelet sends for res
// (calculateLinuxResources), with "no limit" made explicit as -1, which
// containerd passes on and runc writes as max: a restore must put back a
// limit a stray write added, where the kubelet's 0 would leave it.
func RuntimeResources(res corev1.ResourceRequirements, period uint64) cri.Resources {
	want := Expected(res, period)
	req, lim := res.Requests.Cpu().MilliValue(), res.Limits.Cpu().MilliValue()
	shares := spec.MilliCPUToShares(req)
	if req == 0 && lim != 0 {
		shares = spec.MilliCPUToShares(lim)
	}
	return cri.Resources{
		CPUPeriod: int64(period), CPUQuota: want.CPUMax.Quota,
		CPUShares: int64(shares), MemoryLimit: *want.MemoryMax,
	}
}

// File is one cgroup file that does not hold the kubelet's value.
type File struct {
	File     string `json:"file"`
	Expected string `json:"expected"`
	Found    string `json:"found"`
}

func (f File) String() string { return f.File + " " + f.Found + " (the kubelet's " + f.Expected + ")" }

// Differ lists the files of want that st does not hold (memory.max
// allowing for the kernel's rounding to whole pages).
func Differ(st spec.State, want spec.Resources, pageSize int64) []File {
	var out []File
	for _, v := range want.Values() {
		if st.Matches(want.Only(v.File), pageSize) {
			continue
		}
		f := File{File: v.File, Expected: v.Data}
		switch v.File {
		case spec.FileCPUMax:
			f.Found = st.CPUMax.String()
		case spec.FileCPUWeight:
			f.Found = strconv.FormatUint(st.CPUWeight, 10)
		default:
			f.Found = spec.FormatMax(st.MemoryMax)
		}
		out = append(out, f)
	}
	return out
}

// resources are the metric's resource labels of files.
func resources(files []File) []string {
	var out []string
	for _, f := range files {
		r := "cpu"
		if strings.HasPrefix(f.File, "memory") {
			r = "memory"
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// AltWeight is the other cpu.weight the kubelet gives a container with res
// (its own resources, as the status reports them) in pod p, or 0. A
// container without a CPU request of its own in a pod with a pod-level CPU
// limit gets shares from that limit when it is created (the request is
// absent: calculateLinuxResources takes the limit), but the minimum shares
// once the kubelet has resized it (updatePodContainerResources sends an
// explicit 0 request; pkg/kubelet/kuberuntime/kuberuntime_manager.go,
// v1.37.2, seen on the real node after a pod-level resize). Both are the
// kubelet's.
func AltWeight(p *corev1.Pod, res corev1.ResourceRequirements) uint64 {
	eff := podcgroup.ContainerResources(p, res)
	if !res.Requests.Cpu().IsZero() || eff.Limits.Cpu().IsZero() {
		return 0
	}
	return spec.SharesToWeight(spec.MinShares)
}

// PodExpected is what the pod's own cgroup holds when the kubelet has
// actuated its allocation with CFS period (µs): ResourceConfigForPod
// (pkg/kubelet/cm/helpers_linux.go) over the pod with the allocated and
// actuated resources its status reports (podcgroup.Allocated), with
// pod-level resources, overhead and init containers counted the kubelet's
// way, and the shares turned into cpu.weight by the kubelet's linear rule.
func PodExpected(p *corev1.Pod, period uint64) spec.Resources {
	return podcgroup.ForPod(podcgroup.Allocated(p)).Resources(period)
}
