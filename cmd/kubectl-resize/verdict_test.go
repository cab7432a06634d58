package main

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func cond(typ corev1.PodConditionType, reason, msg string, gen int64) corev1.PodCondition {
	return corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: gen}
}

func TestReadVerdict(t *testing.T) {
	want := []change{ch("cpu-limit", "800m"), ch("memory-limit", "96Mi")}
	old := &corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "64Mi")}
	resized := &corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "800m", "memory", "96Mi")}
	halfway := &corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "96Mi")}
	const gen = 3
	for _, tc := range []struct {
		name       string
		conds      []corev1.PodCondition
		observed   int64
		res        *corev1.ResourceRequirements
		verdict    string
		msg, state string
	}{
		{name: "completed", observed: gen, res: resized, verdict: Completed},
		{name: "completed, a kubelet without observedGeneration", res: resized, verdict: Completed},
		{name: "not seen yet", observed: gen - 1, res: resized, state: "not seen generation 3"},
		{name: "in progress", conds: []corev1.PodCondition{cond(corev1.PodResizeInProgress, "", "", gen)}, observed: gen, res: halfway, state: "actuating"},
		{name: "in progress, status already new", conds: []corev1.PodCondition{cond(corev1.PodResizeInProgress, "", "", gen)}, observed: gen, res: resized, state: "actuating"},
		{name: "status not there yet", observed: gen, res: halfway, state: "limits.cpu is 500m, want 800m"},
		{name: "no status resources", observed: gen, state: "no resources"},
		{name: "deferred", conds: []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonDeferred, "Node didn't have enough resource: cpu", gen)}, observed: gen, res: old,
			verdict: Deferred, msg: "Node didn't have enough resource: cpu"},
		{name: "infeasible", conds: []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonInfeasible, "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"", gen)}, observed: gen, res: old,
			verdict: Infeasible, msg: "CPU Manager"},
		{name: "error", conds: []corev1.PodCondition{cond(corev1.PodResizeInProgress, corev1.PodReasonError, "failed to update container: boom", gen)}, observed: gen, res: halfway,
			verdict: Error, msg: "boom"},
		{name: "stale infeasible of an older resize", conds: []corev1.PodCondition{cond(corev1.PodResizePending, corev1.PodReasonInfeasible, "old", gen-1)}, observed: gen - 1, res: old,
			state: "not seen generation 3"},
		{name: "stale error of an older resize", conds: []corev1.PodCondition{cond(corev1.PodResizeInProgress, corev1.PodReasonError, "old", gen-1)}, observed: gen, res: resized,
			verdict: Completed},
		{name: "a condition not true", conds: []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionFalse, Reason: corev1.PodReasonInfeasible}}, observed: gen, res: resized,
			verdict: Completed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := twoContainers()
			p.Generation = gen
			p.Status.ObservedGeneration = tc.observed
			p.Status.Conditions = tc.conds
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "log"}, {Name: "app", Resources: tc.res, RestartCount: 2}}
			tgt, _ := pickContainer(p, "app")
			r := readVerdict(p, gen, tgt, want)
			if r.verdict != tc.verdict || !strings.Contains(r.message, tc.msg) || !strings.Contains(r.state, tc.state) {
				t.Errorf("got verdict %q message %q state %q; want %q %q %q", r.verdict, r.message, r.state, tc.verdict, tc.msg, tc.state)
			}
			if r.status == nil || r.status.Name != "app" || r.status.RestartCount != 2 {
				t.Errorf("status %+v", r.status)
			}
		})
	}
}

func TestReadVerdictSidecar(t *testing.T) {
	p := twoContainers()
	p.Generation = 2
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", Resources: &corev1.ResourceRequirements{Limits: rl("cpu", "300m")}}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Resources: &corev1.ResourceRequirements{Limits: rl("cpu", "1")}}}
	tgt, _ := pickContainer(p, "proxy")
	if r := readVerdict(p, 2, tgt, []change{ch("cpu-limit", "300m")}); r.verdict != Completed {
		t.Errorf("sidecar: %+v", r)
	}
	if r := readVerdict(p, 2, tgt, []change{ch("cpu-limit", "1")}); r.verdict != "" {
		t.Errorf("sidecar read from the regular containers' statuses: %+v", r)
	}
}

func TestExitCodes(t *testing.T) {
	// The meanings of resizectl resize's exit codes (docs/api.md).
	for v, want := range map[string]int{Completed: 0, Deferred: 0, Accepted: 0, Refused: 1, Timeout: 1, Infeasible: 3, Error: 3} {
		if got := exitCode(v); got != want {
			t.Errorf("%s: exit %d, want %d", v, got, want)
		}
	}
}
