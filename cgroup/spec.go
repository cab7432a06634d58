package cgroup

import (
	"github.com/resizer/resize-agent/cgroup/spec"
)

// The values the files hold live in the leaf package spec; these names keep
// them at hand for the package's users, which mostly also do the I/O.
type (
	CPUMax    = spec.CPUMax
	Resources = spec.Resources
	Value     = spec.Value
	State     = spec.State
)

const (
	Unlimited = spec.Unlimited

	FileCPUMax        = spec.FileCPUMax
	FileCPUWeight     = spec.FileCPUWeight
	FileMemoryMax     = spec.FileMemoryMax
	FileMemoryCurrent = spec.FileMemoryCurrent

	MinShares      = spec.MinShares
	MaxShares      = spec.MaxShares
	SharesPerCPU   = spec.SharesPerCPU
	MilliCPUToCPU  = spec.MilliCPUToCPU
	DefaultPeriod  = spec.DefaultPeriod
	MinQuotaPeriod = spec.MinQuotaPeriod
	MinPeriod      = spec.MinPeriod
	MaxPeriod      = spec.MaxPeriod
)

// MilliCPUToQuota is spec.MilliCPUToQuota.
func MilliCPUToQuota(milliCPU int64, period uint64) int64 {
	return spec.MilliCPUToQuota(milliCPU, period)
}

// MilliCPUToShares is spec.MilliCPUToShares.
func MilliCPUToShares(milliCPU int64) uint64 { return spec.MilliCPUToShares(milliCPU) }

// SharesToWeight is spec.SharesToWeight (runc's conversion).
func SharesToWeight(shares uint64) uint64 { return spec.SharesToWeight(shares) }

// MilliCPUToWeight is spec.MilliCPUToWeight.
func MilliCPUToWeight(milliCPU int64) uint64 { return spec.MilliCPUToWeight(milliCPU) }

// SharesToPodWeight is spec.SharesToPodWeight (the kubelet's conversion, for
// pod cgroups).
func SharesToPodWeight(shares uint64) uint64 { return spec.SharesToPodWeight(shares) }

// MilliCPUToPodWeight is spec.MilliCPUToPodWeight.
func MilliCPUToPodWeight(milliCPU int64) uint64 { return spec.MilliCPUToPodWeight(milliCPU) }

// ParseCPUMax is spec.ParseCPUMax.
func ParseCPUMax(s string) (CPUMax, error) { return spec.ParseCPUMax(s) }

func formatMax(v int64) string          { return spec.FormatMax(v) }
func parseMax(s string) (int64, error)  { return spec.ParseMax(s) }
func pageAlign(v, pageSize int64) int64 { return spec.PageAlign(v, pageSize) }
