// Package fit predicts the kubelet's verdict on an in-place resize of one
// pod from what the API server shows: the Node's status.allocatable and the
// pods bound to the node, with the resources the kubelet allocated to them
// (status.containerStatuses[].allocatedResources, status.allocatedResources).
//
// The kubelet admits a resize as it admits a new pod: the desired pod
// against every other active pod with allocated resources, counted the way
// the scheduler's NodeInfo counts them (containers, restartable init
// containers, the largest init container, pod-level resources, overhead;
// the maximum of allocated and actuated), compared with allocatable, first
// shortfall wins. The request arithmetic is k8s.io/component-helpers'
// PodRequests, the function the kubelet, the scheduler and the API server
// call, so that our numbers cannot drift from theirs; the decisions around
// it are written here, following, per kubelet minor version:
//
//   - pkg/kubelet/allocation/allocation_manager.go: handlePodResourcesResize,
//     canAdmitPod, getAllocatedPods (1.34-1.37; kubelet.go in 1.33), and
//     canResizePod (1.33-1.35: requests above allocatable are Infeasible);
//   - pkg/kubelet/allocation/handlers.go (1.36+): the resize admit handler's
//     Infeasible cases;
//   - pkg/kubelet/lifecycle/predicate.go and pkg/scheduler/eventhandlers.go
//     AdmissionCheck, framework/plugins/noderesources/fit.go fitsRequest:
//     reasons OutOf<resource> and "Node didn't have enough resource: ...";
//   - pkg/kubelet/status/status_manager.go SetPodResizePendingCondition: any
//     reason but Infeasible becomes Deferred;
//   - plugin/pkg/admission/podresize (1.36+, on by default): the API server
//     refuses a resize whose requests exceed allocatable, so the kubelet
//     never sees it.
//
// The package is pure: no client, no clock, no metrics registry. Its
// verdicts are compared with the kubelet's by the caller; agent/metrics
// holds the counter for that.
package fit
