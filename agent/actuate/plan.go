package actuate

import (
	"github.com/resizer/resize-agent/cgroup"
)

// group is the set of files one resource owns. A step writes one group of
// one cgroup, so that a runtime update (which sets a resource whole) and a
// direct write are steps of the same shape; a pod cgroup's CPU group is
// written in two parts, limit and request, as the kubelet sets them.
type group struct {
	name  string // "cpu" or "memory"
	files []string
	// podParts are the pod cgroup's steps of this group, limit first.
	podParts [][]string
}

// groups are in the kubelet's order: memory, then CPU
// (pkg/kubelet/kuberuntime/kuberuntime_manager.go, doPodResizeAction,
// releases 1.34 to 1.37: memory's resizeContainers runs before CPU's).
var groups = []group{
	{"memory", []string{cgroup.FileMemoryMax}, [][]string{{cgroup.FileMemoryMax}}},
	{"cpu", []string{cgroup.FileCPUWeight, cgroup.FileCPUMax}, [][]string{{cgroup.FileCPUMax}, {cgroup.FileCPUWeight}}},
}

// step is one group of one cgroup to write, with the values it holds now
// so that it can be undone.
type step struct {
	path      string
	group     string
	container bool // the container's own cgroup, not its pod's
	// after: a pod step that lowers its value, written after the
	// container's.
	after    bool
	resource cgroup.Resources
	previous cgroup.Resources
}

// level is one cgroup in the plan: its path, what it holds now and what it
// should hold.
type level struct {
	path string
	cur  cgroup.State
	want cgroup.Resources
}

// plan orders the writes of a resize as kubelet's doPodResizeAction does
// (pkg/kubelet/kuberuntime/kuberuntime_manager.go, resizeContainers):
// memory, then CPU; for each, the pod cgroup's values that grow are written
// before the container's (its limit, then its request), and those that
// shrink after, so that the container's limit never exceeds its pod's.
// Groups that already hold the wanted values are not written. pod may be
// nil.
func plan(ctr level, pod *level, pageSize int64) []step {
	var out []step
	for _, g := range groups {
		var before, after []step
		if pod != nil {
			for _, part := range g.podParts {
				s := stepFor(*pod, g.name, part, false, pageSize)
				if s == nil {
					continue
				}
				if shrinks(pod.cur, s.resource, g.name) {
					s.after = true
					after = append(after, *s)
				} else {
					before = append(before, *s)
				}
			}
		}
		out = append(out, before...)
		if c := stepFor(ctr, g.name, g.files, true, pageSize); c != nil {
			out = append(out, *c)
		}
		out = append(out, after...)
	}
	return out
}

func only(r cgroup.Resources, files []string) cgroup.Resources {
	var out cgroup.Resources
	for _, f := range files {
		o := r.Only(f)
		if o.CPUWeight != nil {
			out.CPUWeight = o.CPUWeight
		}
		if o.CPUMax != nil {
			out.CPUMax = o.CPUMax
		}
		if o.MemoryMax != nil {
			out.MemoryMax = o.MemoryMax
		}
	}
	return out
}

func stepFor(l level, group string, files []string, container bool, pageSize int64) *step {
	want := only(l.want, files)
	if want.IsZero() || l.cur.Matches(want, pageSize) {
		return nil
	}
	prev := only(l.cur.Resources(), files)
	// Restore only what the step writes.
	if want.CPUWeight == nil {
		prev.CPUWeight = nil
	}
	if want.CPUMax == nil {
		prev.CPUMax = nil
	}
	return &step{path: l.path, group: group, container: container, resource: want, previous: prev}
}

// shrinks reports whether the resource's limit goes down from cur to want.
func shrinks(cur cgroup.State, want cgroup.Resources, res string) bool {
	switch res {
	case "cpu":
		if want.CPUMax != nil && cpuRate(*want.CPUMax) != cpuRate(cur.CPUMax) {
			return cpuRate(*want.CPUMax) < cpuRate(cur.CPUMax)
		}
		return want.CPUWeight != nil && *want.CPUWeight < cur.CPUWeight
	case "memory":
		return want.MemoryMax != nil && memLimit(*want.MemoryMax) < memLimit(cur.MemoryMax)
	}
	return false
}

// cpuRate is a cpu.max as CPUs, with "max" above every finite value.
func cpuRate(c cgroup.CPUMax) float64 {
	if c.Quota == cgroup.Unlimited || c.Period == 0 {
		return 1e18
	}
	return float64(c.Quota) / float64(c.Period)
}

func memLimit(v int64) int64 {
	if v == cgroup.Unlimited {
		return 1<<63 - 1
	}
	return v
}
