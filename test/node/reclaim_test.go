package node_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const reclaimNS = "resize-agent-reclaim-e2e"

// cgMem is a container's memory files and its PID 1's start time, read in
// the container (its cgroup namespace's root is its own cgroup).
type cgMem struct {
	current, high, max int64 // high, max: -1 for max
	start              string
}

func readMem(t *testing.T, c *cluster, pod string) cgMem {
	t.Helper()
	return readMemOf(t, c, pod, "app")
}

func readMemOf(t *testing.T, c *cluster, pod, container string) cgMem {
	t.Helper()
	out := c.k(t, "-n", reclaimNS, "exec", pod, "-c", container, "--", "sh", "-c",
		"cat /sys/fs/cgroup/memory.current /sys/fs/cgroup/memory.high /sys/fs/cgroup/memory.max; cut -d' ' -f22 /proc/1/stat")
	return parseMem(t, pod, out)
}

func parseMem(t *testing.T, pod, out string) cgMem {
	t.Helper()
	f := strings.Fields(out)
	if len(f) != 4 {
		t.Fatalf("reading the memory files of %s: %q", pod, out)
	}
	num := func(s string) int64 {
		if s == "max" {
			return -1
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q is not a number", pod, s)
		}
		return v
	}
	return cgMem{current: num(f[0]), high: num(f[1]), max: num(f[2]), start: f[3]}
}

func (m cgMem) String() string {
	h := func(v int64) string {
		if v < 0 {
			return "max"
		}
		return fmt.Sprintf("%.1fMi", float64(v)/(1<<20))
	}
	return fmt.Sprintf("memory.current %s memory.high %s memory.max %s", h(m.current), h(m.high), h(m.max))
}

// memPod is a burstable busybox pod running script, with the node's ext4
// disk (guest.sh) at /data, whose files have page cache.
func memPod(node, name, script, request, limit string) *corev1.Pod {
	image := "localhost/resize-agent/busybox:latest"
	dir := corev1.HostPathDirectory
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: reclaimNS},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: new(int64),
			Volumes: []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/mnt/disk", Type: &dir}}}},
			Containers: []corev1.Container{{
				Name:            "app",
				Image:           image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"sh", "-c", script + "; echo filled; " + idle},
				VolumeMounts:    []corev1.VolumeMount{{Name: "disk", MountPath: "/data"}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse(request)},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse(limit)},
				},
				ResizePolicy: []corev1.ContainerResizePolicy{
					{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
					{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.NotRequired},
				},
			}},
		},
	}
}

// pageCache writes 96 MiB to a file on the ext4 disk and reads it back:
// clean page cache charged to the container, reclaimable without swap.
const pageCache = "dd if=/dev/zero of=/data/$(hostname) bs=1M count=96 && sync && cat /data/$(hostname) >/dev/null"

// anonymous holds 64 MiB in a shell variable: anonymous memory, which
// cannot be reclaimed without swap (the guest has none).
const anonymous = "x=$(head -c 67108864 /dev/zero | tr '\\0' a)"

// podLevelMemPod is memPod with the memory at the pod level: its container
// has no resources of its own, and is privileged with the node's cgroup
// tree at /host/cgroup, so that the test reads the pod cgroup.
func podLevelMemPod(node, name, script, request, limit string) *corev1.Pod {
	p := strayWriter(memPod(node, name, script, request, limit))
	p.Spec.Resources = p.Spec.Containers[0].Resources.DeepCopy()
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	return p
}

// sidecarMemPod is memPod with the filling container a sidecar (a
// restartable init container, "side") beside an idle "app".
func sidecarMemPod(node, name, script, request, limit string) *corev1.Pod {
	p := memPod(node, name, script, request, limit)
	side := p.Spec.Containers[0]
	side.Name, side.RestartPolicy = "side", new(corev1.ContainerRestartPolicyAlways)
	p.Spec.InitContainers = []corev1.Container{side}
	app := ctr("app", "10m", "16Mi")
	app.Image = side.Image
	p.Spec.Containers = []corev1.Container{app}
	return p
}

