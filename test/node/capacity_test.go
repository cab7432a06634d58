package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// TestCapacity: the agent's prediction of the kubelet's verdict equals the
// verdict the kubelet gives, for resizes made with kubectl patch
// --subresource resize: the example scaled to this node, a pod
// with an init container and a native sidecar, a pod with overhead. Then
// drift against the kubelet's allocation: a direct write to a container's
// cpu.max is reported, a kubelet resize is not drift (restored under
// --kube-drift=restore: TestWriteBack).
func TestCapacity(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node, _ := withAgent(t, c)
	useTestNamespace(t, c)
	cs := &capSuite{c: c, node: node.Name}
	t.Run("Example", func(t *testing.T) { cs.example(ctx, t) })
	t.Run("SidecarAndInit", func(t *testing.T) { cs.sidecar(ctx, t) })
	t.Run("Overhead", func(t *testing.T) { cs.overhead(ctx, t) })
	t.Run("Metric", func(t *testing.T) { cs.metric(t) })
	t.Run("Drift", func(t *testing.T) { cs.drift(ctx, t) })
}

type capSuite struct {
	c      *cluster
	node   string
	agreed int // resizes whose prediction the test saw equal the kubelet's verdict
}

func busybox() string {
	if img := os.Getenv("RESIZE_AGENT_NODE_BUSYBOX"); img != "" {
		return img
	}
	return "localhost/resize-agent/busybox:latest"
}

func ctr(name, cpu, mem string) corev1.Container {
	return corev1.Container{
		Name: name, Image: busybox(), ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"sh", "-c", idle},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)},
		},
		ResizePolicy: []corev1.ContainerResizePolicy{
			{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
			{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.NotRequired},
		},
	}
}

// run creates p on the node and waits until it is Ready.
func (s *capSuite) run(ctx context.Context, t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	s.create(ctx, t, p)
	return s.ready(ctx, t, p.Name)
}

// create creates p on the node, without waiting: pods created together
// start side by side.
func (s *capSuite) create(ctx context.Context, t *testing.T, p *corev1.Pod) {
	t.Helper()
	p.Namespace, p.Spec.NodeName = testNS, s.node
	p.Spec.TerminationGracePeriodSeconds = new(int64)
	if _, err := s.c.cs.CoreV1().Pods(testNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ready waits until the pod is Ready and returns it.
func (s *capSuite) ready(ctx context.Context, t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var out *corev1.Pod
	poll(t, "pod "+name+" Ready", 500*time.Millisecond, func() (bool, error) {
		q, err := s.c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if q.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %s %s", name, q.Status.Reason, q.Status.Message)
		}
		out = q
		return podReady(q), fmt.Errorf("phase %s, %s", q.Status.Phase, waitingReasons(q))
	})
	return out
}

// free is allocatable CPU less what the node's active pods hold, counted
// as the kubelet counts them (allocated and actuated, overhead, init
// containers), in millicores.
func (s *capSuite) free(ctx context.Context, t *testing.T) int64 {
	t.Helper()
	n, err := s.c.cs.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := s.c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + s.node})
	if err != nil {
		t.Fatal(err)
	}
	used := int64(0)
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{UseStatusResources: true})
		used += req.Cpu().MilliValue()
	}
	return n.Status.Allocatable.Cpu().MilliValue() - used
}

// strayWriter makes the pod's first container privileged, with the
// host's cgroupfs at /host/cgroup (a privileged container shares the
// host's cgroup namespace), so that the test's own container plays the
// stray echo on the node: no writer pod of its own to start, 20-30 s of
// the node's one vCPU each.
func strayWriter(p *corev1.Pod) *corev1.Pod {
	c := &p.Spec.Containers[0]
	c.SecurityContext = &corev1.SecurityContext{Privileged: new(true)}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "host-cgroup", MountPath: "/host/cgroup"})
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host-cgroup",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/cgroup"}}})
	return p
}

