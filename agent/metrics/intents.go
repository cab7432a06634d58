package metrics

import (
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/spec"
)

// waiting are the states an intent can be stuck in; the alerts on stuck
// resizes are built on them.
var waiting = []intent.State{intent.Proposed, intent.InProgress, intent.Deferred}

var (
	intentsDesc = prometheus.NewDesc(namespace+"_intents",
		"Intents not yet terminal, by state (Proposed, InProgress, Deferred).", []string{"state"}, nil)
	oldestDesc = prometheus.NewDesc(namespace+"_intent_oldest_seconds",
		"Age of the oldest intent in each waiting state, from its acceptance; 0 when there is none.", []string{"state"}, nil)
	loweredDesc = prometheus.NewDesc(namespace+"_container_memory_limit_lowered_timestamp_seconds",
		"When the agent last completed a resize that lowered the container's memory.max (Unix time), among the intents it still remembers. Joins container_oom_events_total on container, pod_uid and id.",
		[]string{"container", "pod_uid", "id"}, nil)
)

// RegisterIntents registers the gauges read from the agent's intents at
// each scrape: list returns the intents the agent holds in one state.
func RegisterIntents(reg prometheus.Registerer, list func(intent.State) []intent.Intent, now func() time.Time) {
	reg.MustRegister(&intentCollector{list: list, now: now})
}

type intentCollector struct {
	list func(intent.State) []intent.Intent
	now  func() time.Time
}

func (c *intentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- intentsDesc
	ch <- oldestDesc
	ch <- loweredDesc
}

func (c *intentCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, s := range waiting {
		its := c.list(s)
		var oldest time.Duration
		for _, it := range its {
			if age := now.Sub(it.Status.AcceptedAt); age > oldest {
				oldest = age
			}
		}
		ch <- prometheus.MustNewConstMetric(intentsDesc, prometheus.GaugeValue, float64(len(its)), string(s))
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, oldest.Seconds(), string(s))
	}
	for _, l := range lowered(c.list(intent.Completed)) {
		ch <- prometheus.MustNewConstMetric(loweredDesc, prometheus.GaugeValue, float64(l.at.UnixNano())/1e9, l.name, l.podUID, l.cgroup)
	}
}

type lowering struct {
	name, podUID, cgroup string
	at                   time.Time
}

// lowered finds, per container cgroup, the last completed intent that wrote
// a memory.max below the one its previous completed intent wrote. The
// container's own cgroup is the deepest one an intent applied (the pod's
// cgroup, when managed, is its parent).
func lowered(done []intent.Intent) []lowering {
	sort.SliceStable(done, func(i, j int) bool { return completedAt(done[i]).Before(completedAt(done[j])) })
	last := map[string]int64{} // memory.max last written, by cgroup
	out := map[string]lowering{}
	for _, it := range done {
		cg := ""
		for _, c := range it.Status.Applied {
			if len(c.Cgroup) > len(cg) {
				cg = c.Cgroup
			}
		}
		mem, ok := memoryMax(it.Status.Applied.Of(cg))
		if !ok {
			continue
		}
		if prev, seen := last[cg]; seen && limitOf(mem) < limitOf(prev) {
			out[cg] = lowering{name: it.Spec.Target.Name, podUID: it.Spec.Target.PodUID, cgroup: cg, at: completedAt(it)}
		}
		last[cg] = mem
	}
	res := make([]lowering, 0, len(out))
	for _, l := range out {
		res = append(res, l)
	}
	sort.Slice(res, func(i, j int) bool { return res[i].cgroup < res[j].cgroup })
	return res
}

func completedAt(it intent.Intent) time.Time {
	if it.Status.CompletedAt != nil {
		return *it.Status.CompletedAt
	}
	return it.Status.UpdatedAt
}

func memoryMax(vs []spec.Value) (int64, bool) {
	for _, v := range vs {
		if v.File == spec.FileMemoryMax {
			n, err := spec.ParseMax(v.Data)
			return n, err == nil
		}
	}
	return 0, false
}

// limitOf orders memory.max values, "max" above every number.
func limitOf(v int64) uint64 {
	if v == spec.Unlimited {
		return ^uint64(0)
	}
	return uint64(v)
}
