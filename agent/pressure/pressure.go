// Package pressure reads, per container cgroup, whether the container is
// starved of CPU or memory and whether it was OOM-killed, from two sources
// behind one small interface: eBPF programs (package bpf: run-queue latency,
// memcg reclaim stalls, OOM kills) and the cgroup's own PSI files, cpu.stat
// and memory.events, which are the fallback where BPF cannot load.
package pressure

import (
	"time"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/cgroup"
)

// Sample is what one source says about one cgroup. CPUStall, MemoryStall
// and OOMKills mean the same for every source; the rest is what only one
// source has.
type Sample struct {
	Source string
	// CPUStall is the total time runnable tasks waited for a CPU: PSI's
	// cpu "some", or the sum of the BPF run-queue latencies.
	CPUStall time.Duration
	// MemoryStall is the total time lost to memory pressure: PSI's memory
	// "some", or BPF's memcg reclaim time.
	MemoryStall time.Duration
	// OOMKills counts processes of the cgroup the OOM killer killed.
	OOMKills uint64

	// From the cgroup's files (PSI source only).
	Files *cgroup.Pressure
	// From BPF only.
	RunqLatency *Histogram
	Reclaims    uint64
}

// Histogram is a cumulative latency histogram: Counts[i] observations at
// or below Bounds[i] seconds, then Count in all.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

// Source reads samples. Read of a cgroup that does not exist returns an
// error that matches cgroup.ErrNotFound.
type Source interface {
	Name() string
	Read(cgroupPath string) (Sample, error)
}

// Files is the Source that reads the cgroup's own files.
type Files struct{ CG *cgroup.Manager }

// Name is "psi".
func (Files) Name() string { return "psi" }

// Read reads cpu.pressure, memory.pressure, io.pressure, cpu.stat and
// memory.events.
func (f Files) Read(p string) (Sample, error) {
	pr, err := f.CG.Pressure(p)
	if err != nil {
		return Sample{}, err
	}
	return Sample{Source: "psi", CPUStall: pr.CPU.Some, MemoryStall: pr.Memory.Some, OOMKills: pr.OOMKills, Files: &pr}, nil
}

// Limits are the limits a cgroup's files hold now, for the pressure
// panels to show beside the pressure: the kernel's, whoever wrote them.
type Limits struct {
	// CPUCores is cpu.max's quota over its period; 0 when "max".
	CPUCores float64
	// MemoryBytes is memory.max; 0 when "max".
	MemoryBytes int64
}

// LimitSource is a Source that also reads a cgroup's limits.
type LimitSource interface {
	Limits(cgroupPath string) (Limits, error)
}

// Limits reads cpu.max and memory.max.
func (f Files) Limits(p string) (Limits, error) {
	st, err := f.CG.Read(p)
	if err != nil {
		return Limits{}, err
	}
	var l Limits
	if st.CPUMax.Quota != cgroup.Unlimited && st.CPUMax.Quota > 0 && st.CPUMax.Period > 0 {
		l.CPUCores = float64(st.CPUMax.Quota) / float64(st.CPUMax.Period)
	}
	if st.MemoryMax != cgroup.Unlimited && st.MemoryMax > 0 {
		l.MemoryBytes = st.MemoryMax
	}
	return l, nil
}

// Summary is the latest pressure of a container, as the API shows it.
type Summary = api.PressureSummary

// Summarize reads every source for one cgroup. The first source that has a
// figure common to all (CPU and memory stall, OOM kills) gives it.
func Summarize(p string, sources []Source) *Summary {
	s := &Summary{}
	first := true
	for _, src := range sources {
		smp, err := src.Read(p)
		if err != nil {
			s.Errors = append(s.Errors, src.Name()+": "+err.Error())
			continue
		}
		s.Sources = append(s.Sources, src.Name())
		if first {
			s.CPUStallSeconds, s.MemoryStallSeconds, s.OOMKills = smp.CPUStall.Seconds(), smp.MemoryStall.Seconds(), smp.OOMKills
			first = false
		}
		if f := smp.Files; f != nil {
			if f.HasPSI {
				s.CPUSomeAvg10, s.MemorySomeAvg10, s.IOSomeAvg10 = &f.CPU.Avg10Some, &f.Memory.Avg10Some, &f.IO.Avg10Some
			}
			s.ThrottledPeriods, s.Periods, s.ThrottledSeconds = f.ThrottledPeriods, f.Periods, f.Throttled.Seconds()
		}
		if h := smp.RunqLatency; h != nil {
			s.RunqLatencyCount = h.Count
			if h.Count > 0 {
				s.RunqLatencyMeanSec = h.Sum.Seconds() / float64(h.Count)
			}
			s.ReclaimStallSec = smp.MemoryStall.Seconds()
		}
	}
	return s
}