// containerDir is a shell line, for a strayWriter's container, that sets d
// to the cgroup directory of the container (its status's containerID).
func containerDir(containerID string) string {
	cid := strings.TrimPrefix(containerID, "containerd://")
	return "d=$(find /host/cgroup/kubepods* -type d -name '*" + cid + "*' | head -1); test -n \"$d\""
}

// podDir is the same for a pod cgroup: pod<uid> (cgroupfs) or
// kubepods-<qos>-pod<uid with _>.slice (systemd).
func podDir(uid string) string {
	return "d=$(find /host/cgroup/kubepods* -type d \\( -name 'pod" + uid + "' -o -name '*-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice' \\) | head -1); test -n \"$d\""
}

// fill creates a pod that leaves want millicores of allocatable free, and
// returns a func that deletes it and waits until the kubelet has let go.
func (s *capSuite) fill(ctx context.Context, t *testing.T, want int64) func() {
	t.Helper()
	f := s.free(ctx, t) - want
	if f < 10 {
		t.Fatalf("only %dm free: no room for a filler leaving %dm", f+want, want)
	}
	// Its memory limit is the pod cgroup's: at 8Mi, the sandbox's runc
	// init was OOM-killed in it ("cannot start a stopped process") and the
	// kubelet's retry cost about 20 s per filler.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "filler"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{ctr("fill", fmt.Sprintf("%dm", f), "32Mi")}}}
	s.run(ctx, t, p)
	if got := s.free(ctx, t); got != want {
		t.Fatalf("free %dm after the filler of %dm, want %dm", got, f, want)
	}
	t.Logf("filler of %dm leaves %dm free", f, want)
	return func() { s.remove(t, "filler") }
}

// remove deletes pod name and waits until it is gone.
func (s *capSuite) remove(t *testing.T, name string) {
	if _, err := s.c.try("-n", testNS, "delete", "pod", name, "--grace-period=0", "--wait=true"); err != nil {
		t.Errorf("deleting %s: %v", name, err)
	}
}

// verdict is what the kubelet said of the resize of generation gen.
func (s *capSuite) verdict(ctx context.Context, t *testing.T, name string, gen int64) string {
	t.Helper()
	var v string
	poll(t, "the kubelet's verdict on "+name, 200*time.Millisecond, func() (bool, error) {
		p, err := s.c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.ObservedGeneration != 0 && c.ObservedGeneration < gen {
				continue
			}
			if c.Type == corev1.PodResizePending {
				v = string(c.Reason)
				return true, nil
			}
			if c.Type == corev1.PodResizeInProgress {
				v = "Fit"
				return true, nil
			}
		}
		if p.Status.ObservedGeneration >= gen && !hasResizeCondition(p) && allocatedIsSpec(p) {
			v = "Fit"
			return true, nil
		}
		return false, fmt.Errorf("conditions %v", p.Status.Conditions)
	})
	return v
}

func hasResizeCondition(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
			return true
		}
	}
	return false
}

func allocatedIsSpec(p *corev1.Pod) bool {
	sts := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, st := range sts {
			if st.Name == c.Name && st.State.Running != nil && !st.AllocatedResources.Cpu().Equal(*c.Resources.Requests.Cpu()) {
				return false
			}
		}
	}
	return true
}

// agentLine is one JSON log line of the agent.
type agentLine struct {
	Msg        string `json:"msg"`
	Pod        string `json:"pod"`
	Generation int64  `json:"generation"`
	Predicted  string `json:"predicted"`
	Actual     string `json:"actual"`
	Prediction string `json:"prediction"`
	Container  string `json:"container"`
	Action     string `json:"action"`
	Message    string `json:"message"`
}

func (s *capSuite) agentLog(t *testing.T, msg string) []agentLine {
	t.Helper()
	out := s.c.k(t, "-n", agentNS, "logs", "ds/"+agentDS, "--tail=-1")
	var lines []agentLine
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l agentLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == msg {
			lines = append(lines, l)
		}
	}
	return lines
}

