// Package cgroup is the only package of the agent that touches cgroupfs.
//
// It validates cgroup paths (none may escape the mountpoint), converts
// Kubernetes CPU quantities to cgroup v2 values the way the kubelet and runc
// do, writes cpu.max, cpu.weight and memory.max (with one open, write and
// close each: see writeOne), reads every written file back to verify it, and
// restores the previous values when a write fails part way. It reads
// statistics, PSI and memory events through
// github.com/containerd/cgroups/v3/cgroup2.
package cgroup
