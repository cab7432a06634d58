// Package latency measures every Kubernetes in-place resize of the pods on
// this node, whoever asked for it (kubectl, a VPA, the agent's intake), and
// the pressure its containers were under before and after it.
//
// A resize is a change of a container's resources in the pod spec: the
// pod's metadata.generation moves. Its phases, each timed from the agent
// seeing the new generation:
//
//   - accepted: the API server's time of the change (the managedFields
//     entry of the resize subresource, whole seconds) to the agent seeing it;
//   - admitted: the kubelet admitted it. Its allocation manager checkpoints
//     the allocation, clears PodResizePending and sets PodResizeInProgress
//     with the pod's generation in one step (handlePodResourcesResize in
//     kubernetes pkg/kubelet/allocation/allocation_manager.go, 1.33-1.37),
//     and its status manager writes status.observedGeneration and the
//     containers' allocatedResources with them (pkg/kubelet/status/
//     status_manager.go). The status update may reach the API server after
//     the kubelet actuated the resize; the cgroup files then holding the new
//     values are evidence of admission too, and the earlier evidence counts;
//   - cgroup: the container's cpu.max, cpu.weight and memory.max hold what
//     runc writes for the new resources, polled while the resize is open;
//   - status: status.containerStatuses[].resources report the new values
//     (the kubelet reads them back from the runtime after actuating).
//
// Resizes are exported as resize_agent_kube_resize_duration_seconds, listed
// at GET /v1/kube/resizes, and, once the window after them has passed,
// recorded as one ResizeMeasured Event on the pod (the agent's own reason:
// ResizeStarted and friends are the kubelet's) whose line holds the phases
// and the pressure evidence: run-queue latency p50/p99 (eBPF), throttled
// time (cpu.stat), PSI and memcg reclaim stall over a window before the
// change and one after the cgroup held the new values. The pressure comes
// from a small ring of samples kept for every container on the node, read
// every few seconds.
package latency