// resize patches pod name through pods/resize and checks that the agent's
// prediction, logged when the spec changed and counted when the kubelet
// decided, is the kubelet's verdict, want.
func (s *capSuite) resize(ctx context.Context, t *testing.T, name, patch, want string) {
	t.Helper()
	s.c.k(t, "-n", testNS, "patch", "pod", name, "--subresource", "resize", "--patch", patch)
	p, err := s.c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := s.verdict(ctx, t, name, p.Generation)
	if got != want {
		t.Errorf("%s generation %d: the kubelet said %s, the test expected %s", name, p.Generation, got, want)
	}
	var line agentLine
	poll(t, "the agent's verdict line for "+name, time.Second, func() (bool, error) {
		for _, l := range s.agentLog(t, "kubelet verdict on a resize") {
			if l.Pod == testNS+"/"+name && l.Generation == p.Generation {
				line = l
				return true, nil
			}
		}
		return false, fmt.Errorf("no line for %s/%s generation %d", testNS, name, p.Generation)
	})
	t.Logf("%s generation %d: predicted %s (%s), kubelet %s", name, p.Generation, line.Predicted, line.Prediction, got)
	if line.Predicted != got || line.Actual != got {
		t.Errorf("%s: the agent predicted %s and read %s; the kubelet said %s", name, line.Predicted, line.Actual, got)
	} else {
		s.agreed++
	}
}