// filler is the container of test pod n that fills its memory.
func filler(n string) string {
	if n == "sidecache" {
		return "side"
	}
	return "app"
}

// readPodMem is readMem of p's pod cgroup (p a podLevelMemPod).
func readPodMem(t *testing.T, c *cluster, p *corev1.Pod) cgMem {
	t.Helper()
	out := c.k(t, "-n", reclaimNS, "exec", p.Name, "-c", "app", "--", "sh", "-c",
		podDir(string(p.UID))+` && cat "$d/memory.current" "$d/memory.high" "$d/memory.max"; cut -d' ' -f22 /proc/1/stat`)
	return parseMem(t, p.Name, out)
}

func memPatch(request, limit string) string {
	return fmt.Sprintf(`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"50m","memory":%q},"limits":{"cpu":"1","memory":%q}}}]}}`, request, limit)
}

func statusLimit(p *corev1.Pod) int64 {
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].Resources == nil {
		return 0
	}
	q := p.Status.ContainerStatuses[0].Resources.Limits[corev1.ResourceMemory]
	return q.Value()
}

func resizeCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodResizeInProgress {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// kubeletHigh is the memory.high the kubelet 1.37 sets under MemoryQoS for
// request and limit (the node's memoryThrottlingFactor 0.8, guest.sh; 4
// KiB pages): see
// generateLinuxContainerResources in
// pkg/kubelet/kuberuntime/kuberuntime_container_linux.go.
func kubeletHigh(request, limit int64) int64 {
	return int64(float64(request)+float64(limit-request)*0.8) / 4096 * 4096
}

// TestReclaim: a memory limit decrease below usage. The kubelet alone
// (before the agent is deployed) refuses it and keeps it in progress with
// reason Error; with the agent the page cache is reclaimed and the kubelet
// applies it, in place, to a container's limit and to a pod-level one;
// with anonymous memory the agent gives up with an Event of its own, the
// container untouched and memory.high as it was. The node's kubelet sets
// memory.high (MemoryQoS, factor 0.8): it is the kubelet's before and
// after every decrease.
func TestReclaim(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node := nodeReady(t, c)
	useNamespace(t, c, reclaimNS)

	_, err := c.cs.AppsV1().DaemonSets(agentNS).Get(ctx, agentDS, metav1.GetOptions{})
	agentThere := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	names := []string{"cache", "anon", "podcache", "sidecache"}
	if !agentThere {
		names = append(names, "cache-before")
	}
	for _, n := range names {
		p := memPod(node.Name, n, pageCache, "32Mi", "160Mi")
		switch n {
		case "anon":
			p = memPod(node.Name, n, anonymous, "16Mi", "256Mi")
		case "podcache":
			p = podLevelMemPod(node.Name, n, pageCache, "32Mi", "160Mi")
		case "sidecache":
			p = sidecarMemPod(node.Name, n, pageCache, "32Mi", "160Mi")
		}
		if _, err := c.cs.CoreV1().Pods(reclaimNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Their files on the node's 384 MiB disk go with them: the
	// walkthrough's fill, later, needs 128 MiB of it.
	t.Cleanup(func() {
		files := make([]string, len(names))
		for i, n := range names {
			files[i] = "/data/" + n
		}
		if out, err := c.try(append([]string{"-n", reclaimNS, "exec", "cache", "-c", "app", "--", "rm", "-f"}, files...)...); err != nil {
			t.Logf("removing the test's files from the node's disk: %v: %s", err, out)
		}
	})
	for _, n := range names {
		poll(t, n+" Ready with its memory filled", time.Second, func() (bool, error) {
			p, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, n, metav1.GetOptions{})
			if err != nil || !podReady(p) {
				return false, err
			}
			out, err := c.try("-n", reclaimNS, "logs", n, "-c", filler(n))
			return strings.Contains(out, "filled"), err
		})
		if n == "podcache" {
			// Its memory limit is the pod's: read the pod cgroup.
			p, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s filled: pod cgroup %s", n, readPodMem(t, c, p))
			continue
		}
		t.Logf("%s filled: %s", n, readMemOf(t, c, n, filler(n)))
	}
	// Page cache of a file on tmpfs is shmem, which no reclaim frees
	// without swap: the test means a disk.
	if out := c.k(t, "-n", reclaimNS, "exec", "cache", "--", "sh", "-c", "grep ' /data ' /proc/mounts"); !strings.Contains(out, "ext4") {
		t.Fatalf("/data (the node's /mnt/disk, guest.sh) is not ext4: %q", out)
	}

	const newLimit = 48 << 20
	if agentThere {
		t.Log("before (the kubelet alone): not run, the agent is already deployed on this node (run TestReclaim on its own for it)")
	} else {
		t.Run("KubeletAlone", func(t *testing.T) {
			before := readMem(t, c, "cache-before")
			t0 := time.Now()
			c.k(t, "-n", reclaimNS, "patch", "pod", "cache-before", "--subresource", "resize", "--patch", memPatch("32Mi", "48Mi"))
			var cond *corev1.PodCondition
			poll(t, "the kubelet to report the decrease in Error", time.Second, func() (bool, error) {
				p, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "cache-before", metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				cond = resizeCondition(p)
				return cond != nil && cond.Reason == corev1.PodReasonError, nil
			})
			timing(t, "reclaim_kubelet_alone_patch_to_error", time.Since(t0))
			t.Logf("kubelet: %s %s: %s", cond.Type, cond.Reason, cond.Message)
			// The kubelet retries at its next syncs of the pod; give it a
			// minute (its periodic resync) to show it never gets there.
			time.Sleep(time.Until(t0.Add(75 * time.Second)))
			p, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "cache-before", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			after := readMem(t, c, "cache-before")
			if got := statusLimit(p); got != 160<<20 || after.max != before.max {
				t.Fatalf("the kubelet alone applied the decrease (status limit %d, %s): the test's memory is not above the limit?", got, after)
			}
			if cond = resizeCondition(p); cond == nil || cond.Reason != corev1.PodReasonError {
				t.Errorf("75 s after the patch: PodResizeInProgress %+v, want reason Error", cond)
			}
			t.Logf("75 s after the patch, the kubelet alone: still %s; %s", cond.Reason, after)
		})
		var agentReady time.Time
		if !t.Run("DeployAgent", func(t *testing.T) { deployAgent(t, c, node); agentReady = time.Now() }) {
			t.FailNow()
		}
		t.Run("PendingDecreaseCompletes", func(t *testing.T) {
			poll(t, "the pending decrease applied once the agent runs", 500*time.Millisecond, func() (bool, error) {
				p, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "cache-before", metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				return statusLimit(p) == newLimit && resizeCondition(p) == nil, nil
			})
			timing(t, "reclaim_agent_ready_to_pending_decrease_applied", time.Since(agentReady))
			t.Logf("after: %s", readMem(t, c, "cache-before"))
		})
	}

	t.Run("WithAgent", func(t *testing.T) {
		before := readMem(t, c, "cache")
		p0, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "cache", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("before: %s", before)
		if before.current < newLimit {
			t.Fatalf("usage %d is not above the new limit %d", before.current, newLimit)
		}
		t0 := time.Now()
		c.k(t, "-n", reclaimNS, "patch", "pod", "cache", "--subresource", "resize", "--patch", memPatch("32Mi", "48Mi"))
		var p *corev1.Pod
		poll(t, "the kubelet to apply the decrease", 200*time.Millisecond, func() (bool, error) {
			var err error
			p, err = c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "cache", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return statusLimit(p) == newLimit && resizeCondition(p) == nil, nil
		})
		timing(t, "reclaim_with_agent_patch_to_status", time.Since(t0))
		after := readMem(t, c, "cache")
		t.Logf("after: %s", after)
		a, b := p.Status.ContainerStatuses[0], p0.Status.ContainerStatuses[0]
		if after.start != before.start || a.ContainerID != b.ContainerID || a.RestartCount != 0 || a.LastTerminationState.Terminated != nil {
			t.Errorf("not in place: PID 1 start %s -> %s, container %s -> %s, restarts %d, last termination %+v",
				before.start, after.start, b.ContainerID, a.ContainerID, a.RestartCount, a.LastTerminationState.Terminated)
		}
		if after.max != newLimit {
			t.Errorf("memory.max %d, want %d", after.max, newLimit)
		}
		// memory.high: the kubelet's under MemoryQoS with the node's
		// factor, before and after: the kubelet writes it with the
		// decrease, and the agent puts back its own hold only where it is
		// still there. Never the agent's lowered hold, never max.
		if want := kubeletHigh(32<<20, 160<<20); before.high != want {
			t.Errorf("memory.high %d before the decrease, want the kubelet's %d", before.high, want)
		}
		if want := kubeletHigh(32<<20, newLimit); after.high != want {
			t.Errorf("memory.high %d after the decrease, want the kubelet's for the new limit %d (before: %d)", after.high, want, before.high)
		}
		ev := agentEvent(t, c, "cache", "MemoryReclaimed")
		t.Logf("agent: %s", ev)
	})

	// A pod-level memory limit lowered below the pod's usage: the agent
	// reclaims in the pod cgroup, holding the pod's memory.high, and the
	// kubelet applies the decrease to the pod and its container in place.
	t.Run("PodLevel", func(t *testing.T) {
		p0, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "podcache", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before := readPodMem(t, c, p0)
		t.Logf("pod cgroup before: %s", before)
		if before.current < newLimit {
			t.Fatalf("pod usage %d is not above the new limit %d", before.current, newLimit)
		}
		// ApplyPodLevelMemoryHigh: the same formula over the pod's request
		// and limit.
		if want := kubeletHigh(32<<20, 160<<20); before.high != want {
			t.Errorf("pod memory.high %d before, want the kubelet's %d", before.high, want)
		}
		t0 := time.Now()
		c.k(t, "-n", reclaimNS, "patch", "pod", "podcache", "--subresource", "resize", "--patch",
			`{"spec":{"resources":{"requests":{"memory":"32Mi"},"limits":{"memory":"48Mi"}}}}`)
		var p *corev1.Pod
		poll(t, "the kubelet to apply the pod-level decrease", 200*time.Millisecond, func() (bool, error) {
			var err error
			p, err = c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "podcache", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			// The pod's status.resources is read back from its cgroup.
			done := p.Status.Resources != nil && p.Status.Resources.Limits.Memory().Value() == newLimit
			return done && resizeCondition(p) == nil && p.Status.ObservedGeneration == p.Generation, nil
		})
		timing(t, "reclaim_podlevel_patch_to_pod_cgroup", time.Since(t0))
		after := readPodMem(t, c, p)
		t.Logf("pod cgroup after: %s", after)
		if after.max != newLimit {
			t.Errorf("pod memory.max %d, want %d", after.max, newLimit)
		}
		a, b := p.Status.ContainerStatuses[0], p0.Status.ContainerStatuses[0]
		if after.start != before.start || a.ContainerID != b.ContainerID || a.RestartCount != 0 {
			t.Errorf("not in place: PID 1 start %s -> %s, container %s -> %s, restarts %d", before.start, after.start, b.ContainerID, a.ContainerID, a.RestartCount)
		}
		// The kubelet wrote the pod's memory.high with its new limit; the
		// agent left it.
		if want := kubeletHigh(32<<20, newLimit); after.high != want {
			t.Errorf("pod memory.high %d after the decrease, want the kubelet's for the new limit %d", after.high, want)
		}
		t.Logf("agent: %s", agentEvent(t, c, "podcache", "MemoryReclaimed"))
	})

	// A sidecar's (a restartable init container's) memory limit lowered
	// below its usage: resized in place like a container, with the same
	// help.
	t.Run("Sidecar", func(t *testing.T) {
		p0, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "sidecache", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before := readMemOf(t, c, "sidecache", "side")
		t.Logf("sidecar before: %s", before)
		t0 := time.Now()
		c.k(t, "-n", reclaimNS, "patch", "pod", "sidecache", "--subresource", "resize", "--patch",
			`{"spec":{"initContainers":[{"name":"side","resources":{"requests":{"memory":"32Mi"},"limits":{"memory":"48Mi"}}}]}}`)
		var p *corev1.Pod
		poll(t, "the kubelet to apply the sidecar's decrease", 200*time.Millisecond, func() (bool, error) {
			var err error
			p, err = c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "sidecache", metav1.GetOptions{})
			if err != nil || len(p.Status.InitContainerStatuses) == 0 {
				return false, err
			}
			r := p.Status.InitContainerStatuses[0].Resources
			return r != nil && r.Limits.Memory().Value() == newLimit && resizeCondition(p) == nil, nil
		})
		timing(t, "reclaim_sidecar_patch_to_status", time.Since(t0))
		after := readMemOf(t, c, "sidecache", "side")
		t.Logf("sidecar after: %s", after)
		a, b := p.Status.InitContainerStatuses[0], p0.Status.InitContainerStatuses[0]
		if after.start != before.start || a.ContainerID != b.ContainerID || a.RestartCount != 0 || after.max != newLimit {
			t.Errorf("not in place: PID 1 start %s -> %s, container %s -> %s, restarts %d, memory.max %d",
				before.start, after.start, b.ContainerID, a.ContainerID, a.RestartCount, after.max)
		}
		if want := kubeletHigh(32<<20, newLimit); after.high != want {
			t.Errorf("sidecar memory.high %d after the decrease, want the kubelet's %d", after.high, want)
		}
		t.Logf("agent: %s", agentEvent(t, c, "sidecache", "MemoryReclaimed"))
	})

	t.Run("AnonymousGivesUp", func(t *testing.T) {
		before := readMem(t, c, "anon")
		t.Logf("before: %s", before)
		if want := kubeletHigh(16<<20, 256<<20); before.high != want {
			t.Errorf("memory.high %d before, want the kubelet's %d", before.high, want)
		}
		t0 := time.Now()
		c.k(t, "-n", reclaimNS, "patch", "pod", "anon", "--subresource", "resize", "--patch", memPatch("16Mi", "40Mi"))
		ev := agentEvent(t, c, "anon", "MemoryReclaimFailed")
		timing(t, "reclaim_anonymous_patch_to_give_up", time.Since(t0))
		t.Logf("agent: %s", ev)
		if !strings.Contains(ev, "anon") {
			t.Errorf("the agent's message does not show the anonymous memory: %s", ev)
		}
		after := readMem(t, c, "anon")
		t.Logf("after: %s", after)
		if after.start != before.start || after.high != before.high || after.max != before.max {
			t.Errorf("after giving up: %s (PID 1 start %s), want it as before: %s (start %s)", after, after.start, before, before.start)
		}
		p, err := c.cs.CoreV1().Pods(reclaimNS).Get(ctx, "anon", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.State.Running == nil {
			t.Errorf("container not running as before: restarts %d, state %+v", cs.RestartCount, cs.State)
		}
		if cond := resizeCondition(p); cond != nil {
			t.Logf("the kubelet: %s %s: %s", cond.Type, cond.Reason, cond.Message)
		}
	})
	if out, err := c.try("-n", agentNS, "logs", "ds/"+agentDS, "--tail=400"); err == nil {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "reclaim") {
				t.Logf("agent log: %s", l)
			}
		}
	}
}

// agentEvent waits for the agent's Event reason on pod and returns its message.
func agentEvent(t *testing.T, c *cluster, pod, reason string) string {
	t.Helper()
	var msg string
	poll(t, "the agent's "+reason+" Event on "+pod, 500*time.Millisecond, func() (bool, error) {
		evs, err := c.cs.CoreV1().Events(reclaimNS).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason,
		})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Source.Component == "resize-agent" || e.ReportingController == "resize-agent" {
				msg = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events", len(evs.Items))
	})
	return msg
}
