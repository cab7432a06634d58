package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/resizer/resize-agent/agent/kube/fit"
	"github.com/resizer/resize-agent/agent/metrics"
)

func TestVerdictPredictions(t *testing.T) {
	// The label values are agent/kube/fit's verdicts, in order.
	if len(fit.Verdicts) != len(metrics.KubeletVerdicts) {
		t.Fatalf("fit has %v, metrics %v", fit.Verdicts, metrics.KubeletVerdicts)
	}
	for i, v := range fit.Verdicts {
		if string(v) != metrics.KubeletVerdicts[i] {
			t.Fatalf("fit has %v, metrics %v", fit.Verdicts, metrics.KubeletVerdicts)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	v := metrics.NewVerdictPredictions(reg)
	v.Observe("Fit", "Deferred")
	v.Observe("Deferred", "Deferred")
	v.Observe("Deferred", "Deferred")
	v.Observe("Fit", "bogus")
	if n := testutil.CollectAndCount(reg); n != 17 {
		t.Errorf("%d series, want the 16 known pairs and one Other", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			got[l["predicted"]+"/"+l["actual"]] = m.GetCounter().GetValue()
		}
	}
	for pair, n := range map[string]float64{"Deferred/Deferred": 2, "Fit/Deferred": 1, "Fit/Fit": 0, "Fit/Other": 1, "Refused/Infeasible": 0} {
		if v, ok := got[pair]; !ok || v != n {
			t.Errorf("%s = %v (present %v), want %v", pair, v, ok, n)
		}
	}
}
