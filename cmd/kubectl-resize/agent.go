package main

import (
	"context"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// agentController is the reporting controller (events.k8s.io) and the
// source component (core/v1) of the resize agent's own Events
// (agent/kube ReportingController). Any of its Events about the pod that
// is newer than the patch is taken as its report on this resize, whatever
// its reason, so that the plugin need not follow the agent's names.
const agentController = "resize-agent"

// clockSkew is how far an Event's time may lie before the patch's, the
// agent's clock and this machine's being different clocks.
const clockSkew = 2 * time.Second

type agentEvent struct {
	Reason  string    `json:"reason"`
	Type    string    `json:"type"`
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
	Node    string    `json:"node,omitempty"`
	Count   int32     `json:"count,omitempty"`
}

type agentReport struct {
	Seen   bool         `json:"seen"`
	Events []agentEvent `json:"events,omitempty"`
	// Note says why nothing was seen.
	Note string `json:"note,omitempty"`
}

// eventSnapshot is the agent's Events on the pod before the patch, by UID
// and resourceVersion: an Event in it, unchanged, is not about this
// resize (an Event the recorder aggregates changes resourceVersion).
type eventSnapshot map[types.UID]string

func listAgentEvents(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) ([]corev1.Event, error) {
	sel := fields.Set{"involvedObject.uid": string(p.UID)}.AsSelector().String()
	l, err := c.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if (e.ReportingController == agentController || e.Source.Component == agentController) && e.InvolvedObject.UID == p.UID {
			out = append(out, e)
		}
	}
	return out, nil
}

func snapshotEvents(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) (eventSnapshot, error) {
	evs, err := listAgentEvents(ctx, c, p)
	if err != nil {
		return nil, err
	}
	s := eventSnapshot{}
	for _, e := range evs {
		s[e.UID] = e.ResourceVersion
	}
	return s, nil
}

// eventTime is the newest time an Event carries (events.k8s.io sets
// eventTime and series, core/v1 recorders the timestamps).
func eventTime(e corev1.Event) time.Time {
	t := e.EventTime.Time
	for _, u := range []time.Time{e.LastTimestamp.Time, e.FirstTimestamp.Time} {
		if u.After(t) {
			t = u
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}

// newAgentEvents are the agent's Events on the pod that are not in the
// snapshot and not older than the patch, oldest first.
func newAgentEvents(evs []corev1.Event, before eventSnapshot, patched time.Time) []agentEvent {
	var out []agentEvent
	for _, e := range evs {
		if rv, ok := before[e.UID]; ok && rv == e.ResourceVersion {
			continue
		}
		t := eventTime(e)
		if !t.IsZero() && t.Before(patched.Add(-clockSkew)) {
			continue
		}
		node := e.ReportingInstance
		if node == "" {
			node = e.Source.Host
		}
		out = append(out, agentEvent{Reason: e.Reason, Type: e.Type, Message: e.Message, Time: t, Node: node, Count: e.Count})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// waitAgent polls for the agent's Events about this resize for at most
// wait; once one is seen it collects for one more poll, so that two
// Events the agent posts together are printed together.
func waitAgent(ctx context.Context, c kubernetes.Interface, p *corev1.Pod, before eventSnapshot, patched time.Time, wait, poll time.Duration) agentReport {
	if before == nil {
		return agentReport{Note: "the agent's measurement was not looked for: the pod's Events could not be listed before the patch"}
	}
	if wait <= 0 {
		return agentReport{Note: "the agent's measurement was not waited for (--agent-wait 0)"}
	}
	deadline := time.Now().Add(wait)
	var lastErr error
	var seen []agentEvent
	for {
		evs, err := listAgentEvents(ctx, c, p)
		if err == nil {
			lastErr = nil
			if got := newAgentEvents(evs, before, patched); len(got) > 0 {
				if len(seen) > 0 || time.Now().After(deadline) {
					return agentReport{Seen: true, Events: got}
				}
				seen = got
			}
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) {
			if len(seen) > 0 {
				return agentReport{Seen: true, Events: seen}
			}
			note := "the agent's measurement was not seen within " + wait.String() +
				": no resize-agent on node " + p.Spec.NodeName + ", or it has not reported yet"
			if lastErr != nil {
				note += " (listing the pod's Events: " + lastErr.Error() + ")"
			}
			return agentReport{Note: note}
		}
		select {
		case <-ctx.Done():
			return agentReport{Note: "the agent's measurement was not seen: " + ctx.Err().Error()}
		case <-time.After(poll):
		}
	}
}
