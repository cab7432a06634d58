package bpf

import (
	"fmt"
	"io"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ProgramStats is what one of the Tracker's programs has cost so far, as
// the kernel counts it (run_cnt and run_time_ns of the program's info):
// only while BPF run-time statistics are on, see EnableRunTimeStats.
type ProgramStats struct {
	Name    string // the program's name in pressure.bpf.c, e.g. on_sched_switch
	Runs    uint64
	RunTime time.Duration
	// Misses counts runs the kernel skipped because a BPF program was
	// already running on that CPU (recursion; 5.12+).
	Misses uint64
}

// ProgramStats returns the counts of every attached program, in a fixed
// order (scheduler, reclaim, OOM).
func (t *Tracker) ProgramStats() ([]ProgramStats, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return nil, errClosed
	}
	out := make([]ProgramStats, 0, len(t.progs))
	for _, name := range t.progs {
		st, err := t.coll.Programs[name].Stats()
		if err != nil {
			return nil, fmt.Errorf("bpf: statistics of %s: %w", name, err)
		}
		out = append(out, ProgramStats{Name: name, Runs: st.RunCount, RunTime: st.Runtime, Misses: st.RecursionMisses})
	}
	return out, nil
}

// EnableRunTimeStats turns on the kernel's BPF run-time statistics
// (BPF_ENABLE_STATS) until the returned Closer is closed. Needs
// CAP_SYS_ADMIN (once: the file descriptor keeps them on) and Linux 5.8.
// They are global: while on, the kernel times every run of every BPF
// program on the machine, with two clock reads (sched_clock) and a per-CPU
// counter update around each run.
func EnableRunTimeStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, classify("enabling BPF run-time statistics", err)
	}
	return c, nil
}
