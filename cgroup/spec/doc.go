// Package spec is what a cgroup's resource files should hold, apart from the
// files themselves: the kubelet's and runc's conversions, the text of
// cpu.max and memory.max, the values a resize writes and the state it reads
// back, and cgroup path hygiene. It does no I/O.
//
// It is a leaf (standard library only), as cilium/ebpf keeps a MapSpec apart
// from the live Map: package cgroup, which reads and writes the files and
// links containerd/cgroups and dbus, re-exports these names, and API clients
// such as resizectl use them without linking any of that.
package spec
