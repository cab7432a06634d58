package actuate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/resizer/resize-agent/cgroup"
)

// cpuMem is a cgroup.Resources with cpu.max (millicores of quota, 0: max)
// and memory.max (bytes, 0: max), and cpu.weight w.
func cpuMem(milli int64, w uint64, mem int64) cgroup.Resources {
	q, m := cgroup.Unlimited, cgroup.Unlimited
	if milli > 0 {
		q = milli * 100
	}
	if mem > 0 {
		m = mem
	}
	return cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: q, Period: 100000}, CPUWeight: &w, MemoryMax: &m}
}

func state(r cgroup.Resources) cgroup.State {
	return cgroup.State{CPUMax: *r.CPUMax, CPUWeight: *r.CPUWeight, MemoryMax: *r.MemoryMax}
}

// order renders steps as "path:group" in order, a pod's CPU parts as
// "path:file".
func order(steps []step) string {
	var out []string
	for _, s := range steps {
		name := s.group
		if v := s.resource.Values(); !s.container && s.group == "cpu" && len(v) == 1 {
			name = v[0].File
		}
		out = append(out, s.path+":"+name)
	}
	return strings.Join(out, " ")
}

// TestPlanOrder: memory, then CPU, as kubelet 1.34-1.37 doPodResizeAction;
// for each, the pod cgroup's values that grow are written before the
// container (limit, then request) and those that shrink after, so that the
// container's limit never exceeds its pod's at any moment; groups that
// already hold the wanted values are left out.
func TestPlanOrder(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		name           string
		cur, want      cgroup.Resources
		podCur, podWan cgroup.Resources
		noPod          bool
		steps          string
	}{
		{name: "both grow",
			cur: cpuMem(500, 20, 128*mi), want: cpuMem(1000, 40, 256*mi),
			podCur: cpuMem(1000, 40, 256*mi), podWan: cpuMem(1500, 60, 384*mi),
			steps: "/pod:memory /pod/c:memory /pod:cpu.max /pod:cpu.weight /pod/c:cpu"},
		{name: "both shrink",
			cur: cpuMem(1000, 40, 256*mi), want: cpuMem(500, 20, 128*mi),
			podCur: cpuMem(1500, 60, 384*mi), podWan: cpuMem(1000, 40, 256*mi),
			steps: "/pod/c:memory /pod:memory /pod/c:cpu /pod:cpu.max /pod:cpu.weight"},
		{name: "cpu grows, memory shrinks",
			cur: cpuMem(500, 20, 256*mi), want: cpuMem(1000, 40, 128*mi),
			podCur: cpuMem(1000, 40, 384*mi), podWan: cpuMem(1500, 60, 256*mi),
			steps: "/pod/c:memory /pod:memory /pod:cpu.max /pod:cpu.weight /pod/c:cpu"},
		{name: "limit to unlimited is growth",
			cur: cpuMem(500, 20, 128*mi), want: cpuMem(0, 20, 0),
			podCur: cpuMem(1000, 40, 256*mi), podWan: cpuMem(0, 40, 0),
			steps: "/pod:memory /pod/c:memory /pod:cpu.max /pod/c:cpu"},
		{name: "same quota, lower weight shrinks",
			cur: cpuMem(500, 40, 128*mi), want: cpuMem(500, 20, 128*mi),
			podCur: cpuMem(1000, 60, 256*mi), podWan: cpuMem(1000, 40, 256*mi),
			steps: "/pod/c:cpu /pod:cpu.weight"},
		{name: "pod limit grows, pod request shrinks",
			cur: cpuMem(500, 40, 128*mi), want: cpuMem(1000, 20, 128*mi),
			podCur: cpuMem(1000, 60, 256*mi), podWan: cpuMem(1500, 40, 256*mi),
			steps: "/pod:cpu.max /pod/c:cpu /pod:cpu.weight"},
		{name: "pod already holds its values",
			cur: cpuMem(500, 20, 128*mi), want: cpuMem(1000, 40, 128*mi),
			podCur: cpuMem(1500, 60, 256*mi), podWan: cpuMem(1500, 60, 256*mi),
			steps: "/pod/c:cpu"},
		{name: "no change", cur: cpuMem(500, 20, 128*mi), want: cpuMem(500, 20, 128*mi), noPod: true, steps: ""},
		{name: "no pod", cur: cpuMem(1000, 40, 256*mi), want: cpuMem(500, 20, 512*mi), noPod: true,
			steps: "/pod/c:memory /pod/c:cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctr := level{path: "/pod/c", cur: state(tc.cur), want: tc.want}
			var pod *level
			if !tc.noPod {
				pod = &level{path: "/pod", cur: state(tc.podCur), want: tc.podWan}
			}
			steps := plan(ctr, pod, 4096)
			if got := order(steps); got != tc.steps {
				t.Errorf("steps %q, want %q", got, tc.steps)
			}
			for _, s := range steps {
				if s.container != (s.path == "/pod/c") {
					t.Errorf("step %s:%s container=%v", s.path, s.group, s.container)
				}
			}
		})
	}
}

// TestPlanStepsUndoWhatTheyWrite: a step's previous values are those of
// the files it writes, and only those, so that a rollback restores exactly
// what was there.
func TestPlanStepsUndoWhatTheyWrite(t *testing.T) {
	cur := cpuMem(500, 20, 128<<20)
	want := cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 100000, Period: 100000}} // cpu.max only
	steps := plan(level{path: "/c", cur: state(cur), want: want}, nil, 4096)
	if len(steps) != 1 {
		t.Fatalf("steps %q, want one cpu step", order(steps))
	}
	s := steps[0]
	if got, want := fmt.Sprint(s.resource.Values()), "[{cpu.max 100000 100000}]"; got != want {
		t.Errorf("writes %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(s.previous.Values()), "[{cpu.max 50000 100000}]"; got != want {
		t.Errorf("restores %s, want %s (cpu.weight is not written, so not restored)", got, want)
	}
}

// TestPlanMemoryPageRounding: a memory.max the kernel holds rounded down to
// a page is not written again.
func TestPlanMemoryPageRounding(t *testing.T) {
	cur := cpuMem(500, 20, 100*4096)
	want := cpuMem(500, 20, 100*4096+100)
	if steps := plan(level{path: "/c", cur: state(cur), want: want}, nil, 4096); len(steps) != 0 {
		t.Errorf("steps %q for a value the file holds once page-aligned", order(steps))
	}
}
