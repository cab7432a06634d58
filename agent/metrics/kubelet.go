package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// KubeletVerdicts is the verdicts the agent can predict for a pods/resize
// patch and read back (agent/kube/fit's Verdicts); any other value is
// counted as "Other", so a caller's mistake cannot add series.
var KubeletVerdicts = []string{"Fit", "Deferred", "Infeasible", "Refused"}

// VerdictPredictions counts the agent's predictions of the kubelet's
// verdict on a resize against the verdict the kubelet (or the API server)
// gave: resize_agent_kubelet_verdict_predictions_total{predicted,actual}.
// The share where predicted == actual is how well the agent's capacity
// view is the kubelet's; a rising predicted="Fit",actual="Deferred" says
// it counts less than the kubelet does.
type VerdictPredictions struct{ c *prometheus.CounterVec }

// NewVerdictPredictions registers the counter with every pair of known
// verdicts at zero, so that rates and ratios exist before the first
// mismatch.
func NewVerdictPredictions(reg prometheus.Registerer) *VerdictPredictions {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "kubelet_verdict_predictions_total",
		Help:      "Resizes of Kubernetes pods by the agent's predicted verdict (from Node allocatable and the node's pods' allocated resources) and the verdict the kubelet or API server gave: Fit, Deferred, Infeasible, Refused.",
	}, []string{"predicted", "actual"})
	for _, p := range KubeletVerdicts {
		for _, a := range KubeletVerdicts {
			c.WithLabelValues(p, a)
		}
	}
	reg.MustRegister(c)
	return &VerdictPredictions{c: c}
}

// Observe counts one resize whose verdict is known.
func (v *VerdictPredictions) Observe(predicted, actual string) {
	v.c.WithLabelValues(known(predicted), known(actual)).Inc()
}

func known(v string) string {
	if slices.Contains(KubeletVerdicts, v) {
		return v
	}
	return "Other"
}
