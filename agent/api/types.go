package api

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
)

// The wire types of /v1. They live here, in a package that imports neither
// the agent nor anything that reaches the runtime, the kernel or BPF, so
// that a client links only this package, intent and admission; the agent's
// packages name them through aliases.

// HeaderContinue is set on a page of GET /v1/intents that has more after
// it: pass its value as the continue parameter to get the next page.
const HeaderContinue = "Resize-Agent-Continue"

// Error is the body of every error response.
type Error struct {
	Error  string `json:"error"`
	Reason string `json:"reason,omitempty"`
}

// ContainerInfo is what the agent knows of a managed container.
type ContainerInfo struct {
	Name          string             `json:"name"`
	CgroupPath    string             `json:"cgroupPath"`
	PodCgroupPath string             `json:"podCgroupPath,omitempty"`
	ContainerID   string             `json:"containerID,omitempty"`
	PodUID        string             `json:"podUID,omitempty"`
	Resources     intent.Resources   `json:"resources"`
	ManagesCPU    bool               `json:"managesCPU"`    // an intent declared cpu
	ManagesMemory bool               `json:"managesMemory"` // an intent declared memory
	Allocated     admission.Capacity `json:"allocated"`
	Cgroup        *CgroupValues      `json:"cgroup,omitempty"`
	CgroupError   string             `json:"cgroupError,omitempty"`
	Pressure      *PressureSummary   `json:"pressure,omitempty"`
	PendingIntent string             `json:"pendingIntent,omitempty"`
	LastIntent    string             `json:"lastIntent,omitempty"`
	QOSClass      corev1.PodQOSClass `json:"qosClass"`
	Drift         *DriftInfo         `json:"drift,omitempty"` // values changed behind the agent's back
}

// CgroupValues are the live values of a container's cgroup files.
type CgroupValues struct {
	CPUMax        string `json:"cpuMax"`
	CPUWeight     uint64 `json:"cpuWeight"`
	MemoryMax     string `json:"memoryMax"`
	MemoryCurrent int64  `json:"memoryCurrent"`
}

// NodeInfo is the node's capacity account.
type NodeInfo struct {
	Allocatable admission.Capacity `json:"allocatable"`
	Allocated   admission.Capacity `json:"allocated"`
	Free        admission.Capacity `json:"free"`
}

// DriftInfo is a container's drift: the files that no longer hold what the
// agent gave them, and what the agent did about it.
type DriftInfo struct {
	Files     []DriftFile `json:"files"`
	FirstSeen time.Time   `json:"firstSeen"`
	LastSeen  time.Time   `json:"lastSeen"`
	Policy    DriftPolicy `json:"policy"`
	Action    string      `json:"action"`
	Message   string      `json:"message,omitempty"`
	// Intent is the last intent the agent made for this drift.
	Intent string `json:"intent,omitempty"`
	// Restores counts the restore intents made since the drift was first seen.
	Restores int `json:"restores,omitempty"`
	// BackoffUntil is set while the agent holds off restoring.
	BackoffUntil *time.Time `json:"backoffUntil,omitempty"`
}

// DriftFile is one drifted file.
type DriftFile struct {
	Cgroup   string `json:"cgroup"`
	File     string `json:"file"`
	Expected string `json:"expected"`
	Found    string `json:"found"`
}

func (f DriftFile) String() string {
	return f.Cgroup + "/" + f.File + ": " + f.Found + " (expected " + f.Expected + ")"
}

// DriftPolicy is what the agent does when a managed container's cgroup no
// longer holds what its last completed intent gave it.
type DriftPolicy string

// Event is one change of an intent, as watchers see it.
type Event struct {
	Type   string        `json:"type"` // ADDED or MODIFIED
	Intent intent.Intent `json:"intent"`
}

// Filter selects the events a watcher gets; empty fields match everything.
type Filter struct {
	IntentID  string
	Container string // target name or cgroup path
}

// PressureSummary is the latest pressure of a container, as the API shows it.
type PressureSummary struct {
	Sources            []string `json:"sources"`
	CPUStallSeconds    float64  `json:"cpuStallSeconds"`
	MemoryStallSeconds float64  `json:"memoryStallSeconds"`
	OOMKills           uint64   `json:"oomKills"`
	// From the files.
	CPUSomeAvg10     *float64 `json:"cpuSomeAvg10,omitempty"`
	MemorySomeAvg10  *float64 `json:"memorySomeAvg10,omitempty"`
	IOSomeAvg10      *float64 `json:"ioSomeAvg10,omitempty"`
	ThrottledPeriods uint64   `json:"throttledPeriods"`
	Periods          uint64   `json:"periods"`
	ThrottledSeconds float64  `json:"throttledSeconds"`
	// From BPF.
	RunqLatencyCount   uint64   `json:"runqLatencyCount,omitempty"`
	RunqLatencyMeanSec float64  `json:"runqLatencyMeanSeconds,omitempty"`
	ReclaimStallSec    float64  `json:"reclaimStallSeconds,omitempty"`
	Errors             []string `json:"errors,omitempty"`
}

// Match reports whether it is one the filter selects.
func (f Filter) Match(it *intent.Intent) bool {
	if f.IntentID != "" && it.ID != f.IntentID {
		return false
	}
	if f.Container != "" && it.Spec.Target.Name != f.Container && it.Spec.Target.CgroupPath != f.Container {
		return false
	}
	return true
}
