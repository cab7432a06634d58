package main

import (
	"fmt"
	"log/slog"

	"kernel.org/pub/linux/libs/security/libcap/cap"
)

// Capabilities. The DaemonSet runs the agent privileged because start-up
// needs it: loading and attaching the eBPF programs (CAP_BPF, CAP_PERFMON,
// CAP_SYS_ADMIN for the BPF statistics and on older kernels,
// CAP_SYS_RESOURCE for the memlock limit), binding its listeners and giving
// the API socket to --api-group (CAP_CHOWN). Once that is done the agent
// works as uid 0 on the cgroup files, the journal and the runtime's and
// systemd's sockets, and keeps:
//   - CAP_DAC_OVERRIDE: files of those that uid 0 does not own (a delegated
//     cgroup subtree, a runtime socket owned by another user);
//   - with eBPF loaded, what reading its maps needs: on kernels before 6.5
//     every bpf() command, a lookup on a map already open included, asks
//     for bpf_capable() while unprivileged BPF is disabled
//     (kernel/bpf/syscall.c, __sys_bpf).
// Everything else leaves the effective,
// permitted, inheritable and ambient sets and the bounding set, so that a
// compromised agent cannot take it back, not even through exec.
//
// libcap's cap package changes every thread of the process (through psx):
// Linux keeps capabilities per thread and the Go runtime runs many.

// keptCapabilities is what the agent keeps after start-up.
func keptCapabilities(bpfLoaded bool) []cap.Value {
	keep := []cap.Value{cap.DAC_OVERRIDE}
	switch {
	case !bpfLoaded:
	case cap.MaxBits() > cap.PERFMON && cap.MaxBits() > cap.BPF:
		keep = append(keep, cap.BPF, cap.PERFMON)
	default:
		// Before Linux 5.8 there is no CAP_BPF: bpf_capable() is CAP_SYS_ADMIN.
		keep = append(keep, cap.SYS_ADMIN)
	}
	return keep
}

// dropCapabilities reduces the process to keep: effective and permitted
// hold keep (where the process had it), inheritable and ambient are empty,
// and the bounding set loses everything else.
func dropCapabilities(keep []cap.Value, log *slog.Logger) error {
	before := cap.GetProc()
	kept := map[cap.Value]bool{}
	for _, v := range keep {
		kept[v] = true
	}
	// The bounding set first: dropping from it needs CAP_SETPCAP, which the
	// new set below no longer has.
	var unbound []cap.Value
	for v := cap.Value(0); v < cap.MaxBits(); v++ {
		if in, err := cap.GetBound(v); err == nil && in && !kept[v] {
			unbound = append(unbound, v)
		}
	}
	if setpcap, _ := before.GetFlag(cap.Effective, cap.SETPCAP); setpcap && len(unbound) > 0 {
		if err := cap.DropBound(unbound...); err != nil {
			return fmt.Errorf("dropping capabilities from the bounding set: %w", err)
		}
	}
	if err := cap.ResetAmbient(); err != nil {
		log.Debug("resetting ambient capabilities", "err", err) // none set, or a kernel without them
	}
	next := cap.NewSet()
	for _, v := range keep {
		if has, _ := before.GetFlag(cap.Permitted, v); has {
			if err := next.SetFlag(cap.Permitted, true, v); err != nil {
				return err
			}
			if err := next.SetFlag(cap.Effective, true, v); err != nil {
				return err
			}
		}
	}
	if err := next.SetProc(); err != nil {
		return fmt.Errorf("setting capabilities %q: %w", next, err)
	}
	log.Info("dropped the capabilities start-up needed", "before", before.String(), "now", cap.GetProc().String())
	return nil
}
