package kube

// ConditionType is the agent's own pod condition: what only the agent
// knows of a resize (that it verified the cgroup files, say). The
// kubelet's PodResizePending and PodResizeInProgress are the kubelet's
// (pkg/kubelet/types/pod_status.go PodConditionsByKubelet). deploy/base's
// ValidatingAdmissionPolicy lets the agent change this condition type and
// nothing else in a pod's status; test/k8s holds the two equal.
const ConditionType = "resize.resizer.io/Resize"
