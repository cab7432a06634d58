package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/agent/api"
)

// docBlock is a fenced block of docs/walkthrough.md marked to run
// (<!-- walkthrough: NAME -->) or to be found in a run's output
// (<!-- walkthrough-expect: NAME -->).
type docBlock struct {
	name, kind, text string
	line             int
}

var markRE = regexp.MustCompile(`^<!-- (walkthrough|walkthrough-expect): ([a-z-]+) -->$`)

// walkthroughBlocks reads the marked blocks of docs/walkthrough.md, in the
// file's order. A mark must be followed by a fenced block.
func walkthroughBlocks(path string) ([]docBlock, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(raw), "\n")
	var out []docBlock
	for i := 0; i < len(lines); i++ {
		m := markRE.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("%s:%d: %s is not followed by a fenced block", path, i+1, m[0])
		}
		var body []string
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			body = append(body, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: the block after %s does not end", path, i+1, m[0])
		}
		out = append(out, docBlock{name: m[2], kind: m[1], text: strings.Join(body, "\n") + "\n", line: i + 1})
		i = j
	}
	return out, nil
}

// walkthroughSteps are the steps TestWalkthrough knows how to check, in
// the walkthrough's order. The doc's marked blocks must be these.
var walkthroughSteps = []string{"pod", "raise", "status", "agent", "lower", "fill", "reclaim", "metrics", "cleanup"}

