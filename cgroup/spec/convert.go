package spec

import "math"

// The CPU conversions below follow the kubelet, which computes these values
// before it hands them to the runtime:
//   - kubernetes/kubernetes pkg/kubelet/cm/helpers_linux.go
//     (MilliCPUToQuota, MilliCPUToShares and their constants), and
//   - pkg/kubelet/kuberuntime/helpers_linux.go (milliCPUToQuota).
//
// They are written out here because k8s.io/kubernetes is not meant to be
// imported as a library. The shares-to-weight step of a container is runc's: the quadratic
// formula of opencontainers/cgroups v0.0.5 that runc 1.3.2+ and 1.4 use, as
// containerd/cgroups carries it (cgroup2.ConvertCPUSharesToCgroupV2Value).
const (
	MinShares      = 2       // kubelet MinShares
	MaxShares      = 262144  // kubelet MaxShares
	SharesPerCPU   = 1024    // kubelet SharesPerCPU
	MilliCPUToCPU  = 1000    // kubelet MilliCPUToCPU
	DefaultPeriod  = 100000  // kubelet QuotaPeriod, in microseconds
	MinQuotaPeriod = 1000    // kubelet MinQuotaPeriod: the smallest quota, 1ms
	MinPeriod      = 1000    // kernel: cpu.max period lower bound (1ms)
	MaxPeriod      = 1000000 // kernel: cpu.max period upper bound (1s)
)

// MilliCPUToQuota converts a CPU limit in millicores to a CFS quota for the
// given period, in microseconds. Zero means no limit and yields Unlimited.
func MilliCPUToQuota(milliCPU int64, period uint64) int64 {
	if milliCPU <= 0 {
		return Unlimited
	}
	quota := milliCPU * int64(period) / MilliCPUToCPU
	if quota < MinQuotaPeriod {
		quota = MinQuotaPeriod
	}
	return quota
}

// MilliCPUToShares converts a CPU request in millicores to cgroup v1 shares,
// clamped to [MinShares, MaxShares]. Zero gives MinShares, as the kubelet does.
func MilliCPUToShares(milliCPU int64) uint64 {
	if milliCPU <= 0 {
		return MinShares
	}
	shares := milliCPU * SharesPerCPU / MilliCPUToCPU
	switch {
	case shares < MinShares:
		return MinShares
	case shares > MaxShares:
		return MaxShares
	}
	return uint64(shares)
}

// SharesToWeight converts cgroup v1 shares to a cgroup v2 cpu.weight the way
// current runc does. It is written out rather than called from
// containerd/cgroups because that package links dbus, protobuf and
// cilium/ebpf, which this leaf package keeps away from API clients; package
// cgroup's tests hold it equal to the library's function for every share
// value.
func SharesToWeight(shares uint64) uint64 {
	switch {
	case shares == 0:
		return 0 // unset
	case shares <= MinShares:
		return 1
	case shares >= MaxShares:
		return 10000
	}
	l := math.Log2(float64(shares))
	// A quadratic in log2(shares) through (2, 1), (1024, 100), (262144, 10000).
	return uint64(math.Ceil(math.Pow(10, (l*l+125*l)/612.0-7.0/34.0)))
}

// MilliCPUToWeight is MilliCPUToShares followed by SharesToWeight: the
// cpu.weight a container with this CPU request gets from kubelet + runc.
func MilliCPUToWeight(milliCPU int64) uint64 {
	return SharesToWeight(MilliCPUToShares(milliCPU))
}

// SharesToPodWeight converts shares to cpu.weight the way the kubelet does
// for the cgroups it writes itself (pod and QoS cgroups): a linear map of
// [2, 262144] onto [1, 10000], rounded down (getCPUWeight in kubernetes
// pkg/kubelet/cm/cgroup_manager_linux.go, releases 1.31 to 1.37, which
// hands libcontainer a CpuWeight so that runc's own conversion is not
// applied). A container's cgroup gets runc's SharesToWeight instead, since
// the kubelet passes shares to the runtime there; 1 CPU of requests is 39
// on a pod cgroup and 100 on a container's.
func SharesToPodWeight(shares uint64) uint64 {
	switch {
	case shares == 0:
		return 0 // unset
	case shares <= MinShares:
		return 1
	case shares >= MaxShares:
		return 10000
	}
	return 1 + (shares-MinShares)*9999/(MaxShares-MinShares)
}

// MilliCPUToPodWeight is the cpu.weight the kubelet writes to a pod cgroup
// whose containers request milliCPU in all (ResourceConfigForPod's shares,
// then SharesToPodWeight).
func MilliCPUToPodWeight(milliCPU int64) uint64 {
	return SharesToPodWeight(MilliCPUToShares(milliCPU))
}
