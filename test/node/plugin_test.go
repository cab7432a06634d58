package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

const pluginNS = "kubectl-resize-e2e"

// pluginResult is the part of kubectl-resize -o json the tests read.
type pluginResult struct {
	Verdict        string
	Reason         string
	Message        string
	Generation     int64
	Spec           corev1.ResourceRequirements
	Status         *corev1.ResourceRequirements
	RestartCount   int32
	ElapsedSeconds float64
	ExitCode       int
	Agent          *struct {
		Seen   bool
		Events []struct{ Reason, Message, Node string }
		Note   string
	}
}

// buildPlugin builds cmd/kubectl-resize into a directory of its own (the
// module cache is warm: the network namespace has no route to the proxy)
// and returns that directory, to put on PATH.
func buildPlugin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-resize"), "./cmd/kubectl-resize")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kubectl-resize: %v\n%s", err, out)
	}
	return dir
}

// kubectlResize runs `kubectl resize ...`: kubectl finds the plugin on
// PATH, as it would for a user who installed it.
func kubectlResize(t *testing.T, c *cluster, pluginDir string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"resize"}, append(args, "--kubeconfig", c.kubeconfig, "-n", pluginNS)...)...)
	cmd.Env = append(os.Environ(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("kubectl resize %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("kubectl resize %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

func decodeResult(t *testing.T, out string) pluginResult {
	t.Helper()
	var r pluginResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("kubectl resize -o json: %v: %q", err, out)
	}
	return r
}

// checkAgentPart: the agent's measurement is printed when it came, and
// otherwise the plugin says it was not seen.
func checkAgentPart(t *testing.T, r pluginResult) {
	t.Helper()
	switch {
	case r.Agent == nil:
		t.Errorf("no agent part in the result after a %s verdict", r.Verdict)
	case r.Agent.Seen:
		if len(r.Agent.Events) == 0 {
			t.Errorf("agent seen, without events: %+v", r.Agent)
		}
		for _, e := range r.Agent.Events {
			t.Logf("the agent's measurement: %s on %s: %s", e.Reason, e.Node, e.Message)
			if e.Message == "" {
				t.Errorf("agent event %s without a message", e.Reason)
			}
		}
	case !strings.Contains(r.Agent.Note, "measurement was not seen within"):
		t.Errorf("agent not seen, note %q", r.Agent.Note)
	default:
		t.Logf("the agent's measurement: %s", r.Agent.Note)
	}
}

// TestKubectlResize: the plugin on the real node, with the agent deployed:
// a running container's CPU and memory raised in place (Completed, with
// the kubelet's status), more CPU than the node has (refused by the API
// server's PodResizeValidator before the kubelet sees it: in 1.37 the
// kubelet cannot be asked), and more CPU than is free (the kubelet's
// Deferred).
func TestKubectlResize(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	pluginDir := buildPlugin(t)
	node, _ := withAgent(t, c)
	useNamespace(t, c, pluginNS)
	image := os.Getenv("RESIZE_AGENT_NODE_BUSYBOX")
	if image == "" {
		image = "localhost/resize-agent/busybox:latest"
	}
	const name = "plugin-web"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pluginNS},
		Spec: corev1.PodSpec{
			NodeName:                      node.Name,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", idle},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
			}},
		},
	}
	if _, err := c.cs.CoreV1().Pods(pluginNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var before *corev1.Pod
	poll(t, "the test pod Ready", 500*time.Millisecond, func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(pluginNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || !podReady(p) {
			return false, err
		}
		before = p
		return true, nil
	})

	t.Run("RaiseCompleted", func(t *testing.T) {
		t0 := time.Now()
		code, out, _ := kubectlResize(t, c, pluginDir, name, "--cpu-request", "200m", "--cpu-limit", "800m", "--memory-limit", "96Mi", "-o", "json")
		timing(t, "kubectl_resize_completed", time.Since(t0))
		r := decodeResult(t, out)
		if code != 0 || r.Verdict != "Completed" || r.ExitCode != 0 {
			t.Fatalf("exit %d, verdict %s (%s): want 0, Completed", code, r.Verdict, r.Message)
		}
		want := corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("800m"), corev1.ResourceMemory: resource.MustParse("96Mi")},
		}
		if r.Status == nil || !sameResources(*r.Status, want) || !sameResources(r.Spec, want) {
			t.Errorf("printed status %v, spec %v; want both %v", r.Status, r.Spec, want)
		}
		// What it printed is what the API server holds, in place.
		p, err := c.cs.CoreV1().Pods(pluginNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, b := p.Status.ContainerStatuses[0], before.Status.ContainerStatuses[0]
		if a.Resources == nil || !sameResources(*a.Resources, want) || a.ContainerID != b.ContainerID || a.RestartCount != 0 || r.RestartCount != 0 {
			t.Errorf("status %v, container %s -> %s, restarts %d", a.Resources, b.ContainerID, a.ContainerID, a.RestartCount)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodResizePending || cond.Type == corev1.PodResizeInProgress {
				t.Errorf("condition %s still set after Completed: %s %s", cond.Type, cond.Reason, cond.Message)
			}
		}
		checkAgentPart(t, r)
	})

	t.Run("MoreCPUThanTheNodeHas", func(t *testing.T) {
		alloc := node.Status.Allocatable.Cpu()
		over := resource.NewMilliQuantity(alloc.MilliValue()*4, resource.DecimalSI).String()
		code, out, stderr := kubectlResize(t, c, pluginDir, name, "--cpu-request", over, "--cpu-limit", over, "--agent-wait", "0")
		if kubeletMinor(t, node) < 36 {
			// No PodResizeValidator before 1.36: the API server takes the
			// patch and the kubelet's verdict is Infeasible (exit 3).
			want := fmt.Sprintf("Node didn't have enough capacity: cpu, requested: %d", alloc.MilliValue()*4)
			if code != 3 || !strings.Contains(out, ": Infeasible") || !strings.Contains(out, want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 3, Infeasible, %q", code, out, stderr, want)
			}
			return
		}
		want := fmt.Sprintf("node didn't have enough allocatable resources: cpu, requested: %d, allocatable: %d", alloc.MilliValue()*4, alloc.MilliValue())
		if code != 1 || !strings.Contains(out, ": Refused") || !strings.Contains(stderr, want) {
			t.Errorf("exit %d, stdout %q, stderr %q; want 1, Refused, %q", code, out, stderr, want)
		}
	})

	t.Run("MoreCPUThanIsFreeDeferred", func(t *testing.T) {
		// All the node's allocatable CPU: the API server lets it through
		// (this pod alone fits), the kubelet cannot admit it beside the
		// other pods' requests (the agent's at least).
		pods, err := c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
		if err != nil {
			t.Fatal(err)
		}
		var others int64
		for i := range pods.Items {
			if p := &pods.Items[i]; p.Name != name && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
				others += req.Cpu().MilliValue()
			}
		}
		alloc := node.Status.Allocatable.Cpu()
		if others == 0 {
			t.Fatalf("no other pod on %s requests CPU (the agent requests 20m): cannot make a Deferred resize", node.Name)
		}
		all := alloc.String()
		code, out, _ := kubectlResize(t, c, pluginDir, name, "--cpu-request", all, "--cpu-limit", all, "-o", "json")
		r := decodeResult(t, out)
		if code != 0 || r.Verdict != "Deferred" || r.Reason != "Deferred" || !strings.Contains(r.Message, "cpu") {
			t.Errorf("exit %d, verdict %s reason %s message %q; want 0, Deferred with the kubelet's message (others request %dm of %dm)",
				code, r.Verdict, r.Reason, r.Message, others, alloc.MilliValue())
		}
		if r.Status == nil || r.Status.Limits.Cpu().String() != "800m" {
			t.Errorf("status %v: a deferred resize left the running values (800m)", r.Status)
		}
		checkAgentPart(t, r)
	})
}
