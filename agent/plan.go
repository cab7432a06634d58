package agent

import (
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
)

// step is one cgroup file to write, with the value it holds now so that
// the step can be undone.
type step struct {
	path     string
	resource cgroup.Resources // exactly one field set
	previous cgroup.Resources // the same field, as it was
}

// files in the order the agent writes them.
var files = []string{cgroup.FileCPUWeight, cgroup.FileCPUMax, cgroup.FileMemoryMax}

// level is one cgroup in the plan: its path, what it holds now and what it
// should hold.
type level struct {
	path string
	cur  cgroup.State
	want cgroup.Resources
}

// plan orders the writes of a resize. For every file, when the container's
// value grows the pod-level cgroup is written first, and when it shrinks the
// container is written first, so that the container's limit never exceeds
// its pod's at any moment. Files that already hold the wanted value are not
// written. pod may be nil.
func plan(ctr level, pod *level, pageSize int64) []step {
	var out []step
	for _, f := range files {
		c := stepFor(ctr, f, pageSize)
		if pod == nil {
			if c != nil {
				out = append(out, *c)
			}
			continue
		}
		p := stepFor(*pod, f, pageSize)
		first, second := p, c
		if shrinks(ctr.cur, ctr.want, f) {
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

func stepFor(l level, file string, pageSize int64) *step {
	want := l.want.Only(file)
	if want.IsZero() || l.cur.Matches(want, pageSize) {
		return nil
	}
	return &step{path: l.path, resource: want, previous: l.cur.Resources().Only(file)}
}

// shrinks reports whether file's value goes down from cur to want.
func shrinks(cur cgroup.State, want cgroup.Resources, file string) bool {
	switch file {
	case cgroup.FileCPUWeight:
		return want.CPUWeight != nil && *want.CPUWeight < cur.CPUWeight
	case cgroup.FileCPUMax:
		return want.CPUMax != nil && cpuRate(*want.CPUMax) < cpuRate(cur.CPUMax)
	case cgroup.FileMemoryMax:
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

// podResources is the pod-level cgroup for these containers, as the kubelet
// computes it (pkg/kubelet/cm/helpers_linux.go, ResourceConfigForPod):
// cpu.weight from the sum of the CPU requests; cpu.max from the sum of the
// CPU limits, but only when every container has one; memory.max likewise.
func podResources(containers []intent.Resources, period uint64) intent.Resources {
	var sum intent.Resources
	cpuLimited, memLimited := true, true
	for _, r := range containers {
		sum.CPURequest += r.CPURequest
		sum.CPULimit += r.CPULimit
		sum.MemoryLimit += r.MemoryLimit
		cpuLimited = cpuLimited && r.CPULimit > 0
		memLimited = memLimited && r.MemoryLimit > 0
	}
	if !cpuLimited {
		sum.CPULimit = 0
	}
	if !memLimited {
		sum.MemoryLimit = 0
	}
	return sum
}