func cpuPatch(ctr, cpu string) string {
	return fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"resources":{"requests":{"cpu":%q}}}]}}`, ctr, cpu)
}

// The example on this node: other pods fill allocatable but for
// 150m; a container of 100m raised past what is free is Deferred, within
// it is accepted, past allocatable the API server refuses it
// (PodResizeValidator, 1.36+).
func (s *capSuite) example(ctx context.Context, t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "example"}, Spec: corev1.PodSpec{Containers: []corev1.Container{ctr("app", "100m", "16Mi")}}}
	s.run(ctx, t, p)
	defer s.remove(t, p.Name)
	defer s.fill(ctx, t, 150)()
	s.resize(ctx, t, "example", cpuPatch("app", "300m"), "Deferred") // needs 300m, 250m free for it
	s.resize(ctx, t, "example", cpuPatch("app", "250m"), "Fit")      // exactly what is free
	n, _ := s.c.cs.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
	over := fmt.Sprintf("%dm", n.Status.Allocatable.Cpu().MilliValue()+100)
	if minor := kubeletMinor(t, n); minor < 36 {
		// Before PodResizeValidator the API server takes it and the
		// kubelet marks it Infeasible (allocation_manager.go, 1.33-1.35).
		s.resize(ctx, t, "example", cpuPatch("app", over), "Infeasible")
		return
	}
	_, err := s.c.try("-n", testNS, "patch", "pod", "example", "--subresource", "resize", "--patch", cpuPatch("app", over))
	if err == nil || !strings.Contains(err.Error(), "allocatable") {
		t.Errorf("a resize to %s past allocatable: %v, want the API server's refusal", over, err)
	}
	// The spec does not change, so the kubelet gives no verdict and the
	// observer counts nothing; test/k8s holds the agent's Refused
	// prediction against the same API server's refusal.
}

// An init container larger than the app and a native sidecar: the pod
// counts max(init, sidecar + app), so raising app within the init
// container's share needs nothing free, and past it only the difference.
func (s *capSuite) sidecar(ctx context.Context, t *testing.T) {
	init := ctr("init", "400m", "16Mi")
	init.Command = []string{"true"}
	init.ResizePolicy = nil
	side := ctr("side", "50m", "16Mi")
	side.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sidecar"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{init, side},
		Containers:     []corev1.Container{ctr("app", "50m", "16Mi")},
	}}
	// The pod holds max(400m, 50m + 50m) = 400m.
	s.run(ctx, t, p)
	defer s.remove(t, p.Name)
	defer s.fill(ctx, t, 100)()
	s.resize(ctx, t, "sidecar", cpuPatch("app", "350m"), "Fit")      // max(400, 50+350) = 400: nothing more
	s.resize(ctx, t, "sidecar", cpuPatch("app", "500m"), "Deferred") // 550: 150m more, 100m free
	// The sidecar resized with the app: 100m + 300m = 400m, within the
	// init container's share again (a plain sum would ask 800m).
	s.resize(ctx, t, "sidecar", `{"spec":{"initContainers":[{"name":"side","resources":{"requests":{"cpu":"100m"}}}],"containers":[{"name":"app","resources":{"requests":{"cpu":"300m"}}}]}}`, "Fit")
}

// A pod with overhead (a RuntimeClass on containerd's runc handler): the
// overhead counts on top of the containers.
func (s *capSuite) overhead(ctx context.Context, t *testing.T) {
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "runc-overhead"}, Handler: "runc",
		Overhead: &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}}
	if _, err := s.c.cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.c.cs.NodeV1().RuntimeClasses().Delete(context.Background(), rc.Name, metav1.DeleteOptions{}) })
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "overhead"}, Spec: corev1.PodSpec{
		RuntimeClassName: &rc.Name, Containers: []corev1.Container{ctr("app", "100m", "16Mi")}}}
	p = s.run(ctx, t, p)
	defer s.remove(t, p.Name)
	if p.Spec.Overhead.Cpu().MilliValue() != 100 {
		t.Fatalf("spec.overhead %v: the RuntimeClass admission did not set it", p.Spec.Overhead)
	}
	defer s.fill(ctx, t, 150)()
	s.resize(ctx, t, "overhead", cpuPatch("app", "260m"), "Deferred") // 360m with overhead, 350m free for it
	s.resize(ctx, t, "overhead", cpuPatch("app", "250m"), "Fit")      // 350m exactly
}

var predRE = regexp.MustCompile(`(?m)^resize_agent_kubelet_verdict_predictions_total\{actual="(\w+)",predicted="(\w+)"\} (\d+)`)

// The metric counts the agreements the test saw, and no disagreement.
func (s *capSuite) metric(t *testing.T) {
	body := s.scrape(t)
	agree, disagree := 0, 0
	for _, m := range predRE.FindAllStringSubmatch(body, -1) {
		var n int
		fmt.Sscan(m[3], &n)
		if m[1] == m[2] {
			agree += n
		} else {
			disagree += n
		}
	}
	t.Logf("resize_agent_kubelet_verdict_predictions_total: %d agree, %d disagree (the test saw %d agree)", agree, disagree, s.agreed)
	timingCount(t, "prediction_agreements", agree)
	timingCount(t, "prediction_disagreements", disagree)
	if disagree != 0 || agree < s.agreed || s.agreed == 0 {
		t.Errorf("predictions: %d agree, %d disagree; the test saw %d agreements", agree, disagree, s.agreed)
	}
}

func timingCount(t *testing.T, name string, n int) {
	if f := os.Getenv("RESIZE_AGENT_NODE_TIMINGS"); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintf(fh, "%s %d\n", name, n)
			fh.Close()
		}
	}
}

func (s *capSuite) scrape(t *testing.T) string {
	t.Helper()
	pods, err := s.c.cs.CoreV1().Pods(agentNS).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=resize-agent", FieldSelector: "spec.nodeName=" + s.node})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("agent pod: %v", err)
	}
	return scrapeMetrics(t, s.c, &pods.Items[0])
}

// drift: a write to a container's cpu.max behind the kubelet's back is
// reported with the agent's Event; a kubelet resize is not drift. Under
// --kube-drift=restore: TestWriteBack.
func (s *capSuite) drift(ctx context.Context, t *testing.T) {
	app := ctr("app", "100m", "32Mi")
	app.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("500m")
	p := strayWriter(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "drift"}, Spec: corev1.PodSpec{Containers: []corev1.Container{app}}})
	p = s.run(ctx, t, p)
	dir := containerDir(p.Status.ContainerStatuses[0].ContainerID)
	write := func(v string) time.Time {
		t.Helper()
		s.c.k(t, "-n", testNS, "exec", "drift", "--", "sh", "-c", dir+" && echo '"+v+"' > \"$d/cpu.max\"")
		return time.Now()
	}
	read := func() string {
		out, err := s.c.try("-n", testNS, "exec", "drift", "--", "sh", "-c", dir+" && cat \"$d/cpu.max\"")
		if err != nil {
			t.Logf("reading cpu.max: %v", err)
		}
		return strings.TrimSpace(out)
	}
	if got := read(); got != "50000 100000" {
		t.Fatalf("cpu.max %q before, want the kubelet's 50000 100000", got)
	}
	events := func() []corev1.Event {
		l, err := s.c.cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=drift,reason=CgroupDrift"})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}

	// Report (the default).
	t0 := write("20000 100000")
	poll(t, "a CgroupDrift Event on the pod", 250*time.Millisecond, func() (bool, error) {
		return len(events()) > 0, nil
	})
	timing(t, "drift_write_to_event", time.Since(t0))
	ev := events()[0]
	t.Logf("Event: %s %s: %s (from %s)", ev.Type, ev.Reason, ev.Message, ev.Source.Component)
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != "resize-agent" || !strings.Contains(ev.Message, "cpu.max 20000 100000 (the kubelet's 50000 100000)") {
		t.Errorf("event %+v", ev)
	}
	if got := read(); got != "20000 100000" {
		t.Errorf("cpu.max %q under report: the agent wrote it", got)
	}
	write("50000 100000") // put back by hand

	// A kubelet resize is not drift: no new Event while and after it runs.
	before := len(events())
	s.c.k(t, "-n", testNS, "patch", "pod", "drift", "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"200m"},"limits":{"cpu":"800m"}}}]}}`)
	poll(t, "cpu.max 80000 100000 from the kubelet", 250*time.Millisecond, func() (bool, error) {
		return read() == "80000 100000", nil
	})
	// Three checks after: a difference waits one check for its
	// confirmation.
	afterDriftChecks(t, s.c, 3)
	if n := len(events()); n != before {
		t.Errorf("%d CgroupDrift Events after a kubelet resize: %+v", n-before, events()[before:])
	}
	// Nor on any other pod of the node: every container's files hold what
	// its status says.
	all, err := s.c.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=CgroupDrift"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all.Items {
		if e.InvolvedObject.Name != "drift" {
			t.Errorf("CgroupDrift on %s/%s: %s", e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Message)
		}
	}

	// Restore, opt-in: TestWriteBack, the last test.
}

