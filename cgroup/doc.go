// Package cgroup is the only package of the agent that touches cgroupfs.
//
// It validates cgroup paths (none may escape the mountpoint), converts
// Kubernetes CPU quantities to cgroup v2 values the way the kubelet and runc
// do, writes cpu.max, cpu.weight and memory.max through
// github.com/containerd/cgroups/v3/cgroup2, reads every written file back to
// verify it, and restores the previous values when a write fails part way.
package cgroup
