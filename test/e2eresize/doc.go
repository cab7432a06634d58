// Package e2eresize drives the agent in standalone mode through in-place
// resize cases taken from the kubelet's own end-to-end suite
// (kubernetes/kubernetes test/e2e/common/node/pod_resize.go; see cases_test.go
// for the version) against the VM harness's real containerd and kernel, and
// compares every container's and pod's cgroup files, restart counts,
// containerd's record and refusals with what a kubelet-driven node holds.
// It runs in the VM (make test-vm); elsewhere it skips and says why.
package e2eresize
