// Package soak holds a bounded soak test of the agent behind its API on a
// unix socket, on real cgroups (run in the VM): many concurrent clients
// submitting, superseding, watching and listing. It has no code of its own.
package soak
