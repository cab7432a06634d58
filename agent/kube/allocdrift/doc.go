// Package allocdrift checks, in Kubernetes mode, that the cgroup of every
// running container of the node's pods holds what the kubelet allocated
// and actuated for it, as the pod's status reports it
// (status.containerStatuses[].resources, status.initContainerStatuses[]
// for sidecars), converted the way the kubelet and runc convert it; and
// that the pod's own cgroup holds what the kubelet writes there for the
// pod's allocation (ResourceConfigForPod, see PodExpected and package
// podcgroup: pod-level resources, overhead and init containers counted,
// cpu.weight by the kubelet's linear rule). A pod with pod-level resources
// is checked only once the kubelet has seen its latest spec
// (status.observedGeneration) and allocated its pod-level requests
// (status.allocatedResources); the pod's status.resources is no
// reference, the kubelet reads it back from the pod cgroup.
//
// The reference is the kubelet's, not the agent's: a kubelet resize moves
// the reference with it and is never drift, and the agent never keeps
// imposing values Kubernetes no longer asks for. A pod whose resize is in
// flight (PodResizeInProgress, or a spec that differs from the status
// without PodResizePending) is not checked, and a difference counts only
// when it is still there after a confirmation delay, so that the moment
// between the kubelet's write of the files and its status update is not
// taken for drift.
//
// By default a drift is reported (the caller's metric, an Event of the
// agent's own reason CgroupDrift, the log); under PolicyRestore the
// kubelet's own values are written back through the runtime
// (UpdateContainerResources), as the kubelet would have sent them, so the
// runtime's record and the files agree again. A pod cgroup has no runtime
// record (the kubelet writes it itself): its differing files are written
// back through the cgroup package (Writer; unit properties under the
// systemd driver, as the kubelet's cgroup manager sets them), except a
// memory.max below the pod's usage, which is reported. Standalone mode keeps the
// agent's own drift check (agent/drift.go).
package allocdrift
