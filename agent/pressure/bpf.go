package pressure

import (
	"time"

	"github.com/resizer/resize-agent/bpf"
	"github.com/resizer/resize-agent/cgroup"
)

// Tracker is what the BPF source needs of package bpf's Tracker.
type Tracker interface {
	Stats(cgroupID uint64) (bpf.Stats, error)
}

// programCoster is a Tracker that also reports its programs' own cost
// (*bpf.Tracker does).
type programCoster interface {
	ProgramStats() ([]bpf.ProgramStats, error)
}

// limitWriter is a Tracker that also times the writes to the cgroups'
// limit files (*bpf.Tracker does where fexit loads).
type limitWriter interface {
	TimesLimitWrites() bool
	LastLimitWrite(cgroupID uint64) (time.Time, bool, error)
	LimitWriteStamp(cgroupID uint64) (uint64, bool, error)
}

// LastLimitWrite is the kernel's time of the last write to the cgroup's
// cpu.max, cpu.weight, memory.max or memory.high; ok is false when it is not known
// (no write seen, or no hook).
func (b BPF) LastLimitWrite(p string) (at time.Time, ok bool) {
	lw, isLW := b.T.(limitWriter)
	if !isLW || !lw.TimesLimitWrites() {
		return time.Time{}, false
	}
	id, err := b.CG.ID(p)
	if err != nil {
		return time.Time{}, false
	}
	at, ok, err = lw.LastLimitWrite(id)
	return at, ok && err == nil
}

// WriteMark names the last write to a cgroup's limit files: the cgroup (its
// id, so that a cgroup made anew at the same path has another mark) and the
// kernel's stamp of the write (0: none seen). Equal marks taken at two
// times mean that nothing wrote cpu.max, cpu.weight, memory.max or memory.high in
// between, unless the map lost the cgroup's entry (it keeps the 4,096
// written last) and it was never seen before: a caller that skips reads on
// equal marks still reads everything now and then.
type WriteMark struct{ Cgroup, Stamp uint64 }

// LimitWriteMark is the cgroup p's WriteMark; ok is false when the hook is
// not attached, the cgroup cannot be named or the map cannot be read.
func (b BPF) LimitWriteMark(p string) (m WriteMark, ok bool) {
	lw, isLW := b.T.(limitWriter)
	if !isLW || !lw.TimesLimitWrites() {
		return WriteMark{}, false
	}
	id, err := b.CG.ID(p)
	if err != nil {
		return WriteMark{}, false
	}
	ns, _, err := lw.LimitWriteStamp(id)
	if err != nil {
		return WriteMark{}, false
	}
	return WriteMark{Cgroup: id, Stamp: ns}, true
}

type anyLimitWriter interface {
	AnyLimitWriteStamp() (uint64, bool, error)
}

// AnyLimitWriteStamp is the kernel's stamp of the last write to any
// cgroup's limit files; equal stamps at two times mean nothing was written
// in between. ok is false when the hook is not attached or the map cannot
// be read.
func (b BPF) AnyLimitWriteStamp() (uint64, bool) {
	aw, isAW := b.T.(anyLimitWriter)
	if !isAW {
		return 0, false
	}
	ns, ok, err := aw.AnyLimitWriteStamp()
	return ns, ok && err == nil
}

// TimesLimitWrites reports whether LastLimitWrite can say anything.
func (b BPF) TimesLimitWrites() bool {
	lw, ok := b.T.(limitWriter)
	return ok && lw.TimesLimitWrites()
}

// BPF is the Source backed by the eBPF programs: it finds the cgroup's id
// (its inode number) and reads the in-kernel aggregates for it.
type BPF struct {
	T  Tracker
	CG *cgroup.Manager
}

// Name is "ebpf".
func (BPF) Name() string { return "ebpf" }

// Read returns the run-queue latency histogram (its sum as CPUStall), the
// memcg reclaim stall time (as MemoryStall) and the OOM kills of the cgroup.
func (b BPF) Read(p string) (Sample, error) {
	id, err := b.CG.ID(p)
	if err != nil {
		return Sample{}, err
	}
	st, err := b.T.Stats(id)
	if err != nil {
		return Sample{}, err
	}
	h := &Histogram{Count: st.RunqLatency.Count, Sum: st.RunqLatency.Sum}
	var acc uint64
	bounds := st.RunqLatency.UpperBounds()
	for i, n := range st.RunqLatency.Buckets {
		acc += n
		if i < len(bounds)-1 { // the last bound is +Inf, implied by Count
			h.Bounds = append(h.Bounds, bounds[i])
			h.Counts = append(h.Counts, acc)
		}
	}
	return Sample{
		Source: "ebpf", CPUStall: st.RunqLatency.Sum, MemoryStall: st.ReclaimStall, OOMKills: st.OOMKills,
		RunqLatency: h, Reclaims: st.Reclaims,
	}, nil
}

// Programs returns the eBPF programs' own cost (runs and run time, counted
// while the kernel's BPF run-time statistics are on), or nothing when the
// Tracker does not report it.
func (b BPF) Programs() ([]bpf.ProgramStats, error) {
	if pc, ok := b.T.(programCoster); ok {
		return pc.ProgramStats()
	}
	return nil, nil
}
