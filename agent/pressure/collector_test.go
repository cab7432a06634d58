package pressure_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/bpf"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func TestCollectorFiles(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	cgrouptest.FakePressure(t, root, "/pod/web", 2500000, 7, 2)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	c := pressure.NewCollector(func() []pressure.Target {
		return []pressure.Target{{Name: "web", PodUID: "u1", Cgroup: "/pod/web"}, {Name: "gone", Cgroup: "/pod/gone"}}
	}, pressure.Files{CG: cg})
	want := `
# HELP container_cpu_cfs_throttled_periods_total Number of throttled period intervals (cpu.stat nr_throttled).
# TYPE container_cpu_cfs_throttled_periods_total counter
container_cpu_cfs_throttled_periods_total{container="web",id="/pod/web",pod_uid="u1"} 7
# HELP container_cpu_cfs_throttled_seconds_total Total time duration the container has been throttled (cpu.stat throttled_usec).
# TYPE container_cpu_cfs_throttled_seconds_total counter
container_cpu_cfs_throttled_seconds_total{container="web",id="/pod/web",pod_uid="u1"} 0.007
# HELP container_oom_events_total Count of out of memory kills of the container's processes.
# TYPE container_oom_events_total counter
container_oom_events_total{container="web",id="/pod/web",pod_uid="u1",source="psi"} 2
# HELP container_pressure_cpu_waiting_seconds_total Total time some of the container's tasks were stalled on cpu (PSI some).
# TYPE container_pressure_cpu_waiting_seconds_total counter
container_pressure_cpu_waiting_seconds_total{container="web",id="/pod/web",pod_uid="u1"} 2.5
# HELP container_pressure_memory_stalled_seconds_total Total time all of the container's tasks were stalled on memory (PSI full).
# TYPE container_pressure_memory_stalled_seconds_total counter
container_pressure_memory_stalled_seconds_total{container="web",id="/pod/web",pod_uid="u1"} 0.125
# HELP resize_agent_pressure_read_errors Pressure reads that failed at the last scrape, by source.
# TYPE resize_agent_pressure_read_errors gauge
resize_agent_pressure_read_errors{source="psi"} 1
# HELP resize_agent_pressure_source_info The pressure sources in use (1 each).
# TYPE resize_agent_pressure_source_info gauge
resize_agent_pressure_source_info{source="psi"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"container_cpu_cfs_throttled_periods_total", "container_cpu_cfs_throttled_seconds_total", "container_oom_events_total",
		"container_pressure_cpu_waiting_seconds_total", "container_pressure_memory_stalled_seconds_total",
		"resize_agent_pressure_read_errors", "resize_agent_pressure_source_info"); err != nil {
		t.Error(err)
	}
	// The limits in force, beside the pressure: none while cpu.max and
	// memory.max are max, the kernel's values once set.
	limitNames := []string{"resize_agent_container_cpu_limit_cores", "resize_agent_container_memory_limit_bytes"}
	if n := testutil.CollectAndCount(c, limitNames...); n != 0 {
		t.Errorf("%d limit series for unlimited cgroups", n)
	}
	cgrouptest.SetFile(t, root, "/pod/web", "cpu.max", "25000 100000")
	cgrouptest.SetFile(t, root, "/pod/web", "memory.max", "134217728")
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP resize_agent_container_cpu_limit_cores The container's CPU limit in force: cpu.max's quota over its period (absent when max).
# TYPE resize_agent_container_cpu_limit_cores gauge
resize_agent_container_cpu_limit_cores{container="web",id="/pod/web",pod_uid="u1"} 0.25
# HELP resize_agent_container_memory_limit_bytes The container's memory limit in force: memory.max (absent when max).
# TYPE resize_agent_container_memory_limit_bytes gauge
resize_agent_container_memory_limit_bytes{container="web",id="/pod/web",pod_uid="u1"} 1.34217728e+08
`), limitNames...); err != nil {
		t.Error(err)
	}
	s := pressure.Summarize("/pod/web", []pressure.Source{pressure.Files{CG: cg}})
	if s.CPUStallSeconds != 2.5 || s.OOMKills != 2 || s.ThrottledPeriods != 7 || s.CPUSomeAvg10 == nil || *s.CPUSomeAvg10 != 1.5 {
		t.Errorf("Summary %+v", s)
	}
}

func TestMetricNames(t *testing.T) {
	names := pressure.MetricNames()
	for _, want := range []string{"container_oom_events_total", "container_pressure_io_stalled_seconds_total", "resize_agent_container_runqueue_latency_seconds", "resize_agent_pressure_source_info", "resize_agent_bpf_program_runs_total", "resize_agent_bpf_program_run_seconds_total",
		"resize_agent_container_cpu_limit_cores", "resize_agent_container_memory_limit_bytes"} {
		if !slices.Contains(names, want) {
			t.Errorf("pressure.MetricNames() lacks %s: %v", want, names)
		}
	}
	if len(names) != 19 {
		t.Errorf("MetricNames() has %d names, want 19: %v", len(names), names)
	}
}

// fakeTracker reports fixed program costs and no pressure.
type fakeTracker struct {
	progs []bpf.ProgramStats
	err   error
}

func (fakeTracker) Stats(uint64) (bpf.Stats, error) { return bpf.Stats{}, nil }
func (f fakeTracker) ProgramStats() ([]bpf.ProgramStats, error) {
	return f.progs, f.err
}

func TestCollectorProgramCost(t *testing.T) {
	src := pressure.BPF{T: fakeTracker{progs: []bpf.ProgramStats{
		{Name: "on_sched_switch", Runs: 4_000_000, RunTime: 620 * time.Millisecond},
		{Name: "on_mark_victim", Runs: 0},
	}}}
	c := pressure.NewCollector(func() []pressure.Target { return nil }, src)
	want := `
# HELP resize_agent_bpf_program_run_seconds_total Time spent running each of the agent's eBPF programs (kernel BPF run-time statistics; counted only while they are on).
# TYPE resize_agent_bpf_program_run_seconds_total counter
resize_agent_bpf_program_run_seconds_total{program="on_mark_victim"} 0
resize_agent_bpf_program_run_seconds_total{program="on_sched_switch"} 0.62
# HELP resize_agent_bpf_program_runs_total Runs of each of the agent's eBPF programs (kernel BPF run-time statistics; counted only while they are on).
# TYPE resize_agent_bpf_program_runs_total counter
resize_agent_bpf_program_runs_total{program="on_mark_victim"} 0
resize_agent_bpf_program_runs_total{program="on_sched_switch"} 4e+06
# HELP resize_agent_pressure_read_errors Pressure reads that failed at the last scrape, by source.
# TYPE resize_agent_pressure_read_errors gauge
resize_agent_pressure_read_errors{source="ebpf"} 0
`
	names := []string{"resize_agent_bpf_program_run_seconds_total", "resize_agent_bpf_program_runs_total", "resize_agent_pressure_read_errors"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// A failed read counts as a read error and exports no program lines.
	c = pressure.NewCollector(func() []pressure.Target { return nil }, pressure.BPF{T: fakeTracker{err: errors.New("closed")}})
	want = `
# HELP resize_agent_pressure_read_errors Pressure reads that failed at the last scrape, by source.
# TYPE resize_agent_pressure_read_errors gauge
resize_agent_pressure_read_errors{source="ebpf"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// A source without program costs (PSI files) exports none.
	if n := testutil.CollectAndCount(pressure.NewCollector(func() []pressure.Target { return nil }, pressure.Files{}), names[:2]...); n != 0 {
		t.Errorf("PSI source: %d program metrics", n)
	}
}
