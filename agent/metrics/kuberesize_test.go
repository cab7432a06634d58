package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The completed series exist before any resize (the dashboard and the
// monitoring test read them); an unknown phase or outcome adds none.
func TestKubeResize(t *testing.T) {
	reg := prometheus.NewRegistry()
	k := NewKubeResize(reg)
	if n := testutil.CollectAndCount(reg, "resize_agent_kube_resize_duration_seconds"); n != len(KubePhases) {
		t.Fatalf("%d series at start, want %d", n, len(KubePhases))
	}
	k.Observe("status", "infeasible", 1.5)
	k.Observe("bogus", "completed", 1)
	k.Observe("status", "bogus", 1)
	var nilK *KubeResize
	nilK.Observe("status", "completed", 1) // no metrics: no panic
	if n := testutil.CollectAndCount(reg, "resize_agent_kube_resize_duration_seconds"); n != len(KubePhases)+1 {
		t.Errorf("%d series, want %d", n, len(KubePhases)+1)
	}
}
