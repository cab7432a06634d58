package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/resizer/resize-agent/agent/actuate"
)

// ContainerCgroups returns the cgroup of the running container name of pod
// podUID, found through the runtime, and its pod's cgroup ("" when it has
// none), for a companion of the kubelet that acts on the cgroup files.
func (a *Agent) ContainerCgroups(ctx context.Context, podUID, name string) (ctr, pod string, err error) {
	if a.rt == nil {
		return "", "", fmt.Errorf("%w: this agent has no container runtime (set --cri-endpoint)", ErrRuntime)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ct, err := a.rt.Find(ctx, podUID, name)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if !ct.Running() {
		return "", "", fmt.Errorf("%w: container %s is %s, not running", ErrNotFound, ct.ID, ct.State)
	}
	p, err := a.cg.PathOf(ct.PID)
	if err != nil {
		return "", "", fmt.Errorf("%w: cgroup of container %s (pid %d): %w", ErrNotFound, ct.ID, ct.PID, err)
	}
	return p, podCgroupOf(p, ct.PodUID), nil
}

// MemoryCgroups is the agent's cgroup filesystem for bringing memory usage
// down (memory.high, memory.reclaim); false when it has no such files.
func (a *Agent) MemoryCgroups() (actuate.MemoryCgroups, bool) {
	m, ok := a.cg.(actuate.MemoryCgroups)
	return m, ok
}
