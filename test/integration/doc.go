// Package integration holds the tests that prove the agent on a real
// cgroup v2 kernel: they create throwaway cgroups, run processes in them,
// resize them through the agent's API and check both the kernel's files and
// what the processes can do. They run in the VM harness (make test-vm),
// where RESIZE_AGENT_REQUIRE_CGROUP2=1 turns a missing hierarchy into a
// failure; elsewhere they skip and say why.
package integration
