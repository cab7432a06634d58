package main

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/bpf"
	"github.com/resizer/resize-agent/cgroup"
)

// bpfSource loads the eBPF programs unless --bpf=off. Where they cannot
// load, --bpf=auto logs one line and carries on with the PSI files, and
// --bpf=on refuses to start.
func bpfSource(o *Options, cg *cgroup.Manager, log *slog.Logger) (pressure.Source, func(), error) {
	if o.BPF == "off" {
		log.Info("eBPF pressure tracking off (--bpf=off); serving PSI figures from the cgroup files")
		return nil, func() {}, nil
	}
	err := bpf.Probe()
	var t *bpf.Tracker
	if err == nil {
		t, err = bpf.Load()
	}
	if err != nil {
		if o.BPF == "on" {
			return nil, nil, fmt.Errorf("eBPF pressure tracking (--bpf=on): %w", err)
		}
		why := "cannot load"
		if errors.Is(err, bpf.ErrNotSupported) {
			why = "not supported here"
		}
		log.Warn("eBPF pressure tracking "+why+"; serving PSI figures from the cgroup files instead", "err", err)
		return nil, func() {}, nil
	}
	log.Info("eBPF pressure tracking loaded: run-queue latency, memcg reclaim stalls, OOM kills per cgroup",
		"limitWritesTimed", t.TimesLimitWrites())
	// Loading decodes the kernel's BTF to relocate the programs: tens of
	// MiB of heap that are garbage once they are in the kernel, and that
	// the runtime's background scavenger hands back only slowly (make
	// bench: 65 MiB resident at rest with eBPF, 37 without). Give it back
	// now, once.
	debug.FreeOSMemory()
	// The programs' own cost (resize_agent_bpf_program_*) counts only
	// while the kernel's BPF run-time statistics are on. Turning them on
	// needs CAP_SYS_ADMIN, which only start-up has; the descriptor keeps
	// them on until shutdown.
	stats, err := bpf.EnableRunTimeStats()
	if err != nil {
		log.Warn("BPF run-time statistics unavailable; resize_agent_bpf_program_* stay at 0", "err", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range t.OOMEvents() {
			log.Warn("OOM kill", "pid", e.PID, "comm", e.Comm, "cgroupID", e.CgroupID)
		}
	}()
	return pressure.BPF{T: t, CG: cg}, func() {
		t.Close()
		<-done
		if stats != nil {
			stats.Close()
		}
	}, nil
}
