package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resizer/resize-agent/agent/api"
)

// NodeBench is what TestResizeBench writes to NODE_BENCH_OUT and make bench
// renders (test/bench reads the same JSON): per mode ("kubelet alone",
// "with the agent") and measurement, the seconds of each resize.
type NodeBench struct {
	Kubelet string         `json:"kubelet"`
	Blocks  []string       `json:"blocks"`
	Rows    []NodeBenchRow `json:"rows"`
}

type NodeBenchRow struct {
	Mode    string    `json:"mode"`
	What    string    `json:"what"`
	Seconds []float64 `json:"seconds"`
}

const (
	benchAlone    = "kubelet alone"
	benchAgent    = "with the agent"
	benchAgentOff = "with the agent, eBPF off"
)

// TestResizeBench (make bench; issue 16 target 6, issue 14 item 2): the
// same resize requested through pods/resize, as the kubelet does it alone
// (the agent's DaemonSet deleted) and as it completes with the agent
// beside it, with its eBPF programs and without them (--bpf=off: what the
// scheduler hooks cost the kubelet's resize on a node of one CPU), in
// blocks alone, agent, agent without eBPF twice, agent, alone, so that no
// mode gets only the warmer node. Each block's first resize is not
// counted: it follows the agent's start (its first look at every pod and
// cgroup) in the blocks that start it. For each resize, from the patch being sent, on the
// host's clock: the patch answered, the kubelet's admission seen
// (PodResizeInProgress or observedGeneration), the container's cgroup
// files holding the new values (read from inside it every 200 ms), the
// status reporting them, and the kubelet's own
// kubelet_pod_resize_duration_milliseconds for it; with the agent, also
// the agent's phases for the same resize. It measures; its checks only
// make sure each resize happened in place.
func TestResizeBench(t *testing.T) {
	outFile := os.Getenv("NODE_BENCH_OUT")
	if outFile == "" {
		t.Skip("a measurement for make bench, which sets NODE_BENCH_OUT; make test-node checks the same resize in TestLatency")
	}
	perBlock := 4
	if v, err := strconv.Atoi(os.Getenv("NODE_BENCH_N")); err == nil && v > 0 {
		perBlock = v
	}
	c := setup(t)
	ctx := context.Background()
	var node *corev1.Node
	if !t.Run("NodeReady", func(t *testing.T) { node = nodeReady(t, c) }) {
		t.FailNow()
	}
	useTestNamespace(t, c)
	res := NodeBench{Kubelet: node.Status.NodeInfo.KubeletVersion,
		Blocks: []string{benchAlone, benchAgent, benchAgentOff, benchAgentOff, benchAgent, benchAlone}}
	rows := map[[2]string]*NodeBenchRow{}
	var order [][2]string // rows in the order first measured
	add := func(mode, what string, s float64) {
		k := [2]string{mode, what}
		if rows[k] == nil {
			rows[k] = &NodeBenchRow{Mode: mode, What: what}
			order = append(order, k)
		}
		rows[k].Seconds = append(rows[k].Seconds, s)
	}
	running := "" // the mode the node is in
	for bi, mode := range res.Blocks {
		if mode != running {
			switch mode {
			case benchAlone:
				removeAgent(t, c, node)
			case benchAgent:
				deployAgent(t, c, node) // applying the overlay again takes --bpf=off away
			case benchAgentOff:
				deployAgent(t, c, node)
				c.k(t, "-n", agentNS, "patch", "ds", agentDS, "--type=json", "-p",
					`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--bpf=off"}]`)
				c.k(t, "-n", agentNS, "rollout", "status", "daemonset/"+agentDS, "--timeout=110s")
				waitAgentPod(t, c, node)
			}
			running = mode
		}
		name := fmt.Sprintf("bench-%d", bi)
		b := benchPod(ctx, t, c, node, name)
		warm := b.resize(ctx, t, true)
		t.Logf("%s, block %d, warm-up resize (not counted): %v", mode, bi, warm)
		cur, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		warmGen := cur.Generation
		for i := 0; i < perBlock; i++ {
			m := b.resize(ctx, t, i%2 == 1)
			for _, w := range []string{"patch answered", "admitted", "cgroup", "status", "kubelet"} {
				if v, ok := m[w]; ok {
					add(mode, w, v)
				}
			}
			t.Logf("%s, block %d, resize %d: %v", mode, bi, i, m)
		}
		b.stop()
		if mode != benchAlone {
			for _, r := range agentResizes(t, c, name) {
				if r.Generation <= warmGen {
					continue // the warm-up
				}
				for _, p := range r.Phases {
					add(mode, "agent "+p.Phase, p.Seconds)
				}
			}
		}
		c.try("-n", testNS, "delete", "pod", name, "--wait=true", "--timeout=110s")
	}
	for _, k := range order {
		res.Rows = append(res.Rows, *rows[k])
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", outFile, b)
}

// removeAgent deletes the agent's DaemonSet and waits until its pod on the
// node is gone: the kubelet alone.
func removeAgent(t *testing.T, c *cluster, node *corev1.Node) {
	t.Helper()
	c.try("-n", agentNS, "delete", "daemonset", agentDS, "--ignore-not-found", "--wait=false")
	poll(t, "no agent pod on "+node.Name, time.Second, func() (bool, error) {
		pods, err := c.cs.CoreV1().Pods(agentNS).List(context.Background(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=resize-agent", FieldSelector: "spec.nodeName=" + node.Name,
		})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0, fmt.Errorf("%d agent pods left", len(pods.Items))
	})
}

type benchRun struct {
	c       *cluster
	node    string
	name    string
	samples <-chan sample
	stop    func()
	first   sample
}

// benchPod creates the measured pod (one quiet container, app, that the
// watcher runs in) and waits until it is Ready and the watcher reads.
func benchPod(ctx context.Context, t *testing.T, c *cluster, node *corev1.Node, name string) *benchRun {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: corev1.PodSpec{
			NodeName: node.Name, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: busybox(), ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", idle},
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
	if _, err := c.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "pod "+name+" Ready", 500*time.Millisecond, func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		return err == nil && podReady(p), err
	})
	// Let the node settle after the pod's start (and, with the agent, its
	// first look at the pod) before the first resize.
	time.Sleep(15 * time.Second)
	samples, stop := watcher(ctx, t, c, name)
	b := &benchRun{c: c, node: node.Name, name: name, samples: samples, stop: stop}
	select {
	case b.first = <-samples:
	case <-time.After(time.Minute):
		stop()
		t.Fatal("no sample from the watcher in the container within a minute")
	}
	return b
}

