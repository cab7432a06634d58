//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
/*
 * Per-cgroup pressure signals for the resize agent, aggregated in the
 * kernel:
 *
 *  - run-queue latency: time from a task becoming runnable (wakeup, new
 *    task, or being switched out while still runnable) until it runs, as a
 *    log2 histogram of microseconds per cgroup v2 id (per-CPU array), taken
 *    from the kernel's own per-task accounting (sched_info) in
 *    sched_switch alone;
 *  - reclaim stall: time a task spends in memcg reclaim (and in global
 *    direct reclaim), summed per cgroup v2 id of the reclaiming task;
 *  - OOM kills: a count per victim cgroup v2 id, plus one ring buffer event
 *    per kill (tp_btf/mark_victim, or fentry where that tracepoint is too
 *    old, see the end of this file);
 *  - limit writes: when a cgroup's cpu.max, cpu.weight, memory.max or
 *    memory.high was last written, by anyone (see on_cgroup_file_write).
 *
 * Nothing is sent to user space per scheduler event: user space reads the
 * maps when it wants numbers.
 */
#include "pressure.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/*
 * Histogram slots. Slot 0 counts latencies below 1 us; slot i (1 <= i <
 * RUNQ_SLOTS-1) counts [2^(i-1), 2^i) us; the last slot counts everything
 * from 2^(RUNQ_SLOTS-2) us (~16.8 s) up.
 */
#define RUNQ_SLOTS 26

struct runq_hist {
	u64 cgroup_id; /* whose counts these are; see runq_hist_get */
	u64 count;
	u64 sum_ns;
	u64 slots[RUNQ_SLOTS];
};

struct mem_stats {
	u64 reclaim_ns;
	u64 reclaims;
	u64 oom_kills;
};

/* Ring buffer record; decoded by oomRecord in bpf.go (40 bytes). */
struct oom_event {
	u64 boot_ns;   /* bpf_ktime_get_boot_ns() at the kill */
	u64 cgroup_id; /* victim's cgroup v2 id */
	u32 pid;       /* victim's tgid */
	u32 tid;       /* victim task's pid */
	char comm[TASK_COMM_LEN];
};

/*
 * Per task, the kernel's run-queue accounting (task->sched_info) as of the
 * task's last switch-out, i.e. what has been counted already, and the
 * runq_lat slot of the task's cgroup as resolved last time. Task-local
 * storage: a lookup is an index off the task (kernel selftest benchmark,
 * commit 73087489: ~12 ns against 54-207 ns for a hash map), and the
 * kernel frees the entry with the task.
 */
struct runq_seen {
	u64 run_delay;
	u64 pcount;
	u64 cgroup_id; /* slot is runq_lat's slot for this cgroup ... */
	u32 gen;       /* ... as long as runq_gen still holds this */
	u32 slot;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct runq_seen);
} runq_seen SEC(".maps");

/*
 * Run-queue latency histograms: one slot per cgroup, one copy per CPU. An
 * array, not a hash keyed by cgroup id: a hash lookup per context switch
 * cost ~70 ns on the dev host (hashing, bucket, element: cache misses),
 * an array index off a slot number cached per task ~20. max_entries is
 * set by the loader (WithMaxCgroups); all of it is allocated up front.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct runq_hist);
} runq_lat SEC(".maps");

/* cgroup id -> its slot in runq_lat. Written here when a cgroup is first
 * seen; user space deletes an entry to forget a cgroup. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, u64);
	__type(value, u32);
} runq_slots SEC(".maps");

/* Free slots of runq_lat: the loader pushes them all, a new cgroup pops
 * one, user space pushes a forgotten cgroup's slot back. */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 1);
	__type(value, u32);
} runq_free SEC(".maps");

/* A generation number that user space bumps after deleting from
 * runq_slots, so that every task resolves its slot again. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} runq_gen SEC(".maps");

/* tid -> ktime (ns) at reclaim begin. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, u64);
} reclaim_start SEC(".maps");

/* cgroup id -> reclaim stall and OOM kill counters, one per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, u64);
	__type(value, struct mem_stats);
} cg_mem SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} oom_events SEC(".maps");

/* Direct (BTF) loads, no bpf_probe_read_kernel calls: t is a BTF pointer
 * from a tracing program's arguments, and a faulting load gives 0. */