// assignRE is a shell variable set by a block (NODE=$(...)); later blocks
// are run after these assignments, as in the reader's shell.
var assignRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]*=`)

// docShell runs the walkthrough's blocks as a reader would: bash with
// kubectl and the kubectl-resize plugin on PATH and the node's kubeconfig.
type docShell struct {
	t       *testing.T
	env     []string
	prelude []string
	image   string // the node's, for the doc's busybox:1.36
}

// docImageRE is the doc's image line. On the node it becomes the node's
// image, which is only in containerd's store: its tag is latest, whose
// default pull policy (Always) would ask a registry, so IfNotPresent is
// added.
var docImageRE = regexp.MustCompile(`(?m)^([ \t]*)image: busybox:1\.36$`)

func newDocShell(t *testing.T, c *cluster, pluginDir, image string) *docShell {
	bin := t.TempDir()
	kubectl, err := exec.LookPath(c.kubectl)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kubectl, filepath.Join(bin, "kubectl")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "KUBECONFIG="+c.kubeconfig,
		"PATH="+bin+string(os.PathListSeparator)+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return &docShell{t: t, env: env, image: image}
}

// run runs one block with bash -e -o pipefail; what it started in the
// background (a port-forward) is ended with it. It returns stdout, and
// stderr with the exit status when it failed.
func (s *docShell) run(b docBlock) (string, error) {
	t := s.t
	text := b.text
	if docImageRE.MatchString(text) {
		text = docImageRE.ReplaceAllString(text, "${1}image: "+s.image+"\n${1}imagePullPolicy: IfNotPresent")
		t.Logf("step %s: image %s (pull policy IfNotPresent) in place of busybox:1.36: the node reaches no registry", b.name, s.image)
	}
	script := strings.Join(append(append([]string{}, s.prelude...), text), "\n")
	for _, l := range strings.Split(b.text, "\n") {
		if assignRE.MatchString(l) {
			s.prelude = append(s.prelude, l)
		}
	}
	dir := t.TempDir()
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Env, cmd.Dir = s.env, t.TempDir()
	cmd.Stdout, cmd.Stderr = stdout, stderr // files: Wait does not wait for a background job
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	t0 := time.Now()
	runErr := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	timing(t, "walkthrough_"+b.name, time.Since(t0))
	out, _ := os.ReadFile(stdout.Name())
	errOut, _ := os.ReadFile(stderr.Name())
	t.Logf("step %s (docs/walkthrough.md:%d), %.1f s:\n$ %s\n%s%s", b.name, b.line, time.Since(t0).Seconds(),
		strings.ReplaceAll(strings.TrimSpace(b.text), "\n", "\n$ "), out, errOut)
	if runErr != nil {
		return string(out), fmt.Errorf("step %s: %w: %s", b.name, runErr, strings.TrimSpace(string(errOut)))
	}
	return string(out), nil
}

// expectLines: every line of want is a line of got, in order.
func expectLines(got, want string) error {
	have := strings.Split(got, "\n")
	i := 0
	for _, w := range strings.Split(strings.TrimSpace(want), "\n") {
		w = strings.TrimSpace(w)
		for i < len(have) && strings.TrimSpace(have[i]) != w {
			i++
		}
		if i == len(have) {
			return fmt.Errorf("line %q not printed (in order)", w)
		}
		i++
	}
	return nil
}

// TestWalkthrough runs part 2 of docs/walkthrough.md on the node: its
// marked blocks, as they stand, in order, and checks what each printed
// and what the cluster and the agent then hold: the pod's cgroup files
// before and after, the plugin's Completed with the agent's Event, the
// conditions, status resources and restart count, the agent's phases and
// prediction, the page cache above the new limit, the agent's reclaim
// that let the kubelet lower memory in place, and the metrics. With
// NODE_PROMETHEUS set, Prometheus scrapes the agent throughout and the
// dashboard's panels are drawn from it (prometheus_test.go).
func TestWalkthrough(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	root := repoRoot(t)
	blocks, err := walkthroughBlocks(filepath.Join(root, "docs", "walkthrough.md"))
	if err != nil {
		t.Fatal(err)
	}
	run := map[string]docBlock{}
	expect := map[string]string{}
	var order []string
	for _, b := range blocks {
		if b.kind == "walkthrough" {
			run[b.name] = b
			order = append(order, b.name)
		} else {
			expect[b.name] = b.text
		}
	}
	if strings.Join(order, ",") != strings.Join(walkthroughSteps, ",") {
		t.Fatalf("docs/walkthrough.md marks the steps %v; this test checks %v: change both together", order, walkthroughSteps)
	}
	for name := range expect {
		if _, ok := run[name]; !ok {
			t.Fatalf("docs/walkthrough.md: walkthrough-expect %s has no step", name)
		}
	}

	node, agentPod := withAgent(t, c)
	// The walkthrough's nodeSelector is deploy/kind/cluster.yaml's worker label.
	c.k(t, "label", "node", node.Name, "resize-agent.resizer.io/e2e=true", "--overwrite")
	poll(t, "the default service account of default", 500*time.Millisecond, func() (bool, error) {
		_, err := c.cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	image := os.Getenv("RESIZE_AGENT_NODE_BUSYBOX")
	if image == "" {
		image = "localhost/resize-agent/busybox:latest"
	}
	sh := newDocShell(t, c, buildPlugin(t), image)
	t.Cleanup(func() { c.try("delete", "pod", "web", "--wait=false", "--ignore-not-found") })

	var prom *promRun
	if dir := os.Getenv("NODE_PROMETHEUS"); dir != "" {
		prom = startPrometheus(t, c, agentPod, node.Name, dir)
	}
	mark := func(label string) {
		if prom != nil {
			prom.mark(label)
		}
	}

	step := func(name string) string {
		t.Helper()
		out, err := sh.run(run[name])
		if err != nil {
			t.Errorf("%v", err)
		}
		if want, ok := expect[name]; ok {
			if err := expectLines(out, want); err != nil {
				t.Errorf("step %s: %v; the doc's walkthrough-expect block says:\n%s", name, err, want)
			}
		}
		return out
	}
	web := func() *corev1.Pod {
		t.Helper()
		p, err := c.cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod web: %v", err)
		}
		return p
	}

	// The pod, Burstable, its files as the doc says.
	step("pod")
	p := web()
	if p.Status.QOSClass != corev1.PodQOSBurstable || p.Spec.NodeName != node.Name {
		t.Errorf("pod web: QoS %s on %q, want Burstable on %s", p.Status.QOSClass, p.Spec.NodeName, node.Name)
	}
	podUID := string(p.UID)
	if prom != nil {
		prom.podUID = podUID
	}
	gen1 := p.Generation

	// Raise CPU and memory: Completed, and the agent's Event.
	mark("raise")
	out := step("raise")
	first := strings.SplitN(out, "\n", 2)[0]
	if !strings.HasPrefix(first, "pod default/web container web on node "+node.Name+": Completed") {
		t.Errorf("kubectl resize printed %q, want Completed on %s first", first, node.Name)
	}
	if !strings.Contains(out, "agent:  ResizeMeasured") {
		t.Errorf("kubectl resize printed no ResizeMeasured Event of the agent within --agent-wait:\n%s", out)
	}

	// What Kubernetes shows.
	out = step("status")
	p = web()
	lines := strings.Split(out, "\n")
	if len(lines) < 3 {
		t.Fatalf("status step printed %d lines", len(lines))
	}
	var conds []corev1.PodCondition
	if err := json.Unmarshal([]byte(lines[0]), &conds); err != nil {
		t.Errorf("conditions %q: %v", lines[0], err)
	}
	for _, cond := range conds {
		if cond.Type == corev1.PodResizePending || cond.Type == corev1.PodResizeInProgress {
			t.Errorf("condition %s %s after Completed: %s", cond.Type, cond.Reason, cond.Message)
		}
	}
	var res corev1.ResourceRequirements
	if err := json.Unmarshal([]byte(lines[1]), &res); err != nil {
		t.Errorf("resources %q: %v", lines[1], err)
	}
	raised := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("300m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	if !sameResources(res, raised) {
		t.Errorf("status resources %v, want %v", res, raised)
	}
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 1 || strings.TrimSpace(lines[2]) != "1" {
		t.Errorf("restart count printed %q, pod status %+v: want 1 (RestartContainer for memory)", lines[2], cs)
	}

	// What the agent adds.
	out = step("agent")
	for _, w := range []string{"ResizeMeasured", "kubelet verdict on a resize"} {
		if !strings.Contains(out, w) {
			t.Errorf("agent step printed no %q", w)
		}
	}
	kr := kubeResizes(t, c, node.Name)
	var raiseMeasured *api.KubeResize
	for i := range kr {
		if kr[i].PodUID == podUID && kr[i].Generation == gen1+1 {
			raiseMeasured = &kr[i]
		}
	}
	if raiseMeasured == nil {
		t.Errorf("resizectl kube-resizes: no resize of web generation %d", gen1+1)
	} else {
		logMeasured(t, "raise", raiseMeasured)
		if raiseMeasured.Outcome != "completed" {
			t.Errorf("the raise: outcome %s, want completed", raiseMeasured.Outcome)
		}
		var ph []string
		for _, x := range raiseMeasured.Phases {
			ph = append(ph, x.Phase)
		}
		if strings.Join(ph, ",") != "accepted,admitted,cgroup,status" {
			t.Errorf("the raise's phases %v, want accepted, admitted, cgroup, status", ph)
		}
		if len(raiseMeasured.Pressure) == 0 || raiseMeasured.Pressure[0].Before == nil || raiseMeasured.Pressure[0].After == nil {
			t.Errorf("the raise: no pressure before and after: %+v", raiseMeasured.Pressure)
		}
	}

	// Lower memory: RestartContainer, so a restart.
	mark("lower")
	out = step("lower")
	if first := strings.SplitN(out, "\n", 2)[0]; !strings.HasPrefix(first, "pod default/web container web on node "+node.Name+": Completed") {
		t.Errorf("kubectl resize (lower) printed %q, want Completed", first)
	}
	logEvents(t, c, "web")

	// Lower memory in place: page cache above the new limit, reclaimed by
	// the agent, lowered in place by the kubelet.
	out = step("fill")
	if cur, err := strconv.ParseInt(strings.TrimSpace(lastLine(out)), 10, 64); err != nil || cur <= 96<<20 {
		t.Errorf("memory.current after the fill %q (%v): want above 96Mi, the new limit", lastLine(out), err)
	} else {
		t.Logf("memory.current after the fill: %.1f MiB", float64(cur)/(1<<20))
	}
	t.Cleanup(func() { c.try("delete", "pod", "web-inplace", "--wait=false", "--ignore-not-found") })
	inplace := func() *corev1.Pod {
		t.Helper()
		p, err := c.cs.CoreV1().Pods("default").Get(ctx, "web-inplace", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod web-inplace: %v", err)
		}
		return p
	}
	before := inplace()
	mark("reclaim")
	t0 := time.Now()
	out = step("reclaim")
	timing(t, "walkthrough_reclaim_patch_to_status", time.Since(t0))
	if !strings.Contains(out, "MemoryReclaimed") {
		t.Errorf("reclaim step printed no MemoryReclaimed Event")
	}
	p = inplace()
	if a, b := p.Status.ContainerStatuses[0], before.Status.ContainerStatuses[0]; a.ContainerID != b.ContainerID || a.RestartCount != b.RestartCount {
		t.Errorf("memory lowered with a restart: container %s -> %s, restarts %d -> %d", b.ContainerID, a.ContainerID, b.RestartCount, a.RestartCount)
	}
	// The kubelet may report the new limit a status sync before it clears
	// the PodResizeInProgress (Error) of its first try (the status manager
	// writes what it has at each sync; TestReclaim waits for both too).
	cleared := time.Now()
	for cond := resizeCondition(p); cond != nil; cond = resizeCondition(p) {
		if time.Since(cleared) > 30*time.Second {
			t.Errorf("30 s after the decrease: %s %s %s", cond.Type, cond.Reason, cond.Message)
			break
		}
		time.Sleep(time.Second)
		p = inplace()
	}
	timing(t, "walkthrough_reclaim_status_to_condition_cleared", time.Since(cleared))
	logEvents(t, c, "web-inplace")

	// The metrics.
	out = step("metrics")
	for _, re := range []string{
		`(?m)^resize_agent_kube_resize_duration_seconds_count\{outcome="completed",phase="status"\} [1-9]`,
		`(?m)^resize_agent_kubelet_verdict_predictions_total\{actual="\w+",predicted="\w+"\} [1-9]`,
		`(?m)^resize_agent_kubelet_decrease_reclaims_total\{outcome="reclaimed"\} [1-9]`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("metrics step: no line matching %s", re)
		}
	}

	if prom != nil {
		prom.extraResizes(t, c)
	}
	step("cleanup")
	if prom != nil {
		prom.draw(t)
	}
}

// TestWalkthroughDoc (no cluster needed): the walkthrough's marked blocks
// are the steps TestWalkthrough runs and checks, and each expect block
// belongs to one.
func TestWalkthroughDoc(t *testing.T) {
	blocks, err := walkthroughBlocks(filepath.Join(repoRoot(t), "docs", "walkthrough.md"))
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	steps := map[string]bool{}
	for _, b := range blocks {
		if b.kind == "walkthrough" {
			order = append(order, b.name)
			steps[b.name] = true
		}
	}
	if strings.Join(order, ",") != strings.Join(walkthroughSteps, ",") {
		t.Errorf("docs/walkthrough.md marks the steps %v; TestWalkthrough checks %v", order, walkthroughSteps)
	}
	for _, b := range blocks {
		if b.kind == "walkthrough-expect" && !steps[b.name] {
			t.Errorf("docs/walkthrough.md:%d: walkthrough-expect %s has no step", b.line, b.name)
		}
	}
}

// logEvents logs the kubelet's resize Events and the agent's on pod.
func logEvents(t *testing.T, c *cluster, pod string) {
	t.Helper()
	evs, err := c.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Logf("events of %s: %v", pod, err)
		return
	}
	for _, e := range evs.Items {
		if e.Source.Component == "resize-agent" || strings.HasPrefix(e.Reason, "Resize") || e.Reason == "Killing" {
			t.Logf("%s: event %s %s (%d) from %s: %s", pod, e.Type, e.Reason, e.Count, e.Source.Component, e.Message)
		}
	}
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

// kubeResizes is the agent's resizectl kube-resizes -o json on node.
func kubeResizes(t *testing.T, c *cluster, node string) []api.KubeResize {
	t.Helper()
	pods, err := c.cs.CoreV1().Pods(agentNS).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=resize-agent", FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil || len(pods.Items) == 0 {
		t.Errorf("the agent's pod on %s: %v", node, err)
		return nil
	}
	raw, err := c.try("-n", agentNS, "exec", pods.Items[0].Name, "--", "resizectl", "kube-resizes", "--pod", "default/web", "-o", "json")
	if err != nil {
		t.Errorf("resizectl kube-resizes: %v", err)
		return nil
	}
	var list []api.KubeResize
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		t.Errorf("resizectl kube-resizes -o json: %v: %s", err, raw)
	}
	return list
}

// logMeasured logs a measured resize's phases and pressure, and records the
// phases as timings.
func logMeasured(t *testing.T, what string, r *api.KubeResize) {
	t.Helper()
	t.Logf("%s, as the agent measured it: generation %d, outcome %s, admitted by %s; %s", what, r.Generation, r.Outcome, r.AdmittedBy, r.Summary)
	for _, p := range r.Phases {
		timing(t, "walkthrough_"+what+"_agent_"+p.Phase, time.Duration(p.Seconds*float64(time.Second)))
	}
	for _, p := range r.Pressure {
		w := func(x *api.PressureWindow) string {
			if x == nil {
				return "-"
			}
			return fmt.Sprintf("%.0fs throttled %.3f s/s runq p99 %s cpu psi %s mem psi %s", x.Seconds, x.ThrottledSeconds/x.Seconds, f(x.RunqP99Seconds), f(x.CPUPressure), f(x.MemoryPressure))
		}
		t.Logf("%s: %s before: %s; after: %s", what, p.Container, w(p.Before), w(p.After))
	}
}
