package pressure

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/resizer/resize-agent/bpf"
)

// Target is one container to collect for.
type Target struct {
	Name, PodUID, Cgroup string
}

var labels = []string{"container", "pod_uid", "id"}

// Names follow cAdvisor's where cAdvisor has the same figure, so that
// dashboards built for it work; the rest are the agent's own.
var (
	descPeriods   = prometheus.NewDesc("container_cpu_cfs_periods_total", "Number of elapsed enforcement period intervals (cpu.stat nr_periods).", labels, nil)
	descThrottled = prometheus.NewDesc("container_cpu_cfs_throttled_periods_total", "Number of throttled period intervals (cpu.stat nr_throttled).", labels, nil)
	descThrotSec  = prometheus.NewDesc("container_cpu_cfs_throttled_seconds_total", "Total time duration the container has been throttled (cpu.stat throttled_usec).", labels, nil)
	descPSI       = map[string][2]*prometheus.Desc{}
	descOOM       = prometheus.NewDesc("container_oom_events_total", "Count of out of memory kills of the container's processes.", append(labels, "source"), nil)
	descRunq      = prometheus.NewDesc("resize_agent_container_runqueue_latency_seconds", "Time from a task becoming runnable to it running, per container (eBPF).", labels, nil)
	descReclaim   = prometheus.NewDesc("resize_agent_container_memory_reclaim_stall_seconds_total", "Time the container's tasks spent in memcg reclaim (eBPF).", labels, nil)
	descReclaims  = prometheus.NewDesc("resize_agent_container_memory_reclaims_total", "Memcg reclaim runs by the container's tasks (eBPF).", labels, nil)
	descCPULimit  = prometheus.NewDesc("resize_agent_container_cpu_limit_cores", "The container's CPU limit in force: cpu.max's quota over its period (absent when max).", labels, nil)
	descMemLimit  = prometheus.NewDesc("resize_agent_container_memory_limit_bytes", "The container's memory limit in force: memory.max (absent when max).", labels, nil)
	descErr       = prometheus.NewDesc("resize_agent_pressure_read_errors", "Pressure reads that failed at the last scrape, by source.", []string{"source"}, nil)
	descSource    = prometheus.NewDesc("resize_agent_pressure_source_info", "The pressure sources in use (1 each).", []string{"source"}, nil)
	// The eBPF programs' own cost, as ebpf_exporter exports it: the
	// kernel's run_cnt and run_time_ns of each program, which count only
	// while BPF run-time statistics are on (the daemon turns them on).
	descProgRuns = prometheus.NewDesc("resize_agent_bpf_program_runs_total", "Runs of each of the agent's eBPF programs (kernel BPF run-time statistics; counted only while they are on).", []string{"program"}, nil)
	descProgTime = prometheus.NewDesc("resize_agent_bpf_program_run_seconds_total", "Time spent running each of the agent's eBPF programs (kernel BPF run-time statistics; counted only while they are on).", []string{"program"}, nil)
)

// programSource is a Source that also reports its eBPF programs' cost.
type programSource interface {
	Programs() ([]bpf.ProgramStats, error)
}

func init() {
	for _, r := range []string{"cpu", "memory", "io"} {
		descPSI[r] = [2]*prometheus.Desc{
			prometheus.NewDesc("container_pressure_"+r+"_waiting_seconds_total", "Total time some of the container's tasks were stalled on "+r+" (PSI some).", labels, nil),
			prometheus.NewDesc("container_pressure_"+r+"_stalled_seconds_total", "Total time all of the container's tasks were stalled on "+r+" (PSI full).", labels, nil),
		}
	}
}

// Collector reads every source for every target at scrape time.
type Collector struct {
	targets func() []Target
	sources []Source
}

// NewCollector returns a collector over the targets that targets lists.
func NewCollector(targets func() []Target, sources ...Source) *Collector {
	return &Collector{targets: targets, sources: sources}
}

