package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

const (
	annotationKey = "resize.resizer.io/resources" // agent/kube AnnotationResources
	agentManager  = "resize-agent"                // agent/kube FieldManager
	ownCondition  = "resize.resizer.io/Resize"    // agent/kube ConditionType
)

// TestCompanion: in Kubernetes mode the agent is the kubelet's companion.
// An annotation becomes a pods/resize patch that the kubelet actuates in
// place (same container, its cgroup files), the intent ends Completed once
// the agent read the files back; over two minutes after, the agent's field
// manager writes none of the kubelet's conditions and they do not flap; a
// RestartContainer memory resize restarts the container once, by the
// kubelet, with its log kept; the local API refuses Kubernetes pods.
func TestCompanion(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node, agentPod := withAgent(t, c)
	useTestNamespace(t, c)
	// The agent acts once it has seen the annotation policy (at start).
	poll(t, "the agent acting on annotations", time.Second, func() (bool, error) {
		out, err := c.try("-n", agentNS, "logs", agentPod.Name)
		if strings.Contains(out, "annotation policy in force") {
			return true, nil
		}
		return false, fmt.Errorf("not yet (%v)", err)
	})

	tc := t
	var watched chan struct{} // closed when the watch of "annotated" ends
	t.Run("AnnotationInPlace", func(t *testing.T) {
		pod := companionPod(t, c, node, "annotated", corev1.NotRequired)
		samples, stop := watcher(ctx, t, c, pod.Name)
		defer stop()
		var first sample
		select {
		case first = <-samples:
		case <-time.After(time.Minute):
			t.Fatal("no sample from the watcher in the container within a minute")
		}
		t0 := time.Now()
		annotate(t, c, pod.Name, `{"app": {"requests": {"cpu": "200m"}, "limits": {"cpu": "800m", "memory": "96Mi"}}}`)
		var last sample
		deadline := time.After(2 * time.Minute)
		for last.cpuMax != "80000 100000" || last.memMax != "100663296" {
			select {
			case s, ok := <-samples:
				if !ok {
					t.Fatalf("the watcher ended (last %+v): the container restarted?", last)
				}
				if s.start != first.start {
					t.Fatalf("PID 1 changed (start tick %s -> %s): not in place", first.start, s.start)
				}
				last = s
			case <-deadline:
				t.Fatalf("cgroup files not resized 2 minutes after the annotation: %+v", last)
			}
		}
		timing(t, "annotation_to_cgroup_files", time.Since(t0))
		it := waitIntent(t, c, pod, "Completed")
		timing(t, "annotation_to_intent_completed", time.Since(t0))
		t.Logf("intent %s: %s %s", it.ID, it.Status.Reason, it.Status.Message)
		if it.Status.Reason != "Verified" {
			t.Errorf("intent %+v", it.Status)
		}
		got, err := c.cs.CoreV1().Pods(testNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cs := got.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.ContainerID != pod.Status.ContainerStatuses[0].ContainerID {
			t.Errorf("container %s restarts %d: not in place", cs.ContainerID, cs.RestartCount)
		}
		if l := got.Spec.Containers[0].Resources.Limits; l.Cpu().String() != "800m" || l.Memory().String() != "96Mi" {
			t.Errorf("spec limits %v: not through pods/resize", l)
		}
		checkManagers(t, got)

		// Two minutes of the pod: the kubelet's 10 s status syncs and its
		// 1-minute sync, with the agent beside it. They run while the
		// next subtests that leave this pod alone do (on the parent test,
		// which outlives them), not as two minutes of their own.
		watched = make(chan struct{})
		go func() {
			defer close(watched)
			watchConditions(ctx, tc, c, got, 2*time.Minute)
		}()
	})

	t.Run("LocalAPIRefusesPods", func(t *testing.T) {
		p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, "annotated", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.try("-n", agentNS, "exec", agentPod.Name, "--", "resizectl", "resize", "app", "--pod-uid", string(p.UID), "--cpu-limit", "2")
		if err == nil || !strings.Contains(out+err.Error(), "kubelet owns") {
			t.Errorf("resizectl on a Kubernetes pod: %v\n%s", err, out)
		}
	})

	t.Run("RestartContainerByTheKubelet", func(t *testing.T) {
		pod := companionPod(t, c, node, "restarting", corev1.RestartContainer)
		t0 := time.Now()
		annotate(t, c, pod.Name, `{"app": {"limits": {"memory": "96Mi"}}}`)
		it := waitIntent(t, c, pod, "Completed")
		timing(t, "restart_annotation_to_completed", time.Since(t0))
		t.Logf("intent %s: %s", it.ID, it.Status.Message)
		got, err := c.cs.CoreV1().Pods(testNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs := got.Status.ContainerStatuses[0]
		if cs.RestartCount != 1 {
			t.Errorf("restartCount %d, want 1", cs.RestartCount)
		}
		// The kubelet can count the restart in the status before it knows
		// the previous attempt's termination (a CI run: "previous
		// terminated container not found" with restartCount 1).
		var prev string
		var prevErr error
		for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(time.Second) {
			if prev, prevErr = c.try("-n", testNS, "logs", pod.Name, "--previous"); prevErr == nil {
				break
			}
		}
		switch {
		case prevErr == nil && !strings.Contains(prev, "started"):
			t.Errorf("kubectl logs --previous: %q, not the first attempt's log", prev)
		case prevErr != nil:
			// Seen in CI and here, one run in three: the kubelet's status
			// keeps no lastState.terminated for a container it restarted
			// for a resize, so the kubelet finds no previous container to
			// read (validateContainerLogStatus, pkg/kubelet/kubelet_pods.go),
			// though the runtime still holds it. The restart is then proved
			// by a new container ID beside restartCount 1.
			first := pod.Status.ContainerStatuses
			if len(first) == 0 || first[0].ContainerID == "" || first[0].ContainerID == cs.ContainerID {
				t.Errorf("kubectl logs --previous: %v; and no new container ID to show the restart (%v -> %s)", prevErr, first, cs.ContainerID)
			} else {
				t.Logf("kubectl logs --previous: %v (the kubelet's status has lastState %+v); the restart shows as container %s -> %s",
					prevErr, cs.LastTerminationState, first[0].ContainerID, cs.ContainerID)
			}
		}
		cur := c.k(t, "-n", testNS, "logs", pod.Name)
		if strings.Count(cur, "started") != 1 {
			t.Errorf("kubectl logs: %q (both attempts in one log?)", cur)
		}
		if out := c.k(t, "-n", testNS, "exec", pod.Name, "--", "cat", "/sys/fs/cgroup/memory.max"); strings.TrimSpace(out) != "100663296" {
			t.Errorf("memory.max %q", out)
		}
		checkManagers(t, got)
		time.Sleep(15 * time.Second) // a kubelet sync or two: no second restart
		got, _ = c.cs.CoreV1().Pods(testNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if n := got.Status.ContainerStatuses[0].RestartCount; n != 1 {
			t.Errorf("restartCount %d later, want 1", n)
		}
	})

	// The crash below ends the quiet the watch is for.
	if watched != nil {
		<-watched
	}

	// A crash after a resize: the kubelet starts the next attempt from the
	// resized spec (issue 15, finding 5: no path may drop what was asked).
	t.Run("CrashKeepsTheResize", func(t *testing.T) {
		before, err := c.cs.CoreV1().Pods(testNS).Get(ctx, "annotated", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		old := before.Status.ContainerStatuses[0]
		c.try("-n", testNS, "exec", "annotated", "--", "kill", "1") // PID 1 traps TERM and exits
		var after *corev1.Pod
		poll(t, "the container's next attempt Ready", 500*time.Millisecond, func() (bool, error) {
			p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, "annotated", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.RestartCount != old.RestartCount+1 || cs.ContainerID == old.ContainerID || !podReady(p) {
				return false, fmt.Errorf("restarts %d, ready %v", cs.RestartCount, podReady(p))
			}
			after = p
			return true, nil
		})
		for file, want := range map[string]string{"cpu.max": "80000 100000", "memory.max": "100663296"} {
			if out := c.k(t, "-n", testNS, "exec", "annotated", "--", "cat", "/sys/fs/cgroup/"+file); strings.TrimSpace(out) != want {
				t.Errorf("%s of the next attempt %q, want %q: the resize was dropped", file, strings.TrimSpace(out), want)
			}
		}
		if r := after.Status.ContainerStatuses[0].Resources; r == nil || r.Limits.Cpu().String() != "800m" || r.Limits.Memory().String() != "96Mi" {
			t.Errorf("status resources after the crash: %+v", r)
		}
		if it := waitIntent(t, c, after, "Completed"); it.Status.Reason != "Verified" {
			t.Errorf("intent after the crash: %+v", it.Status)
		}
		checkManagers(t, after)
	})
}

func companionPod(t *testing.T, c *cluster, node *corev1.Node, name string, memPolicy corev1.ResourceResizeRestartPolicy) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	image := os.Getenv("RESIZE_AGENT_NODE_BUSYBOX")
	if image == "" {
		image = "localhost/resize-agent/busybox:latest"
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: corev1.PodSpec{
			NodeName:                      node.Name,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", "echo started; " + idle},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
				ResizePolicy: []corev1.ContainerResizePolicy{
					{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
					{ResourceName: corev1.ResourceMemory, RestartPolicy: memPolicy},
				},
			}},
		},
	}
	if _, err := c.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ready *corev1.Pod
	poll(t, "pod "+name+" Ready", 500*time.Millisecond, func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || !podReady(p) {
			return false, err
		}
		ready = p
		return true, nil
	})
	return ready
}

// annotate sets the agent's annotation as the cluster's administrator
// (who may patch pods/resize, as the annotation policy requires).
func annotate(t *testing.T, c *cluster, pod, value string) {
	t.Helper()
	c.k(t, "-n", testNS, "annotate", "--overwrite", "pod", pod, annotationKey+"="+value)
}

type agentIntent struct {
	ID   string `json:"id"`
	Spec struct {
		Target struct {
			PodUID string `json:"podUID"`
		} `json:"target"`
	} `json:"spec"`
	Status struct {
		State   string `json:"state"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"status"`
}

// waitIntent waits until the agent's newest intent for the pod is in
// state, read through resizectl in the agent's pod, as a user would.
func waitIntent(t *testing.T, c *cluster, pod *corev1.Pod, state string) agentIntent {
	t.Helper()
	var it agentIntent
	poll(t, "the intent of "+pod.Name+" "+state, time.Second, func() (bool, error) {
		out, err := c.try("-n", agentNS, "exec", "ds/"+agentDS, "--", "resizectl", "list", "-o", "json")
		if err != nil {
			return false, err
		}
		var list []agentIntent
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return false, fmt.Errorf("%w: %s", err, out)
		}
		it = agentIntent{}
		for _, x := range list {
			if x.Spec.Target.PodUID == string(pod.UID) {
				it = x
			}
		}
		if it.Status.State == "Failed" || it.Status.State == "Infeasible" {
			t.Fatalf("intent %s %s: %s %s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message)
		}
		return it.Status.State == state, fmt.Errorf("intent %q: %s %s %s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message)
	})
	return it
}

// checkManagers: the agent's field manager owns the resize (subresource
// resize) and its own condition, never a kubelet condition.
func checkManagers(t *testing.T, p *corev1.Pod) {
	t.Helper()
	var resize bool
	for _, m := range p.ManagedFields {
		if m.Manager != agentManager || m.FieldsV1 == nil {
			continue
		}
		f := string(m.FieldsV1.Raw)
		if m.Subresource == "resize" {
			resize = true
		}
		if strings.Contains(f, "PodResizePending") || strings.Contains(f, "PodResizeInProgress") {
			t.Errorf("the agent's field manager owns a kubelet condition (%s): %s", m.Subresource, f)
		}
	}
	if !resize {
		t.Errorf("no pods/resize write by %s in the managed fields", agentManager)
	}
}

// watchConditions watches the pod for d: every write must leave the
// kubelet's resize conditions absent (the resize is done: nothing to
// report), and the agent's field manager must never own one.
func watchConditions(ctx context.Context, t *testing.T, c *cluster, p *corev1.Pod, d time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	w, err := c.cs.CoreV1().Pods(testNS).Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name).String(), ResourceVersion: p.ResourceVersion})
	if err != nil {
		t.Errorf("watching %s: %v", p.Name, err) // not Fatal: it may run in a goroutine of its own
		return
	}
	defer w.Stop()
	writes, seen := 0, map[string]int{}
	for e := range w.ResultChan() {
		if e.Type == watch.Error {
			t.Errorf("watch error: %+v", e.Object)
			continue
		}
		q, ok := e.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		writes++
		for _, cond := range q.Status.Conditions {
			if cond.Type == corev1.PodResizePending || cond.Type == corev1.PodResizeInProgress {
				seen[string(cond.Type)+"/"+cond.Reason]++
			}
		}
		checkManagers(t, q)
	}
	t.Logf("%s watched for %s: %d writes, kubelet resize conditions seen %v", p.Name, d, writes, seen)
	if len(seen) > 0 {
		t.Errorf("the kubelet's resize conditions came back after the resize: %v", seen)
	}
}
