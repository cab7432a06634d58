// Package agent composes the resize agent: it accepts resize intents,
// serializes them per container, admits them against the node's capacity,
// applies them to the cgroup files in a safe order, verifies them, and
// publishes every change of state to watchers and metrics.
//
// It reaches the kernel only through the small Cgroups interface, which
// package cgroup implements.
package agent