static __always_inline u64 task_cgroup_id(struct task_struct *t)
{
	return t->cgroups->dfl_cgrp->kn->id;
}

/* floor(log2(v)) for v > 0. */
static __always_inline u64 log2_u64(u64 v)
{
	u64 r = 0, s;

	s = (v > 0xffffffffULL) << 5; v >>= s; r |= s;
	s = (v > 0xffffULL) << 4;     v >>= s; r |= s;
	s = (v > 0xffULL) << 3;       v >>= s; r |= s;
	s = (v > 0xfULL) << 2;        v >>= s; r |= s;
	s = (v > 0x3ULL) << 1;        v >>= s; r |= s;
	r |= v >> 1;
	return r;
}

/*
 * The histogram for cgroup cgid on this CPU. The slot cached in seen is
 * used while the task stays in that cgroup and no cgroup was forgotten
 * since (runq_gen); otherwise it is looked up in runq_slots, or a free
 * one is taken from runq_free. A slot's copy on this CPU may still hold a
 * forgotten cgroup's counts (user space does not clear all CPUs' copies
 * of a freed slot): they are dropped here, and user space only sums
 * copies whose cgroup_id is the cgroup asked for.
 */
static __always_inline struct runq_hist *runq_hist_get(struct runq_seen *seen, u64 cgid)
{
	u32 zero = 0, slot, *gen, *sp;
	struct runq_hist *h;

	gen = bpf_map_lookup_elem(&runq_gen, &zero);
	if (!gen)
		return NULL;
	if (seen->cgroup_id != cgid || seen->gen != *gen) {
		u32 g = *gen;

		sp = bpf_map_lookup_elem(&runq_slots, &cgid);
		if (sp) {
			slot = *sp;
		} else {
			if (bpf_map_pop_elem(&runq_free, &slot))
				return NULL; /* as many cgroups as slots */
			if (bpf_map_update_elem(&runq_slots, &cgid, &slot, BPF_NOEXIST)) {
				/* another CPU was first: use its slot */
				bpf_map_push_elem(&runq_free, &slot, 0);
				sp = bpf_map_lookup_elem(&runq_slots, &cgid);
				if (!sp)
					return NULL;
				slot = *sp;
			}
		}
		seen->cgroup_id = cgid;
		seen->gen = g;
		seen->slot = slot;
	}
	slot = seen->slot;
	h = bpf_map_lookup_elem(&runq_lat, &slot);
	if (!h)
		return NULL;
	if (h->cgroup_id != cgid) {
		__builtin_memset(h, 0, sizeof(*h));
		h->cgroup_id = cgid;
	}
	return h;
}

/*
 * Run-queue latency without a clock read or a start map of our own: the
 * kernel already accounts every task's wait for a CPU in task->sched_info
 * (CONFIG_SCHED_INFO, independent of the schedstats sysctl; it is what
 * /proc/PID/schedstat shows): run_delay is the total time spent runnable
 * on a run queue, pcount the number of times the task was switched in
 * after such a wait (kernel/sched/stats.h, sched_info_arrive). Both are
 * brought up to date when the task is switched in, which happens after
 * trace_sched_switch (__schedule: trace_sched_switch, then
 * context_switch -> prepare_task_switch -> sched_info_switch). So at
 * switch-in they still lack the wait that is just ending, and it is at
 * switch-out, when prev == current, that the delta since the task's last
 * switch-out is exactly the wait that ended at its latest switch-in (plus
 * any part of that wait spent on another CPU's queue before a migration,
 * which the kernel adds on dequeue). The sample is taken one run slice
 * after the wait ends, and counted to the cgroup the task ran in.
 */
