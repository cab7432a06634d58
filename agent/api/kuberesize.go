package api

import "time"

// KubeResize is one Kubernetes in-place resize of a pod on this node, as
// the agent measured it, whoever asked for it (kubectl, a VPA, the agent's
// own intake): GET /v1/kube/resizes.
type KubeResize struct {
	Pod        string `json:"pod"` // namespace/name
	PodUID     string `json:"podUID"`
	Generation int64  `json:"generation"`
	// Containers are those whose resources the resize changed.
	Containers []string `json:"containers"`
	// PodLevel is set when the resize changed the pod-level resources
	// (spec.resources); its cgroup phase is then the pod cgroup holding
	// the new values too, its status phase status.resources reporting
	// them.
	PodLevel bool `json:"podLevel,omitempty"`
	// Manager is the field manager the API server recorded for the
	// change (kubectl-patch, vpa-updater, resize-agent), when it did.
	Manager string `json:"manager,omitempty"`
	// AcceptedAt is the API server's time of the change (managedFields;
	// whole seconds), SeenAt when the agent saw the new generation.
	AcceptedAt *time.Time `json:"acceptedAt,omitempty"`
	SeenAt     time.Time  `json:"seenAt"`
	// Phases in order, each in seconds from SeenAt (accepted: from
	// AcceptedAt to SeenAt, the watch's lag).
	Phases []KubeResizePhase `json:"phases"`
	// ContainerCgroups is when each changed container's files first held
	// the new values: the kubelet updates the containers one after
	// another, memory of each and then CPU of each (doPodResizeAction,
	// pkg/kubelet/kuberuntime/kuberuntime_manager.go), and the cgroup
	// phase is the last of them.
	ContainerCgroups []ContainerCgroup `json:"containerCgroups,omitempty"`
	// AdmittedBy is the evidence of the kubelet's admission:
	// PodResizeInProgress, observedGeneration, allocatedResources or
	// cgroup (the files held the new values before the API said so).
	AdmittedBy string `json:"admittedBy,omitempty"`
	// KubeletAdmittedAt is the lastTransitionTime the kubelet gave
	// PodResizeInProgress for this generation: its own clock, whole
	// seconds, and independent of how late the agent's watch is.
	KubeletAdmittedAt *time.Time `json:"kubeletAdmittedAt,omitempty"`
	// Outcome: open while measured, then completed, infeasible,
	// superseded (a newer resize came first), timeout or gone.
	Outcome string `json:"outcome"`
	// Deferred is set if the kubelet deferred the resize at some point;
	// Error is the kubelet's last PodResizeInProgress error message.
	Deferred bool   `json:"deferred,omitempty"`
	Error    string `json:"error,omitempty"`
	// Pressure is the evidence per container, before and after.
	Pressure []ResizePressure `json:"pressure,omitempty"`
	// Summary is the line of the ResizeMeasured Event.
	Summary string `json:"summary,omitempty"`
}

// KubeResizePhase is when a phase was reached.
type KubeResizePhase struct {
	Phase   string    `json:"phase"` // accepted, admitted, cgroup, status
	At      time.Time `json:"at"`
	Seconds float64   `json:"seconds"`
}

// ContainerCgroup is when one container's cgroup files first held a
// resize's new values, in seconds from the resize's SeenAt.
type ContainerCgroup struct {
	Container string    `json:"container"`
	At        time.Time `json:"at"`
	Seconds   float64   `json:"seconds"`
}

// ResizePressure is one container's pressure over a window before the
// resize (ending when the agent saw the spec change) and one after it
// (starting when its cgroup held the new values).
type ResizePressure struct {
	Container string          `json:"container"`
	Before    *PressureWindow `json:"before,omitempty"`
	After     *PressureWindow `json:"after,omitempty"`
}

// PressureWindow is what changed in a container's counters over a window.
// Shares are of the window's wall time.
type PressureWindow struct {
	Start   time.Time `json:"start"`
	Seconds float64   `json:"seconds"`
	Source  string    `json:"source"` // ebpf or psi: where CPU and memory stall come from
	// Run-queue latency quantiles (eBPF only; nil when no task waited).
	RunqP50Seconds *float64 `json:"runqP50Seconds,omitempty"`
	RunqP99Seconds *float64 `json:"runqP99Seconds,omitempty"`
	RunqCount      uint64   `json:"runqCount,omitempty"`
	// cpu.stat: throttled time and share of periods throttled.
	ThrottledSeconds float64  `json:"throttledSeconds"`
	ThrottledRatio   *float64 `json:"throttledRatio,omitempty"`
	// PSI some over the window, as a share of it (cpu.pressure,
	// memory.pressure); nil where the kernel has no PSI.
	CPUPressure    *float64 `json:"cpuPressure,omitempty"`
	MemoryPressure *float64 `json:"memoryPressure,omitempty"`
	// ReclaimStallSeconds is memcg reclaim time (eBPF only).
	ReclaimStallSeconds *float64 `json:"reclaimStallSeconds,omitempty"`
}
