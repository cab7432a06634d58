// Package faults holds tests, run in the VM on the real kernel with the real
// containerd, of what the agent does when the world fails under it: the
// runtime's socket going away and coming back, a container exiting while
// its resize is queued or in flight, a cgroup removed behind the agent's
// back, and a cgroup write the kernel refuses. It has no code of its own.
package faults
