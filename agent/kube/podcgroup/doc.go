// Package podcgroup computes what the kubelet writes to a pod's own cgroup
// (kubepods/<qos>/pod<uid>, or its systemd slice): cpu.weight, cpu.max and
// memory.max, from a pod's requests and limits, with pod-level resources
// (spec.resources), pod overhead, init containers and native sidecars
// counted the kubelet's way.
//
// It follows ResourceConfigForPod in kubernetes
// pkg/kubelet/cm/helpers_linux.go (1.34-1.37, read in the v1.37.2 source):
// the pod's requests and
// limits are k8s.io/component-helpers' PodRequests and PodLimits (the
// functions the kubelet calls: pod-level values win for cpu and memory,
// overhead is added to the requests and to the limits that are set, the
// largest init container against the sum of the others); the shares come
// from the CPU request, the quota from the CPU limit; a Guaranteed pod
// gets both limits, a Burstable pod a limit only when every container
// (init containers included) declares it or the pod level does, a
// BestEffort pod the minimum shares alone. The shares become cpu.weight by
// the kubelet's own linear rule (spec.SharesToPodWeight, getCPUWeight in
// pkg/kubelet/cm/cgroup_manager_linux.go), not runc's.
//
// Allocated gives the pod the kubelet computes from: the spec with the
// resources it allocated and actuated, as the pod's status reports them.
package podcgroup
