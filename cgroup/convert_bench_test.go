package cgroup_test

import (
	"testing"

	"github.com/resizer/resize-agent/cgroup"
)

// Sinks keep the compiler from dropping the benchmarked calls.
var (
	sinkInt    int64
	sinkUint   uint64
	sinkValues []cgroup.Value
)

// milliCPUs cover the clamps and the common range.
var milliCPUs = []int64{0, 1, 10, 100, 250, 1000, 1500, 4000, 64000, 1 << 30}

func BenchmarkMilliCPUToQuota(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sinkInt = cgroup.MilliCPUToQuota(milliCPUs[i%len(milliCPUs)], cgroup.DefaultPeriod)
	}
}

func BenchmarkMilliCPUToShares(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sinkUint = cgroup.MilliCPUToShares(milliCPUs[i%len(milliCPUs)])
	}
}

func BenchmarkSharesToWeight(b *testing.B) {
	shares := []uint64{2, 102, 256, 1024, 2048, 10240, 262144}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sinkUint = cgroup.SharesToWeight(shares[i%len(shares)])
	}
}

func BenchmarkMilliCPUToWeight(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sinkUint = cgroup.MilliCPUToWeight(milliCPUs[i%len(milliCPUs)])
	}
}

// BenchmarkResourcesValues renders the file contents of a full resize (what
// every write and every status report does).
func BenchmarkResourcesValues(b *testing.B) {
	weight := cgroup.MilliCPUToWeight(250)
	mem := int64(256 << 20)
	r := cgroup.Resources{
		CPUMax:    &cgroup.CPUMax{Quota: cgroup.MilliCPUToQuota(500, cgroup.DefaultPeriod), Period: cgroup.DefaultPeriod},
		CPUWeight: &weight,
		MemoryMax: &mem,
	}
	b.ReportAllocs()
	for b.Loop() {
		sinkValues = r.Values()
	}
}

func BenchmarkParseCPUMax(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		c, err := cgroup.ParseCPUMax("50000 100000")
		if err != nil {
			b.Fatal(err)
		}
		sinkInt = c.Quota
	}
}
