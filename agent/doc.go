// Package agent composes the resize agent: it accepts resize intents,
// serializes them per container, admits them against the node's capacity,
// hands each admitted one to package actuate (which writes the cgroup files
// in a safe order and verifies them), records what became of it, and
// publishes every change of state to watchers and metrics. It keeps the
// state: intents and their history, per-container queues, the managed
// containers and their pods, recovery from the journal, and drift.
//
// It reaches the kernel only through the small Cgroups interface, which
// package cgroup implements.
package agent
