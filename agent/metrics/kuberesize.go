package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// KubePhases are the phases of a Kubernetes in-place resize as the agent
// sees it, in order (agent/kube/latency): accepted (the API server's time
// of the change to the agent seeing it), admitted (the kubelet's
// admission), cgroup (the container's files hold the new values), status
// (status.containerStatuses[].resources report them). Every phase but
// accepted counts from the agent seeing the change.
var KubePhases = []string{"accepted", "admitted", "cgroup", "status"}

// KubeOutcomes are the outcomes of a measured resize.
var KubeOutcomes = []string{"completed", "infeasible", "superseded", "timeout", "gone"}

// KubeResize is resize_agent_kube_resize_duration_seconds{phase,outcome}:
// unlike resize_agent_resize_phase_duration_seconds, which times the
// agent's own intents, it times every Kubernetes resize on the node.
type KubeResize struct{ h *prometheus.HistogramVec }

// NewKubeResize registers the histogram.
func NewKubeResize(reg prometheus.Registerer) *KubeResize {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "kube_resize_duration_seconds",
		Help:      "Kubernetes in-place resizes of this node's pods, whoever asked: time from the agent seeing the spec change to each phase (admitted, cgroup, status); accepted is the API server's time of the change to the agent seeing it.",
		Buckets:   Buckets,
	}, []string{"phase", "outcome"})
	reg.MustRegister(h)
	// The completed series exist from the start, for dashboards and rates.
	for _, ph := range KubePhases {
		h.WithLabelValues(ph, "completed")
	}
	return &KubeResize{h: h}
}

// Observe records one phase of one resize; unknown names are dropped so a
// caller's mistake cannot add series.
func (k *KubeResize) Observe(phase, outcome string, seconds float64) {
	if k == nil || !slices.Contains(KubePhases, phase) || !slices.Contains(KubeOutcomes, outcome) {
		return
	}
	k.h.WithLabelValues(phase, outcome).Observe(seconds)
}
