package cgroup_test

import (
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
)

// Values from the kubelet's own tables (pkg/kubelet/cm/helpers_linux_test.go,
// TestMilliCPUToQuota and TestMilliCPUToShares) and runc's
// (opencontainers/cgroups utils_test.go, TestConvertCPUSharesToCgroupV2Value).
func TestMilliCPUToQuota(t *testing.T) {
	for _, tc := range []struct {
		milli  int64
		period uint64
		quota  int64
	}{
		{0, 100000, cgroup.Unlimited},
		{5, 100000, 1000}, // below the 1ms minimum
		{9, 100000, 1000},
		{10, 100000, 1000},
		{200, 100000, 20000},
		{500, 100000, 50000},
		{1000, 100000, 100000},
		{1500, 100000, 150000},
		{1500, 50000, 75000},
		{2000, 100000, 200000},
		{10, 1000000, 10000},
		{1, 20000, 1000},
	} {
		if got := cgroup.MilliCPUToQuota(tc.milli, tc.period); got != tc.quota {
			t.Errorf("MilliCPUToQuota(%d, %d) = %d, want %d", tc.milli, tc.period, got, tc.quota)
		}
	}
}

func TestMilliCPUToShares(t *testing.T) {
	for _, tc := range []struct {
		milli  int64
		shares uint64
	}{
		{0, 2}, {1, 2}, {2, 2}, {1000, 1024}, {500, 512}, {100, 102},
		{250, 256}, {2000, 2048}, {256000, 262144}, {300000, 262144},
	} {
		if got := cgroup.MilliCPUToShares(tc.milli); got != tc.shares {
			t.Errorf("MilliCPUToShares(%d) = %d, want %d", tc.milli, got, tc.shares)
		}
	}
}

func TestSharesToWeight(t *testing.T) {
	for _, tc := range []struct{ shares, weight uint64 }{
		// runc's table: unset, below/at/above the minimum, the default, and
		// just below/at/above the maximum.
		{0, 0}, {1, 1}, {2, 1}, {3, 2}, {1024, 100}, {262143, 10000}, {262144, 10000}, {262145, 10000},
		// Points in between, worked out by hand from the formula
		// ceil(10^((l^2+125l)/612 - 7/34)), l = log2(shares).
		{10, 4}, {100, 17}, {512, 59}, {2048, 174}, {5000, 356}, {100000, 4340},
	} {
		if got := cgroup.SharesToWeight(tc.shares); got != tc.weight {
			t.Errorf("SharesToWeight(%d) = %d, want %d", tc.shares, got, tc.weight)
		}
	}
}

func TestMilliCPUToWeight(t *testing.T) {
	for _, tc := range []struct {
		milli  int64
		weight uint64
	}{{0, 1}, {100, 17}, {250, 35}, {500, 59}, {1000, 100}, {2000, 174}} {
		if got := cgroup.MilliCPUToWeight(tc.milli); got != tc.weight {
			t.Errorf("MilliCPUToWeight(%d) = %d, want %d", tc.milli, got, tc.weight)
		}
	}
}

// The kubelet's own conversion for the cgroups it writes (pod, QoS). The
// first four come from the kubelet's test (pkg/kubelet/cm/
// cgroup_manager_linux_test.go, TestGetCpuWeight: 2 -> 1, 262144 -> 10000,
// 1e9 -> 10000; nil -> 0 is our 0); the others are worked out by hand from
// 1 + (shares-2)*9999/262142, and are the figures a real node holds (1 CPU
// of requests: 39, where runc's formula gives 100).
func TestSharesToPodWeight(t *testing.T) {
	for _, tc := range []struct{ shares, weight uint64 }{
		{0, 0}, {2, 1}, {262144, 10000}, {1000000000, 10000},
		{1, 1}, {3, 1}, {102, 4}, {512, 20}, {1024, 39}, {4096, 157}, {262143, 9999},
	} {
		if got := cgroup.SharesToPodWeight(tc.shares); got != tc.weight {
			t.Errorf("SharesToPodWeight(%d) = %d, want %d", tc.shares, got, tc.weight)
		}
	}
	for _, tc := range []struct {
		milli  int64
		weight uint64
	}{{0, 1}, {100, 4}, {1000, 39}, {4000, 157}} {
		if got := cgroup.MilliCPUToPodWeight(tc.milli); got != tc.weight {
			t.Errorf("MilliCPUToPodWeight(%d) = %d, want %d", tc.milli, got, tc.weight)
		}
	}
}

// spec.SharesToWeight writes runc's formula out so that the spec package
// stays a leaf; it must equal the library's function over the whole domain
// (and past its ends).
func TestSharesToWeightMatchesLibrary(t *testing.T) {
	for s := uint64(0); s <= spec.MaxShares+2; s++ {
		if got, want := spec.SharesToWeight(s), cgroup2.ConvertCPUSharesToCgroupV2Value(s); got != want {
			t.Fatalf("SharesToWeight(%d) = %d, containerd/cgroups gives %d", s, got, want)
		}
	}
}
