package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodLevelDrift: a pod with pod-level resources (spec.resources, an
// app container without any of its own, an init container): the pod
// cgroup holds what the agent expects from the kubelet's rules (its
// linear cpu.weight); a stray write to the pod cgroup's cpu.max is
// reported with the agent's CgroupDrift Event; a kubelet pod-level resize
// (kubectl patch --subresource resize on spec.resources, 1.36+) is not
// drift, neither for the pod cgroup nor for the container, which carries
// the pod-level limit. The node's kubelet sets memoryThrottlingFactor 0.8
// (guest.sh), so under MemoryQoS the pod cgroup has the kubelet's
// memory.high, which the agent expects too: a stray write to it is drift,
// a change of the pod's memory request alone leaves it (the kubelet writes
// it only with the limit), a new limit moves it. Under
// --kube-drift=restore: TestWriteBack.
func TestPodLevelDrift(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node, _ := withAgent(t, c)
	useTestNamespace(t, c)
	s := &capSuite{c: c, node: node.Name}

	q := func(v string) resource.Quantity { return resource.MustParse(v) }
	app := ctr("app", "10m", "16Mi")
	app.Resources = corev1.ResourceRequirements{}
	initC := corev1.Container{Name: "init", Image: busybox(), ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"true"},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("50m"), corev1.ResourceMemory: q("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("32Mi")},
		}}
	// The app container is also the stray echo on the node (strayWriter):
	// into the pod cgroup, and into its own.
	p := s.run(ctx, t, strayWriter(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plr"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{initC},
		Containers:     []corev1.Container{app},
		Resources: &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("200m"), corev1.ResourceMemory: q("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("128Mi")},
		},
	}}))
	t.Logf("pod plr: qos %s, status.resources %v, allocatedResources %v", p.Status.QOSClass, p.Status.Resources, p.Status.AllocatedResources)

	dir := podDir(string(p.UID))
	appDir := containerDir(p.Status.ContainerStatuses[0].ContainerID)
	podFile := func(f string) string {
		t.Helper()
		out, err := s.c.try("-n", testNS, "exec", "plr", "--", "sh", "-c", dir+" && cat \"$d/"+f+"\"")
		if err != nil {
			t.Logf("reading the pod cgroup's %s: %v", f, err)
		}
		return strings.TrimSpace(out)
	}
	writeFile := func(f, v string) time.Time {
		t.Helper()
		s.c.k(t, "-n", testNS, "exec", "plr", "--", "sh", "-c", dir+" && echo '"+v+"' > \"$d/"+f+"\"")
		return time.Now()
	}
	write := func(v string) time.Time { return writeFile("cpu.max", v) }
	appCPUMax := func() string {
		out, err := s.c.try("-n", testNS, "exec", "plr", "--", "sh", "-c", appDir+" && cat \"$d/cpu.max\"")
		if err != nil {
			t.Logf("reading the app container's cpu.max: %v", err)
		}
		return strings.TrimSpace(out)
	}

	// The kubelet's values: 200m -> 204 shares -> its linear cpu.weight 8
	// (runc's would be 29), the pod-level limits; the app container,
	// without limits of its own, carries the pod's CPU limit.
	if got := podFile("cpu.max") + " / " + podFile("cpu.weight") + " / " + podFile("memory.max"); got != "50000 100000 / 8 / 134217728" {
		t.Fatalf("pod cgroup cpu.max / cpu.weight / memory.max %q, want the kubelet's 50000 100000 / 8 / 134217728", got)
	}
	t.Logf("app container cpu.max %q", appCPUMax())
	// MemoryQoS with the factor 0.8: floor((64Mi + 0.8 × 64Mi) / 4 KiB) ×
	// 4 KiB for the pod (ApplyPodLevelMemoryHigh); none for the app
	// container, which has no memory limit of its own in a pod with one.
	appHigh := func() string {
		out, err := s.c.try("-n", testNS, "exec", "plr", "--", "sh", "-c", appDir+" && cat \"$d/memory.high\"")
		if err != nil {
			t.Logf("reading the app container's memory.high: %v", err)
		}
		return strings.TrimSpace(out)
	}
	if got := podFile("memory.high") + " / " + appHigh(); got != "120795136 / max" {
		t.Fatalf("memory.high of the pod cgroup / the app container %q, want the kubelet's 120795136 / max (is memoryThrottlingFactor 0.8 in the node's kubelet configuration?)", got)
	}
	events := func(name string) []corev1.Event {
		l, err := s.c.cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=CgroupDrift"})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	// Nothing on a clean node: two drift checks.
	afterDriftChecks(t, s.c, 2)
	if ev := events("plr"); len(ev) != 0 {
		t.Fatalf("CgroupDrift on the untouched pod: %s", ev[0].Message)
	}

	// waitEvent waits for plr's CgroupDrift Event that says what.
	waitEvent := func(what string) corev1.Event {
		t.Helper()
		var ev corev1.Event
		poll(t, "a CgroupDrift Event saying "+what, 250*time.Millisecond, func() (bool, error) {
			for _, e := range events("plr") {
				if strings.Contains(e.Message, what) {
					ev = e
					return true, nil
				}
			}
			return false, nil
		})
		return ev
	}

	// Report (the default).
	t0 := write("20000 100000")
	ev := waitEvent("pod cgroup:")
	timing(t, "podlevel_drift_write_to_event", time.Since(t0))
	t.Logf("Event: %s %s: %s (from %s)", ev.Type, ev.Reason, ev.Message, ev.Source.Component)
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != "resize-agent" || !strings.Contains(ev.Message, "cpu.max 20000 100000 (the kubelet's 50000 100000)") {
		t.Errorf("event %+v", ev)
	}
	if got := podFile("cpu.max"); got != "20000 100000" {
		t.Errorf("pod cpu.max %q under report: the agent wrote it", got)
	}
	if cur, err := s.c.cs.CoreV1().Pods(testNS).Get(ctx, "plr", metav1.GetOptions{}); err == nil {
		t.Logf("after the stray write: status.resources %v", cur.Status.Resources)
	}
	write("50000 100000") // put back by hand

	// The pod cgroup's memory.high, under MemoryQoS.
	t0 = writeFile("memory.high", "100003840")
	ev = waitEvent("memory.high")
	timing(t, "podlevel_memory_high_write_to_event", time.Since(t0))
	t.Logf("Event: %s", ev.Message)
	if !strings.Contains(ev.Message, "memory.high 100003840 (the kubelet's 120795136)") {
		t.Errorf("event %q", ev.Message)
	}
	writeFile("memory.high", "120795136")

	// A kubelet pod-level resize is not drift: no new Event while and
	// after it runs, for the pod cgroup or the container.
	time.Sleep(5 * time.Second)
	before := len(events("plr"))
	s.c.k(t, "-n", testNS, "patch", "pod", "plr", "--subresource", "resize", "--patch",
		`{"spec":{"resources":{"requests":{"cpu":"300m"},"limits":{"cpu":"800m"}}}}`)
	t1 := time.Now()
	poll(t, "the pod cgroup's cpu.max 80000 100000 from the kubelet", 250*time.Millisecond, func() (bool, error) {
		return podFile("cpu.max") == "80000 100000", nil
	})
	timing(t, "podlevel_resize_to_pod_cgroup", time.Since(t1))
	afterDriftChecks(t, s.c, 3)
	if got := podFile("cpu.weight"); got != "12" {
		t.Errorf("pod cpu.weight %q after the resize, want the kubelet's 12 (300m)", got)
	}
	cur, err := s.c.cs.CoreV1().Pods(testNS).Get(ctx, "plr", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the resize: app cpu.max %q, status.resources %v, allocatedResources %v, observedGeneration %d/%d, conditions %+v",
		appCPUMax(), cur.Status.Resources, cur.Status.AllocatedResources, cur.Status.ObservedGeneration, cur.Generation, cur.Status.Conditions)
	if all := events("plr"); len(all) != before {
		for _, e := range all[before:] {
			t.Errorf("CgroupDrift after a kubelet pod-level resize: %s", e.Message)
		}
	}
	// The memory request alone: the kubelet writes no pod memory.high for
	// it (setPodCgroupConfig, pkg/kubelet/kuberuntime/kuberuntime_manager.go),
	// so the value of 64Mi stays, and it is not drift.
	before = len(events("plr"))
	s.c.k(t, "-n", testNS, "patch", "pod", "plr", "--subresource", "resize", "--patch",
		`{"spec":{"resources":{"requests":{"memory":"96Mi"}}}}`)
	t2 := time.Now()
	poll(t, "the kubelet to allocate 96Mi", 250*time.Millisecond, func() (bool, error) {
		p, err := s.c.cs.CoreV1().Pods(testNS).Get(ctx, "plr", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		m := p.Status.AllocatedResources[corev1.ResourceMemory]
		return m.Cmp(q("96Mi")) == 0 && !hasCond(p, corev1.PodResizeInProgress) && !hasCond(p, corev1.PodResizePending), nil
	})
	timing(t, "podlevel_memory_request_resize", time.Since(t2))
	afterDriftChecks(t, s.c, 2)
	highAtRequestOnly := podFile("memory.high")
	// Then the limit: floor((96Mi + 0.8 × 64Mi) / 4 KiB) × 4 KiB.
	s.c.k(t, "-n", testNS, "patch", "pod", "plr", "--subresource", "resize", "--patch",
		`{"spec":{"resources":{"limits":{"memory":"160Mi"}}}}`)
	t2 = time.Now()
	poll(t, "the pod cgroup's memory.max 160Mi from the kubelet", 250*time.Millisecond, func() (bool, error) {
		return podFile("memory.max") == "167772160", nil
	})
	timing(t, "podlevel_memory_limit_resize", time.Since(t2))
	afterDriftChecks(t, s.c, 3)
	if got := podFile("memory.high"); highAtRequestOnly != "120795136" || got != "154349568" {
		t.Errorf("pod memory.high %s after the request alone, %s after the limit: want the kubelet's 120795136, then 154349568", highAtRequestOnly, got)
	}
	// The app container, "max" when created, has one from the pod's limit
	// once the kubelet has resized it (updatePodContainerResources hands it
	// the limit in force): 0.8 × 160Mi. The agent takes both as the
	// kubelet's (allocdrift.ContainerMemoryHigh).
	if got := appHigh(); got != "134217728" {
		t.Errorf("app container memory.high %s after the pod-level resizes, want the kubelet's 134217728", got)
	}
	if all := events("plr"); len(all) != before {
		for _, e := range all[before:] {
			t.Errorf("CgroupDrift after the kubelet's pod-level memory resizes: %s", e.Message)
		}
	}
	// Nor on any other pod of the node.
	all, err := s.c.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=CgroupDrift"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all.Items {
		if e.InvolvedObject.Name != "plr" {
			t.Errorf("CgroupDrift on %s/%s: %s", e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Message)
		}
	}
	// Restore, opt-in: TestWriteBack, the last test.
}

func hasCond(p *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
