package latency

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
)

// expected is what a container's cgroup files hold for its resources: what
// the kubelet hands runc (shares and quota from kuberuntime's
// calculateLinuxResources, pkg/kubelet/kuberuntime/kuberuntime_container_linux.go)
// and runc writes (cpu.weight from the shares by runc's conversion).
type expected struct {
	milliCPU int64 // the limit; 0: none (cpu.max "max")
	weight   uint64
	memory   int64 // the limit in bytes; 0: none
}

func expect(r corev1.ResourceRequirements) expected {
	var e expected
	if q, ok := r.Limits[corev1.ResourceCPU]; ok {
		e.milliCPU = q.MilliValue()
	}
	req := r.Requests[corev1.ResourceCPU]
	e.weight = cgroup.MilliCPUToWeight(req.MilliValue())
	if q, ok := r.Limits[corev1.ResourceMemory]; ok {
		e.memory = q.Value()
	}
	return e
}

// mismatch says which file does not hold e; "" when all do. The quota is
// computed for the period the file has, and memory.max is compared after
// the kernel's rounding down to a page.
func (e expected) mismatch(s cgroup.State, pageSize int64) string {
	var bad []string
	wantQuota := int64(cgroup.Unlimited)
	if e.milliCPU > 0 {
		wantQuota = cgroup.MilliCPUToQuota(e.milliCPU, s.CPUMax.Period)
	}
	if s.CPUMax.Quota != wantQuota {
		bad = append(bad, fmt.Sprintf("cpu.max %s (want quota %s)", s.CPUMax, maxString(wantQuota)))
	}
	if s.CPUWeight != e.weight {
		bad = append(bad, fmt.Sprintf("cpu.weight %d (want %d)", s.CPUWeight, e.weight))
	}
	wantMem := int64(cgroup.Unlimited)
	if e.memory > 0 {
		wantMem = e.memory
		if pageSize > 0 {
			wantMem -= wantMem % pageSize
		}
	}
	if s.MemoryMax != wantMem {
		bad = append(bad, fmt.Sprintf("memory.max %s (want %s)", maxString(s.MemoryMax), maxString(wantMem)))
	}
	return strings.Join(bad, ", ")
}

func maxString(v int64) string {
	if v == cgroup.Unlimited {
		return "max"
	}
	return fmt.Sprint(v)
}

// podMismatch says which file of the pod cgroup does not hold what the
// kubelet writes for v; "" when all do. The quota is computed for the
// period the file has.
func podMismatch(v podcgroup.Values, s cgroup.State, pageSize int64) string {
	want := v.Resources(s.CPUMax.Period)
	var bad []string
	if s.CPUMax.Quota != want.CPUMax.Quota {
		bad = append(bad, fmt.Sprintf("cpu.max %s (want quota %s)", s.CPUMax, maxString(want.CPUMax.Quota)))
	}
	if s.CPUWeight != *want.CPUWeight {
		bad = append(bad, fmt.Sprintf("cpu.weight %d (want %d)", s.CPUWeight, *want.CPUWeight))
	}
	if m := spec.PageAlign(*want.MemoryMax, pageSize); s.MemoryMax != m {
		bad = append(bad, fmt.Sprintf("memory.max %s (want %s)", maxString(s.MemoryMax), maxString(m)))
	}
	return strings.Join(bad, ", ")
}

// podReported says whether the pod's status.resources reports the
// pod-level resources want. The kubelet fills it from the pod cgroup's
// config (CPURequestsFromConfig, CPULimitsFromConfig,
// MemoryLimitsFromConfig in pkg/kubelet/cm/helpers_linux.go), so CPU is
// compared as shares and quota, not as the spec's quantity: 1m comes back
// as 2m. The memory request has no cgroup file and is not compared.
func podReported(st *corev1.ResourceRequirements, want corev1.ResourceRequirements) bool {
	if st == nil {
		return false
	}
	if q, ok := want.Requests[corev1.ResourceCPU]; ok {
		got, ok := st.Requests[corev1.ResourceCPU]
		if !ok || cgroup.MilliCPUToShares(got.MilliValue()) != cgroup.MilliCPUToShares(q.MilliValue()) {
			return false
		}
	}
	if q, ok := want.Limits[corev1.ResourceCPU]; ok {
		got, ok := st.Limits[corev1.ResourceCPU]
		if !ok || cgroup.MilliCPUToQuota(got.MilliValue(), cgroup.DefaultPeriod) != cgroup.MilliCPUToQuota(q.MilliValue(), cgroup.DefaultPeriod) {
			return false
		}
	}
	if q, ok := want.Limits[corev1.ResourceMemory]; ok {
		got, ok := st.Limits[corev1.ResourceMemory]
		if !ok || got.Value() != q.Value() {
			return false
		}
	}
	return true
}

// podCandidates are the pod cgroup's paths for both cgroup drivers, with
// the kubelet's cgroupRoot "/": the parents of candidates.
func podCandidates(podUID string, qos corev1.PodQOSClass) []string {
	var out []string
	for _, c := range candidates(podUID, qos, "containerd://x") {
		out = append(out, path.Dir(c))
	}
	return out
}

// candidates are the cgroups where the kubelet and the runtime put a
// container, for both cgroup drivers with the kubelet's cgroupRoot "/"
// (pkg/kubelet/cm/pod_container_manager_linux.go names the pod cgroup,
// containerd's and CRI-O's CRI plugins the container's leaf under it).
// Empty when the container ID is not runtime://id.
func candidates(podUID string, qos corev1.PodQOSClass, containerID string) []string {
	runtime, id, ok := strings.Cut(containerID, "://")
	if !ok || id == "" || strings.ContainsAny(id, "/.") || podUID == "" || strings.ContainsAny(podUID, "/.") {
		return nil
	}
	scope := "cri-containerd-" + id + ".scope"
	if runtime == "cri-o" {
		scope = "crio-" + id + ".scope"
	}
	uid := strings.ReplaceAll(podUID, "-", "_")
	var fsParent, sdParent string
	switch qos {
	case corev1.PodQOSGuaranteed:
		fsParent = "/kubepods/pod" + podUID
		sdParent = "/kubepods.slice/kubepods-pod" + uid + ".slice"
	case corev1.PodQOSBestEffort:
		fsParent = "/kubepods/besteffort/pod" + podUID
		sdParent = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uid + ".slice"
	default:
		fsParent = "/kubepods/burstable/pod" + podUID
		sdParent = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice"
	}
	return []string{sdParent + "/" + scope, fsParent + "/" + id}
}
