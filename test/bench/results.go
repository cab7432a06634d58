package main

import (
	"math"
	"slices"
	"time"
)

// Summary is a latency distribution in milliseconds.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50Ms"`
	P90  float64 `json:"p90Ms"`
	P99  float64 `json:"p99Ms"`
	Mean float64 `json:"meanMs"`
	Min  float64 `json:"minMs"`
	Max  float64 `json:"maxMs"`
}

// summarize sorts d and returns its distribution (nearest-rank percentiles).
func summarize(d []time.Duration) Summary {
	if len(d) == 0 {
		return Summary{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) }
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	var sum time.Duration
	for _, x := range s {
		sum += x
	}
	return Summary{N: len(s), P50: rank(0.50), P90: rank(0.90), P99: rank(0.99),
		Mean: ms(sum) / float64(len(s)), Min: ms(s[0]), Max: ms(s[len(s)-1])}
}

// Results is what one guest run writes to results.json.
type Results struct {
	Meta       Meta            `json:"meta"`
	Latency    []LatencyRow    `json:"latency"`
	Throughput []ThroughputRow `json:"throughput"`
	Scaling    []ScalingRow    `json:"scaling"`
	Cost       []CostRow       `json:"cost"`
	Phases     []Phase         `json:"phases"`
}

// Meta describes the run.
type Meta struct {
	N          int       `json:"n"`
	NRuntime   int       `json:"nRuntime"`
	Kernel     string    `json:"kernel"`
	CPUs       int       `json:"cpus"`
	Containerd string    `json:"containerd"`
	Runc       string    `json:"runc"`
	BPF        string    `json:"bpf"`
	Start      time.Time `json:"start"`
	End        time.Time `json:"end"`
	Notes      []string  `json:"notes,omitempty"`
}

// LatencyRow is one way of making the same change, to verified on the
// cgroup file.
type LatencyRow struct {
	Method string   `json:"method"`
	What   string   `json:"what"`
	Client Summary  `json:"client"`
	Server *Summary `json:"server,omitempty"` // the intent's AcceptedAt -> CompletedAt
	Errors int      `json:"errors"`
}

// ThroughputRow is a run of concurrent resizes across Managed cgroups.
type ThroughputRow struct {
	// Peer names a row that is not the agent's resizes but their peer
	// (roundTripRow), measured the same way; empty for the agent's.
	Peer    string  `json:"peer,omitempty"`
	Managed int     `json:"managed"`
	Workers int     `json:"workers"`
	Resizes int     `json:"resizes"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"perSec"`
	Client  Summary `json:"client"`
	Server  Summary `json:"server"`
	Errors  int     `json:"errors"`
	// The agent's CPU during the run, in percent of one CPU.
	AgentCPU float64 `json:"agentCPUPercent"`
}

// ScalingRow is sequential resizes of one cgroup while the agent manages
// Managed containers.
type ScalingRow struct {
	Managed int     `json:"managed"`
	Client  Summary `json:"client"`
	Server  Summary `json:"server"`
}

// CostRow is the agent's own use over one interval.
type CostRow struct {
	BPF        string  `json:"bpf"`
	Phase      string  `json:"phase"`
	Managed    int     `json:"managed"`
	Seconds    float64 `json:"seconds"`
	CPUPercent float64 `json:"cpuPercent"` // of one CPU
	RSSKiB     int64   `json:"rssKiB"`
	HWMKiB     int64   `json:"hwmKiB"`
	AnonKiB    int64   `json:"anonKiB,omitempty"`
	FileKiB    int64   `json:"fileKiB,omitempty"`
	ShmemKiB   int64   `json:"shmemKiB,omitempty"`
	Resizes    int     `json:"resizes"`
	CPUPerOpMs float64 `json:"cpuPerResizeMs,omitempty"`
}

// Phase is how long a part of the run took.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}