// resize sends one resize (up: 500m -> 800m CPU limit, 100m -> 200m
// request, 64Mi -> 96Mi memory limit; down: back) and returns its times in
// seconds from the patch being sent.
func (b *benchRun) resize(ctx context.Context, t *testing.T, up bool) map[string]float64 {
	t.Helper()
	reqCPU, limCPU, limMem, wantCPU, wantMem := "100m", "500m", "64Mi", "50000 100000", "67108864"
	if up {
		reqCPU, limCPU, limMem, wantCPU, wantMem = "200m", "800m", "96Mi", "80000 100000", "100663296"
	}
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":%q,"memory":"32Mi"},"limits":{"cpu":%q,"memory":%q}}}]}}`,
		reqCPU, limCPU, limMem)
	cur, err := b.c.cs.CoreV1().Pods(testNS).Get(ctx, b.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gen := cur.Generation + 1
	kubeletBefore := kubeletResizeMs(t, b.c, b.node)
	// Only samples read after the patch count.
	for drained := false; !drained; {
		select {
		case _, ok := <-b.samples:
			if !ok {
				t.Fatal("the watcher in the container ended")
			}
		default:
			drained = true
		}
	}

	var mu sync.Mutex
	var admitted, status time.Time
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for pctx.Err() == nil {
			p, err := b.c.cs.CoreV1().Pods(testNS).Get(pctx, b.name, metav1.GetOptions{})
			now := time.Now()
			if err == nil {
				mu.Lock()
				if admitted.IsZero() && admittedFor(p, gen) {
					admitted = now
				}
				if status.IsZero() && p.Generation >= gen && statusReports(p) {
					status = now
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	t0 := time.Now()
	if _, err := b.c.cs.CoreV1().Pods(testNS).Patch(ctx, b.name, types.StrategicMergePatchType, []byte(patch),
		metav1.PatchOptions{FieldManager: "resize-bench"}, "resize"); err != nil {
		t.Fatalf("patch --subresource resize: %v", err)
	}
	m := map[string]float64{"patch answered": time.Since(t0).Seconds()}
	deadline := time.After(2 * time.Minute)
	for m["cgroup"] == 0 {
		select {
		case s, ok := <-b.samples:
			if !ok {
				t.Fatal("the watcher in the container ended")
			}
			if s.start != b.first.start {
				t.Fatal("PID 1 of app changed: not resized in place")
			}
			if s.cpuMax == wantCPU && s.memMax == wantMem {
				m["cgroup"] = s.at.Sub(t0).Seconds()
			}
		case <-deadline:
			t.Fatalf("app's cgroup files not %q / %q 2 minutes after the patch", wantCPU, wantMem)
		}
	}
	poll(t, "the status to report the resize", 100*time.Millisecond, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return !status.IsZero(), nil
	})
	// The next resize starts once the kubelet has closed this one.
	poll(t, "no resize condition left", 200*time.Millisecond, func() (bool, error) {
		p, err := b.c.cs.CoreV1().Pods(testNS).Get(ctx, b.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodResizeInProgress || cond.Type == corev1.PodResizePending {
				return false, fmt.Errorf("%s %s: %s", cond.Type, cond.Reason, cond.Message)
			}
		}
		return true, nil
	})
	pcancel()
	wg.Wait()
	m["status"] = status.Sub(t0).Seconds()
	if !admitted.IsZero() {
		m["admitted"] = admitted.Sub(t0).Seconds()
	}
	if after := kubeletResizeMs(t, b.c, b.node); after.count == kubeletBefore.count+1 {
		m["kubelet"] = (after.sum - kubeletBefore.sum) / 1000
	}
	return m
}

// agentResizes is what the agent measured for the pod's resizes.
func agentResizes(t *testing.T, c *cluster, pod string) []api.KubeResize {
	t.Helper()
	var list []api.KubeResize
	poll(t, "the agent's record of "+pod+"'s resizes", 2*time.Second, func() (bool, error) {
		raw, err := c.try("-n", agentNS, "exec", "ds/"+agentDS, "--", "resizectl", "kube-resizes", "--pod", testNS+"/"+pod, "-o", "json")
		if err != nil {
			return false, err
		}
		list = nil
		if err := json.Unmarshal([]byte(raw), &list); err != nil {
			return false, fmt.Errorf("%w: %s", err, raw)
		}
		for _, r := range list {
			if r.Outcome != "completed" {
				return false, fmt.Errorf("generation %d: %s", r.Generation, r.Outcome)
			}
		}
		return len(list) > 0, fmt.Errorf("no resize recorded")
	})
	return list
}