// agentWithDriftRestore restarts the agent's DaemonSet pod with
// --kube-drift=restore and waits for the new pod to be Ready. A later
// test's deployAgent applies the overlay again, which takes it back out.
func agentWithDriftRestore(ctx context.Context, t *testing.T, c *cluster) {
	t.Helper()
	patchDriftRestore(t, c)
	waitDriftRestore(ctx, t, c)
}

// patchDriftRestore adds --kube-drift=restore to the DaemonSet's pod
// template, which rolls its pod.
func patchDriftRestore(t *testing.T, c *cluster) {
	t.Helper()
	c.k(t, "-n", agentNS, "patch", "ds", agentDS, "--type=json", "-p",
		`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--kube-drift=restore"}]`)
}

// waitDriftRestore waits for the agent's pod with --kube-drift=restore to
// be the only one, and Ready.
func waitDriftRestore(ctx context.Context, t *testing.T, c *cluster) {
	t.Helper()
	poll(t, "the agent restarted with --kube-drift=restore", time.Second, func() (bool, error) {
		pods, err := c.cs.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=resize-agent"})
		if err != nil || len(pods.Items) != 1 {
			return false, err
		}
		q := pods.Items[0]
		return podReady(&q) && q.DeletionTimestamp == nil && strings.Contains(strings.Join(q.Spec.Containers[0].Args, " "), "--kube-drift=restore"), nil
	})
}
