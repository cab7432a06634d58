package actuate

import (
	"github.com/resizer/resize-agent/cgroup"
)

// group is the set of files one resource owns. A step writes one group of
// one cgroup, so that a runtime update (which sets a resource whole) and a
// direct write are steps of the same shape.
type group struct {
	name  string // "cpu" or "memory"
	files []string
}

var groups = []group{
	{"cpu", []string{cgroup.FileCPUWeight, cgroup.FileCPUMax}},
	{"memory", []string{cgroup.FileMemoryMax}},
}

// step is one group of one cgroup to write, with the values it holds now
// so that it can be undone.
type step struct {
	path      string
	group     string
	container bool // the container's own cgroup, not its pod's
	resource  cgroup.Resources
	previous  cgroup.Resources
}

// level is one cgroup in the plan: its path, what it holds now and what it
// should hold.
type level struct {
	path string
	cur  cgroup.State
	want cgroup.Resources
}

// plan orders the writes of a resize. For every resource, when the
// container's limit grows the pod-level cgroup is written first, and when it
// shrinks the container is written first, so that the container's limit
// never exceeds its pod's (as kubelet's doPodResizeAction sets the pod
// cgroup before the containers' limits when they grow and after when they
// shrink, pkg/kubelet/kuberuntime/kuberuntime_manager.go). Groups that
// already hold the wanted values are not written. pod may be nil.
func plan(ctr level, pod *level, pageSize int64) []step {
	var out []step
	for _, g := range groups {
		c := stepFor(ctr, g, true, pageSize)
		var p *step
		if pod != nil {
			p = stepFor(*pod, g, false, pageSize)
		}
		first, second := p, c
		if shrinks(ctr.cur, ctr.want, g.name) {
			first, second = c, p
		}
		for _, s := range []*step{first, second} {
			if s != nil {
				out = append(out, *s)
			}
		}
	}
	return out
}

func only(r cgroup.Resources, g group) cgroup.Resources {
	var out cgroup.Resources
	for _, f := range g.files {
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

func stepFor(l level, g group, container bool, pageSize int64) *step {
	want := only(l.want, g)
	if want.IsZero() || l.cur.Matches(want, pageSize) {
		return nil
	}
	prev := only(l.cur.Resources(), g)
	// Restore only what the step writes.
	if want.CPUWeight == nil {
		prev.CPUWeight = nil
	}
	if want.CPUMax == nil {
		prev.CPUMax = nil
	}
	return &step{path: l.path, group: g.name, container: container, resource: want, previous: prev}
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
