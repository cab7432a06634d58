// Package bpf measures per-cgroup pressure in the kernel with eBPF: the run
// queue latency of a cgroup's tasks, the time they stall in memory reclaim,
// and the OOM kills of its processes. It is the only package of the agent
// that imports github.com/cilium/ebpf.
//
// Everything is aggregated in the kernel, keyed by cgroup v2 id (the inode
// number of the cgroup's directory in cgroupfs):
//
//   - run-queue latency, the time from a task becoming runnable (woken up,
//     forked, or switched out while still runnable: preempted, yielding,
//     throttled by cpu.max) until it runs, as a log2 histogram of
//     microseconds, count and sum, taken from the kernel's own per-task
//     accounting (task->sched_info) by one tp_btf sched_switch program that
//     reads no clock;
//   - reclaim stall, the time the cgroup's tasks spend in memcg reclaim
//     (memory.high/memory.max) and in global direct reclaim, and how many
//     reclaims (tp_btf mm_vmscan_memcg_reclaim_begin/end,
//     mm_vmscan_direct_reclaim_begin/end);
//   - OOM kills per victim cgroup (tp_btf mark_victim; fentry on
//     __oom_kill_process or oom_kill_process on kernels whose mark_victim
//     tracepoint only passes a pid), each also sent as an [OOMEvent].
//
// No event crosses to user space per context switch: [Tracker.Stats] and
// [Tracker.All] read per-CPU maps and sum them. [Tracker.ProgramStats]
// reports the programs' own cost (see [EnableRunTimeStats]).
//
// It needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN), kernel BTF
// (/sys/kernel/btf/vmlinux), CONFIG_SCHED_INFO and Linux 6.1 or later
// (tp_btf, BPF ring buffer, task-local storage, and hash maps allocated on
// use from tracing programs); it is
// verified on 6.1 and 6.18. Where the kernel lacks something,
// [Probe] and [Load] return an error matching [ErrNotSupported].
//
// The BPF C source is pressure.bpf.c with its own small header of kernel
// types (pressure.h, CO-RE relocated); see README.md for how to regenerate
// the committed object.
package bpf
