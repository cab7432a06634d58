package reclaim

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/resizer/resize-agent/agent/actuate"
)

type metrics struct {
	reclaims *prometheus.CounterVec
	bytes    prometheus.Counter
	duration prometheus.Histogram
	applied  prometheus.Histogram
}

var buckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		reclaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "resize_agent", Name: "kubelet_decrease_reclaims_total",
			Help: "Reclaims ahead of a kubelet memory limit decrease below usage, by outcome (reclaimed, failed).",
		}, []string{"outcome"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "resize_agent", Name: "kubelet_decrease_reclaimed_bytes_total",
			Help: "Memory reclaimed ahead of kubelet memory limit decreases.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "resize_agent", Name: "kubelet_decrease_reclaim_seconds",
			Help: "Time one reclaim ahead of a kubelet memory limit decrease took.", Buckets: buckets,
		}),
		applied: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "resize_agent", Name: "kubelet_decrease_applied_seconds",
			Help: "Time from the reclaim to the kubelet reporting the lower memory limit.", Buckets: buckets,
		}),
	}
	if reg != nil {
		reg.MustRegister(m.reclaims, m.bytes, m.duration, m.applied)
	}
	return m
}

func (m *metrics) observe(r actuate.Reclaimed) {
	outcome := "reclaimed"
	if r.Err != nil {
		outcome = "failed"
	}
	m.reclaims.WithLabelValues(outcome).Inc()
	m.bytes.Add(float64(r.Amount()))
	m.duration.Observe(r.Took.Seconds())
}
