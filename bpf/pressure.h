/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * The few kernel and UAPI types pressure.bpf.c needs, written by hand
 * instead of a generated multi-megabyte vmlinux.h.
 *
 * Kernel structs carry preserve_access_index: clang records every field
 * access as a CO-RE relocation and the loader (cilium/ebpf) rewrites the
 * offsets against the running kernel's BTF (/sys/kernel/btf/vmlinux). So a
 * struct here lists only the fields the programs read, in any order, and the
 * layout of the real kernel does not matter.
 */
#ifndef RESIZE_AGENT_PRESSURE_H
#define RESIZE_AGENT_PRESSURE_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef signed short __s16;
typedef unsigned int __u32;
typedef signed int __s32;
typedef unsigned long long __u64;
typedef signed long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

typedef __u8 u8;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;
typedef _Bool bool;

/* UAPI values from include/uapi/linux/bpf.h (stable ABI). */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_QUEUE = 22,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_F_NO_PREALLOC = (1U << 0),
};

enum {
	BPF_LOCAL_STORAGE_GET_F_CREATE = (1ULL << 0),
};

#define TASK_COMM_LEN 16

/* Kernel types (CO-RE). */
#define __pai __attribute__((preserve_access_index))

struct kernfs_node {
	u64 id; /* == inode number of the cgroupfs directory on 64-bit */
	const char *name;
} __pai;

/* The node's parent: "parent" up to 6.14, "__parent" (RCU) from 6.15. */
struct kernfs_node___old {
	struct kernfs_node *parent;
} __pai;

struct kernfs_node___new {
	struct kernfs_node *__parent;
} __pai;

struct kernfs_open_file {
	struct kernfs_node *kn;
} __pai;

struct cgroup {
	struct kernfs_node *kn;
} __pai;

struct css_set {
	struct cgroup *dfl_cgrp; /* the task's cgroup on the v2 hierarchy */
} __pai;

/* CONFIG_SCHED_INFO: the kernel's per-task run-queue accounting. */
struct sched_info {
	unsigned long pcount;         /* switched in after a wait */
	unsigned long long run_delay; /* ns spent waiting on a run queue */
} __pai;

struct task_struct {
	int pid;
	int tgid;
	char comm[TASK_COMM_LEN];
	struct css_set *cgroups;
	struct sched_info sched_info;
} __pai;

struct oom_control {
	struct task_struct *chosen;
} __pai;

#endif
