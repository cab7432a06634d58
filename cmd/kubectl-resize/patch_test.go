package main

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func ch(flag string, v string) change {
	c := change{flag: flag, value: resource.MustParse(v)}
	c.resource = corev1.ResourceName(strings.SplitN(flag, "-", 2)[0])
	c.limit = strings.HasSuffix(flag, "-limit")
	return c
}

func twoContainers() *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{
				{Name: "setup", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "50m")}},
				{Name: "proxy", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m"), Limits: rl("cpu", "200m")}},
			},
			Containers: []corev1.Container{
				{Name: "app", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "64Mi")}},
				{Name: "log", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "10m")}},
			},
		},
	}
}

func TestPickContainer(t *testing.T) {
	p := twoContainers()
	if _, err := pickContainer(p, ""); err == nil || !strings.Contains(err.Error(), "pick one with -c: app, log, proxy") {
		t.Errorf("two containers, no -c: %v", err)
	}
	if got, err := pickContainer(p, "log"); err != nil || got.name != "log" || got.sidecar {
		t.Errorf("-c log: %+v %v", got, err)
	}
	if got, err := pickContainer(p, "proxy"); err != nil || !got.sidecar || got.current.Limits.Cpu().String() != "200m" {
		t.Errorf("-c proxy (a sidecar): %+v %v", got, err)
	}
	if _, err := pickContainer(p, "setup"); err == nil || !strings.Contains(err.Error(), "runs to completion") {
		t.Errorf("-c setup (an init container): %v", err)
	}
	if _, err := pickContainer(p, "nope"); err == nil || !strings.Contains(err.Error(), `no container "nope"; its containers: app, log, proxy`) {
		t.Errorf("-c nope: %v", err)
	}
	p.Annotations = map[string]string{defaultContainerAnnotation: "log"}
	if got, err := pickContainer(p, ""); err != nil || got.name != "log" {
		t.Errorf("default-container annotation: %+v %v", got, err)
	}
	if got, err := pickContainer(p, "app"); err != nil || got.name != "app" {
		t.Errorf("-c wins over the annotation: %+v %v", got, err)
	}
	p.Annotations = nil
	p.Spec.Containers = p.Spec.Containers[:1]
	if got, err := pickContainer(p, ""); err != nil || got.name != "app" {
		t.Errorf("the only container: %+v %v", got, err)
	}
}

func TestDesired(t *testing.T) {
	cur := corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "64Mi")}
	d, err := desired(cur, []change{ch("cpu-limit", "800m"), ch("memory-request", "48Mi")})
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "48Mi"), Limits: rl("cpu", "800m", "memory", "64Mi")}
	if !equalResources(d, want) {
		t.Errorf("desired %v, want %v", d, want)
	}
	if cur.Limits.Cpu().String() != "500m" {
		t.Errorf("desired changed its input: %v", cur)
	}
	for _, tc := range []struct {
		changes []change
		err     string
	}{
		{[]change{ch("cpu-request", "600m")}, "cpu request 600m would be above its limit 500m"},
		{[]change{ch("memory-limit", "16Mi")}, "memory request 32Mi would be above its limit 16Mi"},
		{[]change{ch("cpu-request", "2"), ch("cpu-limit", "1")}, "above its limit 1"},
		{[]change{ch("cpu-limit", "0.5")}, "nothing to change: the container already has cpu limit 500m"},
		{[]change{ch("cpu-limit", "500m"), ch("memory-request", "32Mi")}, "nothing to change"},
	} {
		if _, err := desired(cur, tc.changes); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want %q", describe(tc.changes), err, tc.err)
		}
	}
	// One value the same, one new: a change.
	if _, err := desired(cur, []change{ch("cpu-limit", "500m"), ch("cpu-request", "200m")}); err != nil {
		t.Error(err)
	}
	// A limit on a container without one, on the resource without a request.
	if d, err := desired(corev1.ResourceRequirements{}, []change{ch("memory-limit", "1Gi")}); err != nil || d.Limits.Memory().String() != "1Gi" {
		t.Errorf("limit from nothing: %v %v", d, err)
	}
}

func equalResources(a, b corev1.ResourceRequirements) bool {
	eq := func(x, y corev1.ResourceList) bool {
		if len(x) != len(y) {
			return false
		}
		for k, v := range y {
			if q, ok := x[k]; !ok || q.Cmp(v) != 0 {
				return false
			}
		}
		return true
	}
	return eq(a.Requests, b.Requests) && eq(a.Limits, b.Limits)
}

// The patch names the container and the values given, and merged as the
// API server merges it (strategic merge, containers by name), keeps every
// other value and container.
func TestResizePatch(t *testing.T) {
	p := twoContainers()
	tgt, _ := pickContainer(p, "app")
	changes := []change{ch("cpu-limit", "800m"), ch("memory-request", "48Mi")}
	patch, err := resizePatch(tgt, changes)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"800m"},"requests":{"memory":"48Mi"}}}]}}`; string(patch) != want {
		t.Errorf("patch\n%s\nwant\n%s", patch, want)
	}
	orig, _ := json.Marshal(p)
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(merged, &got); err != nil {
		t.Fatal(err)
	}
	want := twoContainers()
	want.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "48Mi"), Limits: rl("cpu", "800m", "memory", "64Mi")}
	if len(got.Spec.Containers) != 2 || got.Spec.Containers[0].Name != "app" || got.Spec.Containers[1].Name != "log" {
		t.Fatalf("containers after the merge: %+v", got.Spec.Containers)
	}
	for i := range want.Spec.Containers {
		if !equalResources(got.Spec.Containers[i].Resources, want.Spec.Containers[i].Resources) {
			t.Errorf("container %s: %v, want %v", want.Spec.Containers[i].Name, got.Spec.Containers[i].Resources, want.Spec.Containers[i].Resources)
		}
	}
	if !equalResources(got.Spec.InitContainers[1].Resources, want.Spec.InitContainers[1].Resources) {
		t.Errorf("the sidecar changed: %v", got.Spec.InitContainers[1].Resources)
	}

	side, _ := pickContainer(p, "proxy")
	patch, _ = resizePatch(side, []change{ch("cpu-limit", "300m")})
	if want := `{"spec":{"initContainers":[{"name":"proxy","resources":{"limits":{"cpu":"300m"}}}]}}`; string(patch) != want {
		t.Errorf("sidecar patch %s, want %s", patch, want)
	}
	withID := withUID(patch, "u-1")
	if want := `{"metadata":{"uid":"u-1"},"spec":{"initContainers":[{"name":"proxy","resources":{"limits":{"cpu":"300m"}}}]}}`; string(withID) != want {
		t.Errorf("with the UID: %s", withID)
	}
}
