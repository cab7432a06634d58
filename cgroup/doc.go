// Package cgroup is the only package of the agent that touches cgroupfs.
//
// It validates cgroup paths (none may escape the mountpoint), converts
// Kubernetes CPU quantities to cgroup v2 values the way the kubelet and runc
// do, writes cpu.max, cpu.weight and memory.max and reads each back on the
// descriptor it was written on to verify it (open, write, pread, close: see
// writeOne), and restores the previous values when a write fails part way. It reads
// statistics, PSI and memory events through
// github.com/containerd/cgroups/v3/cgroup2.
package cgroup
