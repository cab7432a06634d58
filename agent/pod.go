package agent

import (
	"context"
	"path"
	"strings"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// podLister is the optional part of a Runtime that lists a pod's
// containers; *cri.Client has it. Without it the pod-level cgroup is
// computed from the containers the agent manages only.
type podLister interface {
	PodContainers(ctx context.Context, podUID string) ([]cri.Container, error)
}

// podCgroupOf is the pod-level cgroup of a runtime container whose cgroup is
// ctr, when its parent is the kubelet's pod cgroup: "pod<uid>" with the
// cgroupfs driver (kubepods/burstable/pod<uid>), "...-pod<uid with
// underscores>.slice" with the systemd driver. It is "" otherwise: a
// container not placed by the kubelet has no pod cgroup to keep in step.
func podCgroupOf(ctr, podUID string) string {
	if podUID == "" {
		return ""
	}
	parent := path.Dir(ctr)
	base := path.Base(parent)
	if base == "pod"+podUID || strings.HasSuffix(base, "pod"+strings.ReplaceAll(podUID, "-", "_")+".slice") {
		return parent
	}
	return ""
}

// unmanagedMembers returns the resources of the running containers of c's
// pod that the agent does not manage, as the runtime reports them: the
// kubelet computes the pod cgroup from every container of the pod (a quota
// only when each has a CPU limit, memory.max only when each has a memory
// limit), and a pod cgroup summed over the managed containers alone would
// throttle the others. It runs without the lock.
func (a *Agent) unmanagedMembers(podUID string) []cri.Container {
	pl, ok := a.rt.(podLister)
	if !ok || podUID == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), runtimeTimeout)
	defer cancel()
	ctrs, err := pl.PodContainers(ctx, podUID)
	if err != nil {
		a.log.Warn("cannot list the pod's containers; the pod cgroup follows the managed containers only", "podUID", podUID, "err", err)
		return nil
	}
	return ctrs
}

// podMembers is the one rule for which containers the pod cgroup sums over
// (apply writes it, the drift check compares with it): self, the pod's
// other managed containers (siblings), and those running containers the
// runtime lists (others) that are not managed, by what the runtime reports.
func podMembers(self intent.Resources, siblings []intent.Resources, others []cri.Container, managed map[string]bool, podUID string) []intent.Resources {
	all := append([]intent.Resources{self}, siblings...)
	for _, o := range others {
		if !managed[o.ID] && o.PodUID == podUID {
			all = append(all, fromRuntime(o.Resources))
		}
	}
	return all
}

// fromRuntime is what a runtime's record of a container's resources says
// of its requests and limits: the inverse of criResources. Memory requests
// do not reach the runtime and stay 0; they do not enter the pod cgroup.
func fromRuntime(r cri.Resources) intent.Resources {
	var out intent.Resources
	if r.CPUQuota > 0 && r.CPUPeriod > 0 {
		out.CPULimit = r.CPUQuota * 1000 / r.CPUPeriod
	}
	if r.CPUShares > 2 { // 2 is the kubelet's floor, for no request
		out.CPURequest = r.CPUShares * 1000 / 1024
	}
	if r.MemoryLimit > 0 {
		out.MemoryLimit = r.MemoryLimit
	}
	return out
}

// storer is the optional part of Cgroups that says what the files will hold
// once r is written to a path: with the systemd driver, CPU quotas rounded
// up to whole 10 ms per second as systemd (and runc) store them.
// *cgroup.Manager has it.
type storer interface {
	Stored(path string, r cgroup.Resources) cgroup.Resources
}

// stored is what path's files will hold once r is written there, so that
// comparisons with the files (no change, verification, drift) are not
// fooled by the driver's rounding.
func (a *Agent) stored(path string, r cgroup.Resources) cgroup.Resources {
	if s, ok := a.cg.(storer); ok {
		return s.Stored(path, r)
	}
	return r
}
