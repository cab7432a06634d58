// Package metrics defines the agent's Prometheus metrics.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const namespace = "resize_agent"

// Metrics are the agent's own collectors.
type Metrics struct {
	// ResizeDuration is the time from an intent being accepted to its
	// values being verified on the cgroup files (or to its other terminal
	// state), observed once per resource the intent changes.
	ResizeDuration *prometheus.HistogramVec
	// Resizes counts intents by outcome: every terminal state, and an
	// intent's first entry into Deferred.
	Resizes *prometheus.CounterVec
	// InFlight is the number of intents not yet terminal.
	InFlight prometheus.Gauge
	// CgroupWrites counts cgroup file writes by file and result.
	CgroupWrites *prometheus.CounterVec
	// RuntimeCalls counts CRI update and restart calls by result.
	RuntimeCalls *prometheus.CounterVec
	// Drift counts drifts of managed cgroup files (values another writer
	// changed) by resource and what the agent did (report, restore, adopt,
	// refuse, backoff); each drift is counted once per action.
	Drift *prometheus.CounterVec
	// DriftedContainers is the number of containers drifted at the last check.
	DriftedContainers prometheus.Gauge
	// DriftChecks counts the drift checks done, by what they compare
	// the files with: "intent" (the agent's last completed intent) or
	// "allocation" (what the kubelet allocated, Kubernetes mode).
	DriftChecks *prometheus.CounterVec
	// ResizePhase splits ResizeDuration by phase (see Phases), once per
	// intent that reached InProgress.
	ResizePhase *prometheus.HistogramVec
}

// Phases of an applied resize, in order: admission (accepted to admitted:
// the queue behind the container's earlier intents and any time Deferred),
// reclaim (bringing memory usage under a lower limit first), runtime (CRI
// UpdateContainerResources or a restart), verify (reading the cgroup files
// back, and the agent's own writes with their read-back). The kubelet's
// kubelet_pod_resize_duration_seconds has only the total.
var Phases = []string{"admission", "reclaim", "runtime", "verify"}

// Buckets span a direct cgroup write (well under a millisecond) to a
// Deferred intent that waits minutes for capacity.
var Buckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// New creates the metrics and registers them, with the Go and process
// collectors, on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ResizeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "resize_duration_seconds",
			Help:      "Time from a resize intent being accepted to its cgroup values being verified (or its other outcome), per resource changed.",
			Buckets:   Buckets,
		}, []string{"resource", "outcome"}),
		Resizes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "resizes_total",
			Help:      "Resize intents by outcome (completed, failed, infeasible, superseded; deferred counts each intent's first deferral).",
		}, []string{"outcome"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "intents_in_flight",
			Help:      "Resize intents accepted and not yet in a terminal state (proposed, in progress or deferred).",
		}),
		CgroupWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "cgroup_writes_total",
			Help:      "Writes of cgroup files, by file and result (ok, error, rollback).",
		}, []string{"file", "result"}),
		RuntimeCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "runtime_calls_total",
			Help:      "Calls to the container runtime (CRI UpdateContainerResources, restarts), by result.",
		}, []string{"result"}),
	}
	reg.MustRegister(m.ResizeDuration, m.Resizes, m.InFlight, m.CgroupWrites, m.RuntimeCalls,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	newDrift(m, reg)
	newPhase(m, reg)
	for _, o := range []string{"completed", "failed", "infeasible", "deferred", "superseded"} {
		m.Resizes.WithLabelValues(o)
	}
	return m
}

// Node is read by the node gauges at scrape time.
type Node interface {
	AllocatableMilliCPU() int64
	AllocatableMemory() int64
	AllocatedMilliCPU() int64
	AllocatedMemory() int64
	ManagedContainers() int
}

// RegisterNode registers the node allocatable/allocated gauges, in base
// units (cores, bytes), read from n at each scrape.
func RegisterNode(reg prometheus.Registerer, n Node) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("node_allocatable_cpu_cores", "CPU the agent may hand out on this node.", func() float64 { return float64(n.AllocatableMilliCPU()) / 1000 }),
		gauge("node_allocatable_memory_bytes", "Memory the agent may hand out on this node.", func() float64 { return float64(n.AllocatableMemory()) }),
		gauge("node_allocated_cpu_cores", "Sum of the CPU requests of the containers the agent manages.", func() float64 { return float64(n.AllocatedMilliCPU()) / 1000 }),
		gauge("node_allocated_memory_bytes", "Sum of the memory requests of the containers the agent manages.", func() float64 { return float64(n.AllocatedMemory()) }),
		gauge("managed_containers", "Containers the agent manages.", func() float64 { return float64(n.ManagedContainers()) }),
	)
}

func newDrift(m *Metrics, reg prometheus.Registerer) {
	m.Drift = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "drift_total",
		Help:      "Managed cgroup values found changed behind the agent's back, by resource and action (report, restore, adopt, refuse, backoff).",
	}, []string{"resource", "action"})
	m.DriftedContainers = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "drifted_containers",
		Help:      "Managed containers whose cgroup values differed from their last completed intent at the last drift check.",
	})
	// A check that stopped (a hung runtime call, a dead loop) shows as
	// this counter standing still, where drift_total alone would read as
	// "no drift".
	m.DriftChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "drift_checks_total",
		Help:      "Drift checks done, by what the files are compared with: intent (the agent's last completed intent) or allocation (what the kubelet allocated).",
	}, []string{"against"})
	reg.MustRegister(m.Drift, m.DriftedContainers, m.DriftChecks)
	m.DriftChecks.WithLabelValues("intent")
	m.DriftChecks.WithLabelValues("allocation")
	for _, r := range []string{"cpu", "memory"} {
		for _, a := range []string{"report", "restore", "adopt", "refuse", "backoff"} {
			m.Drift.WithLabelValues(r, a)
		}
	}
}

func newPhase(m *Metrics, reg prometheus.Registerer) {
	m.ResizePhase = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "resize_phase_duration_seconds",
		Help:      "Time an applied resize intent spent in each phase: admission (accepted to admitted, Deferred time included), reclaim, runtime (CRI update or restart), verify (cgroup writes and read-back).",
		Buckets:   Buckets,
	}, []string{"phase", "outcome"})
	reg.MustRegister(m.ResizePhase)
}
