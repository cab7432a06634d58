package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/spec"
)

func TestIntentGauges(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	done := func(name, cg, mem string, ago time.Duration) intent.Intent {
		c := at(ago)
		return intent.Intent{Spec: intent.Spec{Target: intent.Target{Name: name, PodUID: "uid-" + name}},
			Status: intent.Status{State: intent.Completed, CompletedAt: &c, UpdatedAt: c,
				Applied: intent.Applied{{Cgroup: "/kubepods/pod-" + name, Values: []spec.Value{{File: "cpu.weight", Data: "10"}}},
					{Cgroup: cg, Values: []spec.Value{{File: "cpu.max", Data: "max 100000"}, {File: "memory.max", Data: mem}}}}}}
	}
	byState := map[intent.State][]intent.Intent{
		intent.Deferred:   {{Status: intent.Status{State: intent.Deferred, AcceptedAt: at(90 * time.Second)}}, {Status: intent.Status{State: intent.Deferred, AcceptedAt: at(30 * time.Second)}}},
		intent.InProgress: {{Status: intent.Status{State: intent.InProgress, AcceptedAt: at(2 * time.Second)}}},
		// web: 256Mi, max, then 128Mi (lowered 60 s ago); db: raised only;
		// cache: its first intent (nothing to compare with).
		intent.Completed: {
			done("web", "/kubepods/pod-web/web", "134217728", 60*time.Second),
			done("db", "/kubepods/pod-db/db", "100000000", 500*time.Second),
			done("web", "/kubepods/pod-web/web", "268435456", 600*time.Second),
			done("web", "/kubepods/pod-web/web", "max", 300*time.Second),
			done("db", "/kubepods/pod-db/db", "200000000", 100*time.Second),
			done("cache", "/kubepods/pod-cache/cache", "1000", 10*time.Second),
		},
	}
	reg := prometheus.NewPedanticRegistry()
	RegisterIntents(reg, func(s intent.State) []intent.Intent { return append([]intent.Intent(nil), byState[s]...) }, func() time.Time { return now })
	want := `
# HELP resize_agent_container_memory_limit_lowered_timestamp_seconds When the agent last completed a resize that lowered the container's memory.max (Unix time), among the intents it still remembers. Joins container_oom_events_total on container, pod_uid and id.
# TYPE resize_agent_container_memory_limit_lowered_timestamp_seconds gauge
resize_agent_container_memory_limit_lowered_timestamp_seconds{container="web",id="/kubepods/pod-web/web",pod_uid="uid-web"} 1.79629194e+09
# HELP resize_agent_intent_oldest_seconds Age of the oldest intent in each waiting state, from its acceptance; 0 when there is none.
# TYPE resize_agent_intent_oldest_seconds gauge
resize_agent_intent_oldest_seconds{state="Deferred"} 90
resize_agent_intent_oldest_seconds{state="InProgress"} 2
resize_agent_intent_oldest_seconds{state="Proposed"} 0
# HELP resize_agent_intents Intents not yet terminal, by state (Proposed, InProgress, Deferred).
# TYPE resize_agent_intents gauge
resize_agent_intents{state="Deferred"} 2
resize_agent_intents{state="InProgress"} 1
resize_agent_intents{state="Proposed"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
