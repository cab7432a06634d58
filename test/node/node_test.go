package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	agentNS  = "resize-agent"
	agentDS  = "resize-agent"
	stepWait = 5 * time.Minute
)

// idle is a test container's command: it waits, and exits on SIGTERM
// (busybox's sleep as PID 1 would ignore it and hold the pod for its
// grace period). One sleep an hour, not one a second: under TCG a fork and
// exec costs the node's one vCPU 10-20 ms, about 1% per container.
const idle = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"

// testNS is the namespace of the test running now (useTestNamespace): one
// per test, so that none waits for the one before to be deleted. The tests
// run one after another (none is parallel).
var testNS string

// cluster is what the tests run against.
type cluster struct {
	kubeconfig string
	kubectl    string
	cs         *kubernetes.Clientset
}

func setup(t *testing.T) *cluster {
	t.Helper()
	kc := os.Getenv("RESIZE_AGENT_NODE_KUBECONFIG")
	if kc == "" {
		msg := "RESIZE_AGENT_NODE_KUBECONFIG is not set: these tests need a Kubernetes node (make test-node, or deploy/kind/e2e.sh)"
		if os.Getenv("RESIZE_AGENT_REQUIRE_NODE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	kubectl := os.Getenv("KUBECTL")
	if kubectl == "" {
		kubectl = "kubectl"
	}
	if _, err := exec.LookPath(kubectl); err != nil {
		t.Fatalf("kubectl: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kc, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{kubeconfig: kc, kubectl: kubectl, cs: cs}
}

// k runs kubectl and returns its stdout; a failure fails the test.
func (c *cluster) k(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.try(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (c *cluster) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// timing records a measurement in the log and in RESIZE_AGENT_NODE_TIMINGS.
func timing(t *testing.T, name string, d time.Duration) {
	t.Helper()
	t.Logf("timing: %s = %.2f s", name, d.Seconds())
	if f := os.Getenv("RESIZE_AGENT_NODE_TIMINGS"); f != "" {
		fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("timings file: %v", err)
			return
		}
		defer fh.Close()
		fmt.Fprintf(fh, "%s_seconds %.2f\n", name, d.Seconds())
	}
}

// poll calls f every interval until it returns true or stepWait passes.
func poll(t *testing.T, what string, interval time.Duration, f func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(stepWait)
	var last error
	for time.Now().Before(deadline) {
		ok, err := f()
		if ok {
			return
		}
		last = err
		time.Sleep(interval)
	}
	t.Fatalf("timed out after %v waiting for %s (last error: %v)", stepWait, what, last)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "deploy", "base", "kustomization.yaml")); err != nil {
		t.Fatalf("repository root: %v", err)
	}
	return root
}

// TestNode runs in order: the node, the agent deployed, what a user does
// with it, and a kubelet in-place resize beside it.
func TestNode(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node, agentPod := withAgent(t, c)
	t.Run("ResizectlList", func(t *testing.T) {
		out := c.k(t, "-n", agentNS, "exec", "ds/"+agentDS, "--", "resizectl", "list")
		t.Logf("resizectl list:\n%s", out)
		if !strings.HasPrefix(out, "ID ") || !strings.Contains(out, "CONTAINER") {
			t.Errorf("resizectl list printed no table: %q", out)
		}
	})
	t.Run("Logs", func(t *testing.T) {
		out := c.k(t, "-n", agentNS, "logs", "ds/"+agentDS, "--tail=20")
		if strings.TrimSpace(out) == "" {
			t.Error("kubectl logs returned nothing")
		}
	})
	t.Run("Metrics", func(t *testing.T) { metrics(t, c, agentPod) })
	t.Run("KubeletResize", func(t *testing.T) { kubeletResize(ctx, t, c, node) })
}

func nodeReady(t *testing.T, c *cluster) *corev1.Node {
	ctx := context.Background()
	var node *corev1.Node
	poll(t, "a Ready node", time.Second, func() (bool, error) {
		nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		want := os.Getenv("RESIZE_AGENT_NODE_NAME") // the node to test on; any Ready one if empty
		for i := range nodes.Items {
			if want != "" && nodes.Items[i].Name != want {
				continue
			}
			for _, cond := range nodes.Items[i].Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					node = &nodes.Items[i]
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("%d nodes, none Ready", len(nodes.Items))
	})
	info := node.Status.NodeInfo
	t.Logf("node %s: kubelet %s, %s, kernel %s, %s", node.Name, info.KubeletVersion, info.ContainerRuntimeVersion, info.KernelVersion, info.OSImage)
	sv, err := c.cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if info.KubeletVersion != sv.GitVersion {
		t.Errorf("kubelet %s, API server %s: the node tests run both at one version", info.KubeletVersion, sv.GitVersion)
	}
	if !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("container runtime %s, want containerd", info.ContainerRuntimeVersion)
	}
	return node
}

// useTestNamespace gives the test a namespace of its own,
// resize-agent-node-e2e-<test>, in testNS.
func useTestNamespace(t *testing.T, c *cluster) {
	t.Helper()
	testNS = "resize-agent-node-e2e-" + strings.ToLower(strings.TrimPrefix(strings.SplitN(t.Name(), "/", 2)[0], "Test"))
	useNamespace(t, c, testNS)
}

// useNamespace gives the test an empty namespace of that name, waiting for
// its default ServiceAccount (the controller manager makes it; pods need
// it). A namespace of that name still there is from an earlier run (each
// test has its own): it waits for that to be gone first, as the API
// server refuses new pods in a terminating namespace. At the end it
// deletes the namespace without waiting: under TCG the kubelet takes
// 10-30 s to remove a pod and the namespace controller backs off while it
// does, which cost about 25 s per test when each test waited; the next
// test runs meanwhile.
func useNamespace(t *testing.T, c *cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	poll(t, "namespace "+ns+" left by an earlier run gone", time.Second, func() (bool, error) {
		got, err := c.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, err
		case got.DeletionTimestamp == nil:
			// Left by a run that was killed: start from nothing.
			c.try("-n", ns, "delete", "pods", "--all", "--grace-period=1", "--wait=false")
			c.try("delete", "namespace", ns, "--wait=false")
		}
		return false, fmt.Errorf("namespace %s is %s", ns, got.Status.Phase)
	})
	c.k(t, "create", "namespace", ns)
	t.Cleanup(func() {
		// A short grace for the pods: busybox's sleep as PID 1 ignores SIGTERM
		// and would hold them for the default 30 s.
		c.try("-n", ns, "delete", "pods", "--all", "--grace-period=1", "--wait=false")
		if out, err := c.try("delete", "namespace", ns, "--wait=false"); err != nil {
			t.Logf("deleting namespace %s: %v %s", ns, err, out)
		}
	})
	poll(t, "the default ServiceAccount of "+ns, 500*time.Millisecond, func() (bool, error) {
		_, err := c.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
}

// kubeletMinor is the node's kubelet minor version (1.34.4: 34), for the
// steps whose expectations differ between the releases we support.
func kubeletMinor(t *testing.T, n *corev1.Node) int {
	t.Helper()
	v := strings.TrimPrefix(n.Status.NodeInfo.KubeletVersion, "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		t.Fatalf("kubelet version %q", n.Status.NodeInfo.KubeletVersion)
	}
	minor, err := strconv.Atoi(parts[1])
	if err != nil {
		t.Fatalf("kubelet version %q: %v", n.Status.NodeInfo.KubeletVersion, err)
	}
	return minor
}

// withAgent is the start of a test about the agent on the node: the node
// Ready and the agent deployed, as subtests that end the test if they
// fail; should the test fail later, the agent's last log lines.
func withAgent(t *testing.T, c *cluster) (*corev1.Node, *corev1.Pod) {
	t.Helper()
	var node *corev1.Node
	if !t.Run("NodeReady", func(t *testing.T) { node = nodeReady(t, c) }) {
		t.FailNow()
	}
	var pod *corev1.Pod
	if !t.Run("DeployAgent", func(t *testing.T) { pod = deployAgent(t, c, node) }) {
		t.FailNow()
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, err := c.try("-n", agentNS, "logs", "ds/"+agentDS, "--tail=120")
			t.Logf("agent logs (%v):\n%s", err, out)
		}
	})
	return node, pod
}

func deployAgent(t *testing.T, c *cluster, node *corev1.Node) *corev1.Pod {
	ctx := context.Background()
	overlay := os.Getenv("RESIZE_AGENT_NODE_OVERLAY")
	if overlay == "" {
		overlay = filepath.Join(repoRoot(t), "deploy", "overlays", "local")
	}
	start := time.Now()
	t.Logf("kubectl apply -k %s:\n%s", overlay, c.k(t, "apply", "-k", overlay))
	// An earlier test may have changed the DaemonSet (its drift policy):
	// applying the overlay again then rolls the pod, and until the rollout
	// ends the old pod is still Running and Ready, on its way out.
	c.k(t, "-n", agentNS, "rollout", "status", "daemonset/"+agentDS, "--timeout=110s") // within try's 2 minutes
	pod := waitAgentPod(t, c, node)
	timing(t, "agent_apply_to_ready", time.Since(start))

	ds, err := c.cs.AppsV1().DaemonSets(agentNS).Get(ctx, agentDS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.NumberReady < 1 || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
		t.Errorf("DaemonSet status: %d of %d ready", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
	}
	checkAgentPod(t, ds, pod)
	return pod
}

// checkAgentPod: the pod is what the manifest declares, as a cluster made
// it: owned by the DaemonSet, privileged, the manifest's mounts, and a
// projected, bound service account token.
func checkAgentPod(t *testing.T, ds *appsv1.DaemonSet, pod *corev1.Pod) {
	if len(pod.OwnerReferences) == 0 || pod.OwnerReferences[0].Kind != "DaemonSet" || pod.OwnerReferences[0].Name != ds.Name {
		t.Errorf("pod %s is not owned by DaemonSet %s: %+v", pod.Name, ds.Name, pod.OwnerReferences)
	}
	if pod.Spec.HostNetwork {
		t.Error("the agent's pod is host-network; the manifest says pod network")
	}
	if pod.Status.PodIP == "" {
		t.Error("the agent's pod has no pod IP")
	}
	ctr := pod.Spec.Containers[0]
	if sc := ctr.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the agent's container is not privileged")
	}
	have := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		have[m.Name] = m.MountPath
	}
	for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		if have[m.Name] != m.MountPath {
			t.Errorf("mount %s: pod has %q, manifest %q", m.Name, have[m.Name], m.MountPath)
		}
	}
	bound := false
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil && s.ServiceAccountToken.ExpirationSeconds != nil {
				bound = true
			}
		}
	}
	if !bound {
		t.Error("no projected service account token volume on the agent's pod")
	}
	if st := pod.Status.ContainerStatuses; len(st) == 0 || st[0].RestartCount != 0 {
		t.Errorf("the agent's container restarted: %+v", st)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitingReasons(p *corev1.Pod) string {
	var r []string
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			r = append(r, s.Name+": "+s.State.Waiting.Reason+" "+s.State.Waiting.Message)
		}
		if s.LastTerminationState.Terminated != nil {
			r = append(r, fmt.Sprintf("%s: last exit %d %s", s.Name, s.LastTerminationState.Terminated.ExitCode, s.LastTerminationState.Terminated.Reason))
		}
	}
	return strings.Join(r, "; ")
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 9847`)

// metrics reads /metrics through kubectl port-forward (API server ->
// kubelet -> the pod's network namespace), as a user would.
func metrics(t *testing.T, c *cluster, pod *corev1.Pod) {
	body := scrapeMetrics(t, c, pod)
	t.Logf("/metrics: %d bytes, %d resize_agent_ lines", len(body), strings.Count(body, "\nresize_agent_"))
}

// scrapeMetrics returns the agent pod's /metrics, read through kubectl
// port-forward.
func scrapeMetrics(t *testing.T, c *cluster, pod *corev1.Pod) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig, "-n", agentNS, "port-forward", "pod/"+pod.Name, ":9847")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwardingRE.FindStringSubmatch(sc.Text()); m != nil {
				port <- m[1]
			}
		}
		close(port)
	}()
	var p string
	select {
	case p = <-port:
	case <-ctx.Done():
	}
	if p == "" {
		t.Fatalf("kubectl port-forward did not forward: %s", stderr.String())
	}
	resp, err := http.Get("http://127.0.0.1:" + p + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("resize_agent_")) {
		t.Fatalf("GET /metrics: %s, %d bytes, no resize_agent_ metric", resp.Status, len(body))
	}
	return string(body)
}

// sample is one line of the watcher in the resized container: its PID 1's
// start time (a restarted container has a new one) and its cgroup files.
type sample struct {
	at                            time.Time
	start, cpuMax, weight, memMax string
}

// watcher streams the container's own cgroup files (its cgroup namespace's
// root) every 200 ms through kubectl exec; each line is timed on arrival.
// Not faster: the loop forks four times a round in the container, and at
// 50 ms that load on the node's one vCPU starved the agent (weight 1 for its
// 20m request) and put its own measurements seconds behind.
func watcher(ctx context.Context, t *testing.T, c *cluster, pod string) (<-chan sample, func()) {
	ctx, cancel := context.WithCancel(ctx)
	script := `while :; do echo "$(cut -d' ' -f22 /proc/1/stat)|$(cat /sys/fs/cgroup/cpu.max)|$(cat /sys/fs/cgroup/cpu.weight)|$(cat /sys/fs/cgroup/memory.max)"; usleep 200000; done`
	cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig, "-n", testNS, "exec", pod, "-c", "app", "--", "sh", "-c", script)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan sample, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(ch)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Split(sc.Text(), "|")
			if len(f) != 4 {
				continue
			}
			select {
			case ch <- sample{at: time.Now(), start: f[0], cpuMax: f[1], weight: f[2], memMax: f[3]}:
			default: // nobody reads: keep the newest only
			}
		}
	}()
	return ch, func() { cancel(); cmd.Wait(); wg.Wait() }
}

func kubeletResize(ctx context.Context, t *testing.T, c *cluster, node *corev1.Node) {
	useTestNamespace(t, c)
	image := os.Getenv("RESIZE_AGENT_NODE_BUSYBOX")
	if image == "" {
		image = "localhost/resize-agent/busybox:latest" // the VM harness's, imported in the guest
	}
	const name = "kubelet-resize"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: corev1.PodSpec{
			NodeName:                      node.Name,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name:            "app",
				Image:           image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"sh", "-c", idle},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
				ResizePolicy: []corev1.ContainerResizePolicy{
					{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
					{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.NotRequired},
				},
			}},
		},
	}
	start := time.Now()
	if _, err := c.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var before *corev1.Pod
	poll(t, "the test pod Ready", 500*time.Millisecond, func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || !podReady(p) {
			return false, err
		}
		before = p
		return true, nil
	})
	timing(t, "pod_create_to_ready", time.Since(start))

	samples, stop := watcher(ctx, t, c, name)
	defer stop()
	var first sample
	select {
	case first = <-samples:
	case <-time.After(time.Minute):
		t.Fatal("no sample from the watcher in the container within a minute")
	}
	t.Logf("before: cpu.max %q cpu.weight %s memory.max %s (PID 1 started at tick %s)", first.cpuMax, first.weight, first.memMax, first.start)
	if first.cpuMax != "50000 100000" || first.memMax != "67108864" {
		t.Fatalf("before the resize: cpu.max %q memory.max %q, want 50000 100000 and 67108864", first.cpuMax, first.memMax)
	}

	// CPU limit 500m -> 800m, request 100m -> 200m, memory limit 64Mi -> 96Mi.
	patch := `{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"200m","memory":"32Mi"},"limits":{"cpu":"800m","memory":"96Mi"}}}]}}`
	t0 := time.Now()
	c.k(t, "-n", testNS, "patch", "pod", name, "--subresource", "resize", "--patch", patch)
	timing(t, "kubectl_patch_returned", time.Since(t0))

	var filesAt time.Time
	var last sample
	deadline := time.After(2 * time.Minute)
	for filesAt.IsZero() {
		select {
		case s, ok := <-samples:
			if !ok {
				t.Fatalf("the watcher in the container ended (last %+v): the container restarted?", last)
			}
			last = s
			if s.start != first.start {
				t.Fatalf("PID 1 of the container changed (start tick %s -> %s): not resized in place", first.start, s.start)
			}
			if s.cpuMax == "80000 100000" && s.memMax == "100663296" {
				filesAt = s.at
			}
		case <-deadline:
			t.Fatalf("cgroup files not resized 2 minutes after the patch: %+v", last)
		}
	}
	timing(t, "patch_to_cgroup_files", filesAt.Sub(t0))
	if last.weight == first.weight {
		t.Errorf("cpu.weight stayed %s after the CPU request went 100m -> 200m", last.weight)
	}
	t.Logf("after: cpu.max %q cpu.weight %s memory.max %s", last.cpuMax, last.weight, last.memMax)

	want := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("800m"), corev1.ResourceMemory: resource.MustParse("96Mi")},
	}
	var after *corev1.Pod
	poll(t, "status.containerStatuses[].resources to report the resize", 100*time.Millisecond, func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].Resources == nil {
			return false, fmt.Errorf("no resources in the status")
		}
		got := *p.Status.ContainerStatuses[0].Resources
		if !sameResources(got, want) {
			return false, fmt.Errorf("status resources %v", got)
		}
		after = p
		return true, nil
	})
	timing(t, "patch_to_status", time.Since(t0))

	b, a := before.Status.ContainerStatuses[0], after.Status.ContainerStatuses[0]
	if a.ContainerID != b.ContainerID || a.RestartCount != 0 {
		t.Errorf("container %s (restarts %d) became %s (restarts %d): not in place", b.ContainerID, b.RestartCount, a.ContainerID, a.RestartCount)
	}
	for _, cond := range after.Status.Conditions {
		if cond.Type == corev1.PodResizePending || cond.Type == corev1.PodResizeInProgress {
			t.Errorf("condition %s still set after the resize: %s %s", cond.Type, cond.Reason, cond.Message)
		}
	}
	if raw, err := json.Marshal(a.Resources); err == nil {
		t.Logf("status resources: %s", raw)
	}
}

func sameResources(a, b corev1.ResourceRequirements) bool {
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

// guestClockSkew estimates how far the node's clock is ahead of the
// host's (negative: behind). The guest sets its clock from the emulated
// RTC at boot, to the second, and the agent's times (seen, the cgroup
// files) are the guest's while the API server's are the host's. The
// container prints the guest's time (busybox adjtimex, µs) ten times; each
// line reaches the test after some delay, so guest time minus arrival is
// at most the skew, and the largest is the closest.
func guestClockSkew(ctx context.Context, t *testing.T, c *cluster, pod, container string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	script := `for i in 1 2 3 4 5 6 7 8 9 10; do adjtimex | sed -n 's/.*tv_sec: *//p; s/.*tv_usec: *//p' | tr '\n' ' '; echo; usleep 200000; done`
	cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig, "-n", testNS, "exec", pod, "-c", container, "--", "sh", "-c", script)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	best, n := time.Duration(math.MinInt64), 0
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		arrived := time.Now()
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		sec, err1 := strconv.ParseInt(f[0], 10, 64)
		usec, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		n++
		best = max(best, time.Unix(sec, usec*1000).Sub(arrived))
	}
	if err := cmd.Wait(); err != nil || n == 0 {
		t.Fatalf("the guest's clock through kubectl exec %s: %v (%d readings)", pod, err, n)
	}
	return best
}

// waitAgentPod waits for the DaemonSet's pod on the node, Running and
// Ready and not on its way out.
func waitAgentPod(t *testing.T, c *cluster, node *corev1.Node) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	poll(t, "the DaemonSet's pod on "+node.Name+" Running and Ready", 500*time.Millisecond, func() (bool, error) {
		pods, err := c.cs.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=resize-agent", FieldSelector: "spec.nodeName=" + node.Name,
		})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Errorf("no agent pod yet (%v)", err)
		}
		var p *corev1.Pod
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp == nil {
				p = &pods.Items[i]
			}
		}
		if p == nil {
			return false, fmt.Errorf("only terminating agent pods")
		}
		if p.Status.Phase != corev1.PodRunning || !podReady(p) {
			return false, fmt.Errorf("pod %s: phase %s, ready %v, %s", p.Name, p.Status.Phase, podReady(p), waitingReasons(p))
		}
		pod = p
		return true, nil
	})
	return pod
}

// driftChecks is the agent's resize_agent_drift_checks_total{against=
// "allocation"}: the drift checks against the kubelet's allocation it did.
func driftChecks(t *testing.T, c *cluster) float64 {
	t.Helper()
	pods, err := c.cs.CoreV1().Pods(agentNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=resize-agent"})
	if err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && podReady(p) {
			pod = p
		}
	}
	if pod == nil {
		t.Fatalf("no Ready agent pod to read drift checks from")
	}
	const name = `resize_agent_drift_checks_total{against="allocation"} `
	for _, l := range strings.Split(scrapeMetrics(t, c, pod), "\n") {
		if v, ok := strings.CutPrefix(l, name); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s%s: %v", name, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in the agent's metrics", strings.TrimSpace(name))
	return 0
}

// afterDriftChecks waits until the agent has done n more drift checks
// against the allocation: proof that the checks ran over what the test
// did before, where a sleep of as many intervals would only hope so.
func afterDriftChecks(t *testing.T, c *cluster, n int) {
	t.Helper()
	start := driftChecks(t, c)
	poll(t, fmt.Sprintf("%d drift checks by the agent", n), 2*time.Second, func() (bool, error) {
		got := driftChecks(t, c)
		return got >= start+float64(n), fmt.Errorf("%v of them so far", got-start)
	})
}