SEC("tp_btf/sched_switch")
int on_sched_switch(u64 *ctx)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev,
	 *          struct task_struct *next[, unsigned int prev_state]) */
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct runq_seen *seen;
	struct runq_hist *h;
	u64 delay, pcount, delta, us, cgid, slot;

	/* (sched_switch never nests on a CPU: no other run can change seen
	 * or this CPU's histogram under us.) */

	if (prev->pid == 0) /* the idle task: never accounted */
		return 0;
	delay = prev->sched_info.run_delay;
	pcount = prev->sched_info.pcount;
	/* Creating an entry allocates under the run-queue lock, as the
	 * kernel's own tools/bpf/runqslower does in this tracepoint; it
	 * happens once per task. */
	seen = bpf_task_storage_get(&runq_seen, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!seen)
		return 0;
	if (pcount == seen->pcount && delay == seen->run_delay)
		return 0; /* not switched in after a wait since last time */
	if (seen->pcount == 0 && pcount != 1) {
		/* First sight of a task that ran before we were loaded: its
		 * history is not ours to count. (A task on its first run, pcount
		 * 1, counts its first wait, as a new task's.) */
		seen->run_delay = delay;
		seen->pcount = pcount;
		return 0;
	}
	delta = delay - seen->run_delay;
	seen->run_delay = delay;
	seen->pcount = pcount;
	if ((s64)delta < 0)
		return 0;

	cgid = task_cgroup_id(prev);
	h = runq_hist_get(seen, cgid);
	if (!h)
		return 0;

	us = delta / 1000;
	slot = us ? log2_u64(us) + 1 : 0;
	/* Keep clang from testing the bound on a copy of slot (log2 before
	 * the +1): older verifiers (6.1) do not carry the bound over. */
	asm volatile("" : "+r"(slot));
	if (slot > RUNQ_SLOTS - 1)
		slot = RUNQ_SLOTS - 1;
	/* Per-CPU value, and sched_switch runs with the run queue locked and
	 * interrupts off: plain increments are safe. */
	h->slots[slot]++;
	h->count++;
	h->sum_ns += delta;
	return 0;
}

static __always_inline struct mem_stats *mem_stats_get(u64 cgid)
{
	struct mem_stats *m = bpf_map_lookup_elem(&cg_mem, &cgid);

	if (!m) {
		struct mem_stats zero = {};

		bpf_map_update_elem(&cg_mem, &cgid, &zero, BPF_NOEXIST);
		m = bpf_map_lookup_elem(&cg_mem, &cgid);
	}
	return m;
}

static __always_inline void reclaim_begin(void)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&reclaim_start, &tid, &now, BPF_ANY);
}

static __always_inline void reclaim_end(void)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 *start, delta;
	struct mem_stats *m;

	start = bpf_map_lookup_elem(&reclaim_start, &tid);
	if (!start)
		return;
	delta = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&reclaim_start, &tid);
	if ((s64)delta < 0)
		return;

	m = mem_stats_get(bpf_get_current_cgroup_id());
	if (!m)
		return;
	/* Reclaim runs in process context and may be preempted: atomics. */
	__sync_fetch_and_add(&m->reclaim_ns, delta);
	__sync_fetch_and_add(&m->reclaims, 1);
}

/* The tracepoints' arguments (order, gfp flags, nr_reclaimed; a memcg id on
 * newer kernels) are not read, so their changes across versions do not
 * matter. */
SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int on_memcg_reclaim_begin(u64 *ctx)
{
	reclaim_begin();
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int on_memcg_reclaim_end(u64 *ctx)
{
	reclaim_end();
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int on_direct_reclaim_begin(u64 *ctx)
{
	reclaim_begin();
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int on_direct_reclaim_end(u64 *ctx)
{
	reclaim_end();
	return 0;
}

static __always_inline void oom_killed(struct task_struct *victim)
{
	u64 cgid = task_cgroup_id(victim);
	struct oom_event *e;
	struct mem_stats *m;

	m = mem_stats_get(cgid);
	if (m)
		__sync_fetch_and_add(&m->oom_kills, 1);

	e = bpf_ringbuf_reserve(&oom_events, sizeof(*e), 0);
	if (!e)
		return;
	e->boot_ns = bpf_ktime_get_boot_ns();
	e->cgroup_id = cgid;
	e->pid = BPF_CORE_READ(victim, tgid);
	e->tid = BPF_CORE_READ(victim, pid);
	BPF_CORE_READ_STR_INTO(&e->comm, victim, comm);
	bpf_ringbuf_submit(e, 0);
}

/*
 * OOM kills. Three hooks; bpf.go loads exactly one, chosen from the running
 * kernel's BTF:
 *
 * 1. tp_btf/mark_victim where its first argument is the victim's
 *    task_struct (TP_PROTO(struct task_struct *task, uid_t uid): mainline
 *    since 6.8 and backported to stable kernels, e.g. Debian's 6.1.192).
 *    mark_oom_victim() runs right after __oom_kill_process() has sent the
 *    SIGKILL, once per killed process (the chosen victim and, with
 *    memory.oom.group, every other member), and also for a task that is
 *    already exiting and only gets access to memory reserves. Needs no BPF
 *    trampoline, unlike fentry.
 * 2. fentry/__oom_kill_process(struct task_struct *victim, const char
 *    *message) for kernels whose mark_victim only passes a pid
 *    (TP_PROTO(int pid)): the function that sends the SIGKILL and counts
 *    memory.events oom_kill.
 * 3. fentry/oom_kill_process(struct oom_control *oc, const char *message)
 *    and oc->chosen, where __oom_kill_process was inlined away (no BTF
 *    function); it misses oom.group members.
 */
SEC("tp_btf/mark_victim")
int on_mark_victim(u64 *ctx)
{
	oom_killed((struct task_struct *)ctx[0]);
	return 0;
}

SEC("fentry/__oom_kill_process")
int on_oom_kill(u64 *ctx)
{
	oom_killed((struct task_struct *)ctx[0]);
	return 0;
}

SEC("fentry/oom_kill_process")
int on_oom_kill_chosen(u64 *ctx)
{
	struct oom_control *oc = (struct oom_control *)ctx[0];

	oom_killed(oc->chosen);
	return 0;
}

/*
 * Limit writes. The latency tracker's 100 ms reads of a container's files
 * only say that the new values were there by then; on a node short of CPU
 * they ran seconds late. cgroupfs keeps no time of a write (kernfs sets a
 * file's mtime on truncation only, and runc does not truncate), so the
 * time is taken here: CLOCK_MONOTONIC ns when a write to one of the three
 * limit files of a cgroup returned with success, per cgroup v2 id of the
 * file's directory. fexit: the value is in place by then. Key 0 (no
 * cgroup has id 0) holds the last write to any cgroup's: a drift check
 * that finds it unchanged knows nothing was written anywhere, without a
 * lookup per cgroup. Written at every write, it is never the least
 * recently used entry, so the LRU never evicts it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, u64);
} limit_writes SEC(".maps");

static __always_inline bool same(const char *a, const char *b, int n)
{
	for (int i = 0; i < n; i++)
		if (a[i] != b[i])
			return 0;
	return 1;
}

/* cgroup_file_write(struct kernfs_open_file *of, char *buf, size_t nbytes,
 * loff_t off), returning ssize_t: ctx[0] and ctx[4]. */
SEC("fexit/cgroup_file_write")
int on_cgroup_file_write(u64 *ctx)
{
	struct kernfs_open_file *of = (struct kernfs_open_file *)ctx[0];
	long ret = (long)ctx[4];
	struct kernfs_node *kn, *dir;
	char name[16] = {};
	u64 id, now;

	if (ret <= 0)
		return 0;
	kn = BPF_CORE_READ(of, kn);
	if (bpf_probe_read_kernel_str(name, sizeof(name), BPF_CORE_READ(kn, name)) < 0)
		return 0;
	/* cpu.weight.nice sets cpu.weight too; memory.high is the kubelet's
	 * under MemoryQoS. */
	if (!same(name, "cpu.max", 8) && !same(name, "cpu.weight", 11) && !same(name, "memory.max", 11) &&
	    !same(name, "cpu.weight.nice", 16) && !same(name, "memory.high", 12))
		return 0;
	if (bpf_core_field_exists(((struct kernfs_node___new *)0)->__parent))
		dir = BPF_CORE_READ((struct kernfs_node___new *)kn, __parent);
	else
		dir = BPF_CORE_READ((struct kernfs_node___old *)kn, parent);
	id = BPF_CORE_READ(dir, id);
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&limit_writes, &id, &now, BPF_ANY);
	id = 0;
	bpf_map_update_elem(&limit_writes, &id, &now, BPF_ANY);
	return 0;
}
