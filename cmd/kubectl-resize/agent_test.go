package main

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func TestAgentEvents(t *testing.T) {
	p := webPod()
	patched := time.Now()
	ev := func(name, rv, controller, component string, uid types.UID, at time.Time) corev1.Event {
		return corev1.Event{
			ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: p.Namespace, UID: types.UID(name), ResourceVersion: rv},
			InvolvedObject:      corev1.ObjectReference{Kind: "Pod", Name: p.Name, Namespace: p.Namespace, UID: uid},
			Reason:              "R-" + name,
			Message:             "m-" + name,
			ReportingController: controller,
			Source:              corev1.EventSource{Component: component, Host: "node-1"},
			LastTimestamp:       metav1.NewTime(at),
		}
	}
	all := []corev1.Event{
		ev("events-api", "5", agentController, "", p.UID, patched.Add(time.Second)),
		ev("core-api", "6", "", agentController, p.UID, patched.Add(2*time.Second)),
		ev("kubelet", "7", "kubelet", "kubelet", p.UID, patched.Add(time.Second)),
		ev("other-pod", "8", agentController, "", "another-uid", patched.Add(time.Second)),
		ev("unchanged", "2", agentController, "", p.UID, patched.Add(-time.Minute)),
		ev("aggregated", "9", agentController, "", p.UID, patched),
		ev("stale", "3", agentController, "", p.UID, patched.Add(-time.Minute)),
		ev("skewed", "4", agentController, "", p.UID, patched.Add(-time.Second)),
	}
	c := fake.NewClientset()
	for i := range all {
		if _, err := c.CoreV1().Events(p.Namespace).Create(context.Background(), &all[i], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := listAgentEvents(context.Background(), c, p)
	if err != nil {
		t.Fatal(err)
	}
	// Before the patch: "unchanged" as it is now, "aggregated" at an older
	// resourceVersion (the recorder has counted it again since).
	before := eventSnapshot{"unchanged": "2", "aggregated": "1"}
	got := newAgentEvents(evs, before, patched)
	var names []string
	for _, e := range got {
		names = append(names, e.Reason)
	}
	want := []string{"R-skewed", "R-aggregated", "R-events-api", "R-core-api"}
	if len(names) != len(want) {
		t.Fatalf("new agent events %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("new agent events %q, want %q (oldest first)", names, want)
		}
	}
	if got[3].Node != "node-1" || got[3].Message != "m-core-api" {
		t.Errorf("core/v1 event %+v", got[3])
	}
}
