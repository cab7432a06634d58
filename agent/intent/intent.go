// Package intent defines resize intents, their states and their validation.
// Resources and resize policies use the Kubernetes API types, so an intent
// has the same shape and meaning as a container's resources and
// resizePolicy in a pod spec.
package intent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// State is where an intent is in its life.
type State string

// Proposed -> InProgress -> Completed, or Infeasible, Deferred (retried when
// capacity frees), Failed, or Superseded by a newer intent for the same
// container before it ran.
const (
	Proposed   State = "Proposed"
	InProgress State = "InProgress"
	Completed  State = "Completed"
	Infeasible State = "Infeasible"
	Deferred   State = "Deferred"
	Failed     State = "Failed"
	Superseded State = "Superseded"
)

// Terminal reports whether an intent in state s will not change again.
func (s State) Terminal() bool {
	switch s {
	case Completed, Infeasible, Failed, Superseded:
		return true
	}
	return false
}

// Settled reports whether a client waiting for an intent in state s has its
// answer: the intent is terminal, or Deferred until capacity frees.
func (s State) Settled() bool { return s.Terminal() || s == Deferred }

// Reasons, machine-readable, one per outcome.
const (
	ReasonApplied          = "Applied"
	ReasonNoChange         = "NoChange"
	ReasonInfeasible       = "Infeasible" // as in the PodResizePending condition
	ReasonDeferred         = "Deferred"   // likewise
	ReasonSuperseded       = "Superseded"
	ReasonMemoryBelowUsage = "MemoryLimitBelowUsage"
	ReasonWriteFailed      = "CgroupWriteFailed"
	ReasonQoSChange        = "QOSClassChange"
	ReasonContainerGone    = "ContainerGone"
	ReasonShutdown         = "AgentShutdown"
	ReasonInvalid          = "Invalid"
	ReasonRuntimeFailed    = "RuntimeUpdateFailed"
	// ReasonRuntimeUnavailable: the runtime could not be reached for a
	// container's update; nothing was left changed, submit again once it is
	// back.
	ReasonRuntimeUnavailable = "RuntimeUnavailable"
	// ReasonRestartFailed: a restart did not complete and a container is
	// left running (the old one, with its old resources); the message
	// names it.
	ReasonRestartFailed = "RestartFailed"
	// ReasonRestartLostContainer: the old container was stopped and no new
	// attempt could be started, whatever the retries: no running container
	// is left.
	ReasonRestartLostContainer = "RestartLostContainer"
)

// Target names the container to resize, in one of three ways: a bare
// cgroup (CgroupPath), or a container of the runtime, by pod UID and
// container name (PodUID + Name) or by ID (ContainerID).
type Target struct {
	// Name is the container's name: with PodUID, its name in the pod spec.
	Name string `json:"name"`
	// CgroupPath is the container's cgroup, relative to the cgroup root.
	CgroupPath string `json:"cgroupPath,omitempty"`
	// PodUID finds the container through the runtime (CRI labels).
	PodUID string `json:"podUID,omitempty"`
	// ContainerID finds the container through the runtime by its ID.
	ContainerID string `json:"containerID,omitempty"`
	// PodCgroupPath optionally names the pod-level cgroup the container sits
	// in; the agent then manages it too, from the sum of its containers.
	PodCgroupPath string `json:"podCgroupPath,omitempty"`
}

// Runtime reports whether the target is found through the runtime.
func (t Target) Runtime() bool { return t.PodUID != "" || t.ContainerID != "" }

// Spec is what a client asks for.
type Spec struct {
	// ID, when given, makes a submission idempotent: the same ID and spec
	// submitted again returns the intent already accepted.
	ID        string                      `json:"id,omitempty"`
	Target    Target                      `json:"target"`
	Resources corev1.ResourceRequirements `json:"resources"`
	// ResizePolicy, per resource, as in the pod spec; NotRequired by default.
	ResizePolicy []corev1.ContainerResizePolicy `json:"resizePolicy,omitempty"`
	// AllowMemoryBelowUsage lets a memory limit go below the cgroup's current
	// usage, which makes the kernel reclaim and may OOM-kill the container.
	AllowMemoryBelowUsage bool `json:"allowMemoryBelowUsage,omitempty"`
	// Priority is the pod's spec.priority. With the QoS class and the time
	// spent Deferred it orders the retries of Deferred intents, as the
	// kubelet orders pending resizes.
	Priority int32 `json:"priority,omitempty"`
}

// Status is what became of an intent.
type Status struct {
	State        State      `json:"state"`
	Reason       string     `json:"reason,omitempty"`
	Message      string     `json:"message,omitempty"`
	AcceptedAt   time.Time  `json:"acceptedAt"`
	UpdatedAt    time.Time  `json:"updatedAt"`
	CompletedAt  *time.Time `json:"completedAt,omitempty"`
	Attempts     int        `json:"attempts,omitempty"`
	SupersededBy string     `json:"supersededBy,omitempty"`
	// Applied lists the cgroup files written and verified, by cgroup path.
	Applied Applied `json:"applied,omitempty"`
	// Via says how the container's own cgroup was changed: "cgroup" (the
	// agent wrote the files), "runtime" (CRI UpdateContainerResources, then
	// verified on the files), "runtime+cgroup" (the runtime's update did not
	// hold and the agent wrote the files itself) or "restart".
	Via string `json:"via,omitempty"`
	// Restarted is set when the container was restarted (RestartContainer
	// policy); ContainerID is then the new container's ID.
	Restarted   bool   `json:"restarted,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
}

// Origin says who asked for an intent.
type Origin string

const (
	// OriginAPI: a client of the agent's API.
	OriginAPI Origin = "api"
	// OriginKubernetes: the Kubernetes intake, from a pod's resize request.
	OriginKubernetes Origin = "kubernetes"
	// OriginDrift: the agent itself, restoring or adopting values changed
	// behind its back (the reason tells which).
	OriginDrift Origin = "drift"
)

// Intent is an accepted Spec with its Status.
type Intent struct {
	ID string `json:"id"`
	// Origin is set by the agent when it accepts the intent; a spec cannot
	// name it.
	Origin Origin `json:"origin,omitempty"`
	Spec   Spec   `json:"spec"`
	Status Status `json:"status"`
}

// ErrInvalid is matched by every validation error.
var ErrInvalid = errors.New("invalid intent")

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// NewID returns a new intent ID: the time, and 64 random bits.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102-150405-") + hex.EncodeToString(b[:])
}