// Describe sends nothing: the collector is unchecked, since what it
// exports depends on the sources.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	errs := map[string]int{}
	for _, src := range c.sources {
		ch <- prometheus.MustNewConstMetric(descSource, prometheus.GaugeValue, 1, src.Name())
		errs[src.Name()] = 0
		if ps, ok := src.(programSource); ok {
			progs, err := ps.Programs()
			if err != nil {
				errs[src.Name()]++
			}
			for _, p := range progs {
				ch <- prometheus.MustNewConstMetric(descProgRuns, prometheus.CounterValue, float64(p.Runs), p.Name)
				ch <- prometheus.MustNewConstMetric(descProgTime, prometheus.CounterValue, p.RunTime.Seconds(), p.Name)
			}
		}
	}
	var limits LimitSource
	for _, src := range c.sources {
		if ls, ok := src.(LimitSource); ok {
			limits = ls
			break
		}
	}
	for _, t := range c.targets() {
		lv := []string{t.Name, t.PodUID, t.Cgroup}
		if limits != nil {
			// Beside the pressure, what the cgroup is held to: the
			// dashboard draws them together. A cgroup that cannot be
			// read is counted by the pressure reads below.
			if l, err := limits.Limits(t.Cgroup); err == nil {
				if l.CPUCores > 0 {
					ch <- prometheus.MustNewConstMetric(descCPULimit, prometheus.GaugeValue, l.CPUCores, lv...)
				}
				if l.MemoryBytes > 0 {
					ch <- prometheus.MustNewConstMetric(descMemLimit, prometheus.GaugeValue, float64(l.MemoryBytes), lv...)
				}
			}
		}
		oomDone := false
		for _, src := range c.sources {
			s, err := src.Read(t.Cgroup)
			if err != nil {
				errs[src.Name()]++
				continue
			}
			if !oomDone {
				ch <- prometheus.MustNewConstMetric(descOOM, prometheus.CounterValue, float64(s.OOMKills), append(lv, s.Source)...)
				oomDone = true
			}
			if f := s.Files; f != nil {
				ch <- prometheus.MustNewConstMetric(descPeriods, prometheus.CounterValue, float64(f.Periods), lv...)
				ch <- prometheus.MustNewConstMetric(descThrottled, prometheus.CounterValue, float64(f.ThrottledPeriods), lv...)
				ch <- prometheus.MustNewConstMetric(descThrotSec, prometheus.CounterValue, f.Throttled.Seconds(), lv...)
				if f.HasPSI {
					for r, p := range map[string][2]float64{
						"cpu":    {f.CPU.Some.Seconds(), f.CPU.Full.Seconds()},
						"memory": {f.Memory.Some.Seconds(), f.Memory.Full.Seconds()},
						"io":     {f.IO.Some.Seconds(), f.IO.Full.Seconds()},
					} {
						ch <- prometheus.MustNewConstMetric(descPSI[r][0], prometheus.CounterValue, p[0], lv...)
						ch <- prometheus.MustNewConstMetric(descPSI[r][1], prometheus.CounterValue, p[1], lv...)
					}
				}
			}
			if h := s.RunqLatency; h != nil {
				buckets := make(map[float64]uint64, len(h.Bounds))
				for i, b := range h.Bounds {
					buckets[b] = h.Counts[i]
				}
				ch <- prometheus.MustNewConstHistogram(descRunq, h.Count, h.Sum.Seconds(), buckets, lv...)
				ch <- prometheus.MustNewConstMetric(descReclaim, prometheus.CounterValue, s.MemoryStall.Seconds(), lv...)
				ch <- prometheus.MustNewConstMetric(descReclaims, prometheus.CounterValue, float64(s.Reclaims), lv...)
			}
		}
	}
	for src, n := range errs {
		ch <- prometheus.MustNewConstMetric(descErr, prometheus.GaugeValue, float64(n), src)
	}
}
