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

// TestWriteBack: under the opt-in --kube-drift=restore, the kubelet's
// allocation comes back after a stray write, to a container's cgroup (its
// values through CRI) and to a pod-level pod's cgroup (through the cgroup
// package, systemd unit properties under the systemd driver); a kubelet
// resize made under restore is followed, never written back over.
//
// It is the last test of the package (go test runs them in the order of
// their files' names, and this file's sorts last): it restarts the
// agent's DaemonSet pod with the flag, a rollout that took 45-100 s on the
// one-vCPU node, and the next test's deployAgent would pay another to take
// the flag out. Where TestCapacity and TestPodLevelDrift did this
// themselves, the suite paid four rollouts.
func TestWriteBack(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node, _ := withAgent(t, c)
	useTestNamespace(t, c)
	s := &capSuite{c: c, node: node.Name}

	// The agent's restart with the flag and the pods' starts overlap: under
	// TCG each takes a minute or more, mostly waiting on runc.
	t0 := time.Now()
	patchDriftRestore(t, c)
	// ctr's container is also the stray echo on the node (strayWriter),
	// into its own cgroup and plr's pod cgroup.
	app := ctr("app", "100m", "32Mi")
	app.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("500m")
	q := resource.MustParse
	plrApp := ctr("app", "10m", "32Mi")
	plrApp.Resources = corev1.ResourceRequirements{}
	pods := []*corev1.Pod{
		strayWriter(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ctr"}, Spec: corev1.PodSpec{Containers: []corev1.Container{app}}}),
		{ObjectMeta: metav1.ObjectMeta{Name: "plr"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{plrApp},
			Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q("200m"), corev1.ResourceMemory: q("64Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("128Mi")},
			},
		}},
	}
	for _, p := range pods {
		s.create(ctx, t, p)
	}
	started := make([]*corev1.Pod, len(pods))
	for i, p := range pods {
		started[i] = s.ready(ctx, t, p.Name)
	}
	timing(t, "writeback_pods_ready", time.Since(t0))
	waitDriftRestore(ctx, t, c)
	timing(t, "writeback_pods_and_agent_ready", time.Since(t0))

	dirs := map[string]string{
		"ctr": containerDir(started[0].Status.ContainerStatuses[0].ContainerID),
		"plr": podDir(string(started[1].UID)),
	}
	read := func(pod, file string) string {
		t.Helper()
		out, err := c.try("-n", testNS, "exec", "ctr", "--", "sh", "-c", dirs[pod]+" && cat \"$d/"+file+"\"")
		if err != nil {
			t.Logf("reading %s's %s: %v", pod, file, err)
		}
		return strings.TrimSpace(out)
	}
	cpuMax := func(pod string) string { return read(pod, "cpu.max") }
	write := func(pod, file, v string) time.Time {
		t.Helper()
		c.k(t, "-n", testNS, "exec", "ctr", "--", "sh", "-c", dirs[pod]+" && echo '"+v+"' > \"$d/"+file+"\"")
		return time.Now()
	}
	events := func(pod string) []corev1.Event {
		l, err := c.cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=CgroupDrift"})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	for _, pod := range []string{"ctr", "plr"} {
		if got := cpuMax(pod); got != "50000 100000" {
			t.Fatalf("%s: cpu.max %q, want the kubelet's 50000 100000", pod, got)
		}
	}

	// The kubelet's resizes under restore: followed, not written back.
	c.k(t, "-n", testNS, "patch", "pod", "ctr", "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"200m"},"limits":{"cpu":"800m"}}}]}}`)
	c.k(t, "-n", testNS, "patch", "pod", "plr", "--subresource", "resize", "--patch",
		`{"spec":{"resources":{"requests":{"cpu":"300m"},"limits":{"cpu":"800m"}}}}`)
	for _, pod := range []string{"ctr", "plr"} {
		poll(t, pod+"'s cpu.max 80000 100000 from the kubelet", 250*time.Millisecond, func() (bool, error) {
			return cpuMax(pod) == "80000 100000", nil
		})
	}
	// Three checks after: a difference waits one check for its
	// confirmation.
	afterDriftChecks(t, c, 3)
	for _, pod := range []string{"ctr", "plr"} {
		if got := cpuMax(pod); got != "80000 100000" {
			t.Errorf("%s: cpu.max %q three drift checks after the kubelet's resize to 80000 100000: written back over", pod, got)
		}
		for _, e := range events(pod) {
			t.Errorf("%s: CgroupDrift after a kubelet resize under restore: %s", pod, e.Message)
		}
	}

	// Stray writes: the kubelet's values come back, with the agent's Event.
	// memory.high is the kubelet's under MemoryQoS with the node's factor
	// 0.8: "max" for ctr (its request is its limit), floor((64Mi + 0.8 ×
	// 64Mi) / 4 KiB) × 4 KiB for plr's pod cgroup.
	for _, x := range []struct{ pod, file, stray, want, event, timing string }{
		{"ctr", "cpu.max", "30000 100000", "80000 100000", "written back through the runtime", "drift_write_to_restore"},
		{"plr", "cpu.max", "30000 100000", "80000 100000", "written back to the pod cgroup", "podlevel_drift_write_to_restore"},
		{"ctr", "memory.high", "104857600", "max", "written back through the runtime", "memory_high_write_to_restore"},
		{"plr", "memory.high", "100003840", "120795136", "written back to the pod cgroup", "podlevel_memory_high_write_to_restore"},
	} {
		t1 := write(x.pod, x.file, x.stray)
		poll(t, x.pod+"'s "+x.file+" restored to the kubelet's "+x.want, 250*time.Millisecond, func() (bool, error) {
			return read(x.pod, x.file) == x.want, nil
		})
		timing(t, x.timing, time.Since(t1))
		// The kubelet's resized value, not the one the pod started with.
		want := x.file + " " + x.stray + " (the kubelet's " + x.want + ")"
		var msg string
		poll(t, "the restore's Event on "+x.pod+" saying "+want, time.Second, func() (bool, error) {
			for _, e := range events(x.pod) {
				if strings.Contains(e.Message, x.event) && strings.Contains(e.Message, want) {
					msg = e.Message
					return true, nil
				}
			}
			return false, nil
		})
		t.Logf("%s: %s", x.pod, msg)
	}
}
