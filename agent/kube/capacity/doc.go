// Package capacity keeps the kubelet's capacity view of one node from the
// API server, and predicts the kubelet's verdict on a resize with it.
//
// The view is what the kubelet's allocation manager admits a resize
// against (pkg/kubelet/allocation/allocation_manager.go, 1.33-1.37:
// handlePodResourcesResize, canAdmitPod, getAllocatedPods): the Node's
// status.allocatable and every active pod bound to the node with the
// resources the kubelet allocated to it, which the kubelet reports in
// status.containerStatuses[].allocatedResources (init containers and
// sidecars in status.initContainerStatuses) and, for pod-level resources
// from 1.36, status.allocatedResources. The arithmetic and the rules are
// agent/kube/fit's; this package feeds them from informers.
//
// The Observer compares, for every resize the kubelet decides on this node
// (whoever asked), the prediction made when the pod's spec changed with the
// verdict the kubelet then gave, and counts both in
// resize_agent_kubelet_verdict_predictions_total.
package capacity
