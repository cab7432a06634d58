package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/agent/api"
)

// TestLatency: a kubectl resize of CPU and memory of a pod with a quiet
// container (app) and a CPU-starved one (hog, a busy loop held at 100m).
// The agent's API, metric and Event show the four phases in order, close
// to what the test measures from outside (the patch, the pod's conditions
// and status polled, the app container's files read from inside it), and
// the hog's throttling is lower after the raise than before. The kubelet's
// own kubelet_pod_resize_duration_milliseconds for the same resize is
// logged beside them.
func TestLatency(t *testing.T) {
	c := setup(t)
	ctx := context.Background()
	node, agentPod := withAgent(t, c)
	useTestNamespace(t, c)
	image := os.Getenv("RESIZE_AGENT_NODE_BUSYBOX")
	if image == "" {
		image = "localhost/resize-agent/busybox:latest"
	}
	const name = "latency"
	notRequired := []corev1.ContainerResizePolicy{
		{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
		{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.NotRequired},
	}
	ctr := func(n, cmd, reqCPU, limCPU string) corev1.Container {
		return corev1.Container{
			Name: n, Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sh", "-c", "trap exit TERM; " + cmd},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(reqCPU), corev1.ResourceMemory: resource.MustParse("32Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limCPU), corev1.ResourceMemory: resource.MustParse("64Mi")},
			},
			ResizePolicy: notRequired,
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: corev1.PodSpec{
			NodeName: node.Name, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{
				ctr("app", "while :; do sleep 1; done", "100m", "500m"),
				ctr("hog", "while :; do :; done", "100m", "100m"),
			},
		},
	}
	if _, err := c.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.try("-n", testNS, "delete", "pod", name, "--wait=false") })
	poll(t, "the test pod Ready", 500*time.Millisecond, func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		return err == nil && podReady(p), err
	})
	// The agent samples every container every 5 s; the window before the
	// resize is 30 s of them.
	time.Sleep(40 * time.Second)
	kubeletBefore := kubeletResizeMs(t, c, node.Name)
	skew := guestClockSkew(ctx, t, c, name, "app")
	t.Logf("the node's clock is %v ahead of the host's", skew)
	timing(t, "latency_guest_clock_skew", skew)

	samples, stop := watcher(ctx, t, c, name)
	defer stop()
	var first sample
	select {
	case first = <-samples:
	case <-time.After(time.Minute):
		t.Fatal("no sample from the watcher in the container within a minute")
	}

	// The pod as seen from outside, every 100 ms.
	type seen struct{ admitted, status time.Time }
	var mu sync.Mutex
	var out seen
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	var gen int64
	startPoll := func(g int64) {
		go func() {
			for pctx.Err() == nil {
				p, err := c.cs.CoreV1().Pods(testNS).Get(pctx, name, metav1.GetOptions{})
				now := time.Now()
				if err == nil {
					mu.Lock()
					if out.admitted.IsZero() && admittedFor(p, g) {
						out.admitted = now
					}
					if out.status.IsZero() && p.Generation >= g && statusReports(p) {
						out.status = now
					}
					mu.Unlock()
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	before, err := c.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gen = before.Generation + 1
	startPoll(gen)

	patch := `{"spec":{"containers":[` +
		`{"name":"app","resources":{"requests":{"cpu":"200m","memory":"32Mi"},"limits":{"cpu":"800m","memory":"96Mi"}}},` +
		`{"name":"hog","resources":{"requests":{"cpu":"100m","memory":"32Mi"},"limits":{"cpu":"300m","memory":"64Mi"}}}]}}`
	t0 := time.Now()
	c.k(t, "-n", testNS, "patch", "pod", name, "--subresource", "resize", "--patch", patch)
	patchReturned := time.Since(t0)
	timing(t, "latency_patch_returned", patchReturned)

	var filesAt time.Time
	deadline := time.After(2 * time.Minute)
	for filesAt.IsZero() {
		select {
		case s, ok := <-samples:
			if !ok {
				t.Fatal("the watcher in the container ended")
			}
			if s.start != first.start {
				t.Fatalf("PID 1 of app changed: not resized in place")
			}
			if s.cpuMax == "80000 100000" && s.memMax == "100663296" {
				filesAt = s.at
			}
		case <-deadline:
			t.Fatal("app's cgroup files not resized 2 minutes after the patch")
		}
	}
	stop() // the watcher's exec costs the node's only CPU
	poll(t, "the status to report the resize", 100*time.Millisecond, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return !out.status.IsZero(), nil
	})
	pcancel()
	mu.Lock()
	outside := map[string]float64{"cgroup": filesAt.Sub(t0).Seconds(), "status": out.status.Sub(t0).Seconds()}
	if !out.admitted.IsZero() {
		outside["admitted"] = out.admitted.Sub(t0).Seconds()
	}
	mu.Unlock()
	for _, p := range []string{"admitted", "cgroup", "status"} {
		if v, ok := outside[p]; ok {
			timing(t, "latency_outside_"+p, time.Duration(v*float64(time.Second)))
		}
	}

	// The Event, once the 30 s window after the files held the values ends.
	var event *corev1.Event
	poll(t, "the ResizeMeasured Event", time.Second, func() (bool, error) {
		l, err := c.cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=ResizeMeasured"})
		if err != nil || len(l.Items) == 0 {
			return false, err
		}
		event = &l.Items[len(l.Items)-1]
		return true, nil
	})
	t.Logf("Event %s %s from %s: %s", event.Type, event.Reason, event.Source.Component, event.Message)
	// The hog has given its evidence; on one vCPU it slows everything
	// after it (the agent's probes failed with a hog at 500m).
	c.try("-n", testNS, "delete", "pod", name, "--wait=false")
	if event.Type != corev1.EventTypeNormal || event.Source.Component != "resize-agent" ||
		!strings.Contains(event.Message, "generation "+strconv.FormatInt(gen, 10)+" by kubectl-patch (app,hog) completed:") ||
		!strings.Contains(event.Message, "hog before->after:") {
		t.Errorf("Event message: %q", event.Message)
	}

	// The agent's API.
	raw := c.k(t, "-n", agentNS, "exec", "ds/"+agentDS, "--", "resizectl", "kube-resizes", "--pod", testNS+"/"+name, "-o", "json")
	var list []api.KubeResize
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		t.Fatalf("resizectl kube-resizes: %v: %s", err, raw)
	}
	var r *api.KubeResize
	for i := range list {
		if list[i].Generation == gen {
			r = &list[i]
		}
	}
	if r == nil {
		t.Fatalf("no measured resize of generation %d: %s", gen, raw)
	}
	if b, err := json.MarshalIndent(r, "", "  "); err == nil {
		t.Logf("measured resize:\n%s", b)
	}
	if r.Outcome != "completed" || r.Manager != "kubectl-patch" || strings.Join(r.Containers, ",") != "app,hog" {
		t.Errorf("outcome %s manager %s containers %v", r.Outcome, r.Manager, r.Containers)
	}
	agentPh := map[string]float64{}
	var order []string
	for _, p := range r.Phases {
		agentPh[p.Phase] = p.Seconds
		order = append(order, p.Phase)
		timing(t, "latency_agent_"+p.Phase, time.Duration(p.Seconds*float64(time.Second)))
	}
	if strings.Join(order, ",") != "accepted,admitted,cgroup,status" {
		t.Errorf("phases %v, want accepted, admitted, cgroup, status", order)
	}
	if !(agentPh["admitted"] <= agentPh["cgroup"] && agentPh["cgroup"] <= agentPh["status"]) {
		t.Errorf("phases not in order: %v", agentPh)
	}
	// The agent's times are the node's clock; taken to the host's (the
	// skew measured above), they compare with the test's own from the
	// patch being sent (t0) without the API server's whole seconds.
	// accepted is the agent's own arithmetic: seenAt - acceptedAt.
	if r.AcceptedAt == nil || math.Abs(r.SeenAt.Sub(*r.AcceptedAt).Seconds()-agentPh["accepted"]) > 0.001 && agentPh["accepted"] != 0 {
		t.Errorf("accepted %.3fs, seenAt %v, acceptedAt %v", agentPh["accepted"], r.SeenAt, r.AcceptedAt)
	}
	host := func(at time.Time) float64 { return at.Add(-skew).Sub(t0).Seconds() }
	// The watch lags the API server on one vCPU with a busy loop beside it:
	// by 2 s in an early run, 2.34 s on a cold CI machine (2026-12-06).
	// The bound is there to catch a seenAt from the wrong clock or the
	// wrong event (the status's, seconds later), not to time the watch:
	// make bench does that.
	last := r.SeenAt
	if n := len(r.Phases); n > 0 {
		last = r.Phases[n-1].At
	}
	if s := host(r.SeenAt); s < -0.3 || s > 5 || s > host(last) {
		t.Errorf("the agent saw the change %.2fs after the patch was sent (host clock; the node's is %v ahead)", s, skew)
	}
	// The watcher reads app's files only, and the kubelet updates app and
	// hog one after the other (CRI calls of a second or more each on this
	// node): app's files are compared with the agent's time for app, and
	// the cgroup phase (both) must not come before it.
	var appAt time.Time
	for _, cc := range r.ContainerCgroups {
		if cc.Container == "app" {
			appAt = cc.At
		}
		timing(t, "latency_agent_cgroup_"+cc.Container, time.Duration(cc.Seconds*float64(time.Second)))
	}
	if appAt.IsZero() || len(r.ContainerCgroups) != 2 {
		t.Errorf("containerCgroups %+v: want app and hog", r.ContainerCgroups)
	}
	var statusAt time.Time
	for _, p := range r.Phases {
		if p.Phase == "status" {
			statusAt = p.At
		}
		if p.Phase == "cgroup" && appAt.After(p.At) {
			t.Errorf("app's files held the values at %v, after the cgroup phase %v", appAt, p.At)
		}
	}
	// The test's reads lag too: the files every 200 ms through exec, by a
	// loop in app that forks and starves like everything else in
	// kubepods (it saw app's files 0.96 s after the kernel's time of the
	// write in one run), the status every 100 ms. With eBPF the agent's
	// cgroup time is the kernel's time of the write, so it may be well
	// before the test's; it must not be much after.
	for p, agent := range map[string]time.Time{"cgroup": appAt, "status": statusAt} {
		a := host(agent)
		timing(t, "latency_agent_host_"+p, time.Duration(a*float64(time.Second)))
		if d := outside[p] - a; d < -1.5 || d > 2.5 {
			t.Errorf("phase %s: agent %.2fs after the patch was sent (host clock), outside %.2fs", p, a, outside[p])
		}
	}
	t.Logf("phases agent (from seen): %v; outside (from patch): %v; admitted by %s", agentPh, outside, r.AdmittedBy)

	// Pressure: the hog was throttled at 100m before and less at 500m.
	var hog *api.ResizePressure
	for i := range r.Pressure {
		if r.Pressure[i].Container == "hog" {
			hog = &r.Pressure[i]
		}
	}
	if hog == nil || hog.Before == nil || hog.After == nil {
		t.Fatalf("no before/after pressure for hog: %+v", r.Pressure)
	}
	tb, ta := hog.Before.ThrottledSeconds/hog.Before.Seconds, hog.After.ThrottledSeconds/hog.After.Seconds
	t.Logf("hog: throttled %.3f s/s before, %.3f s/s after; source %s; runq p50 %v -> %v, p99 %v -> %v; cpu psi %v -> %v",
		tb, ta, hog.After.Source, f(hog.Before.RunqP50Seconds), f(hog.After.RunqP50Seconds), f(hog.Before.RunqP99Seconds), f(hog.After.RunqP99Seconds),
		f(hog.Before.CPUPressure), f(hog.After.CPUPressure))
	if !(tb > 0.5 && ta < tb) {
		t.Errorf("hog throttled %.3f s/s before, %.3f s/s after: want heavy before and lower after", tb, ta)
	}

	// The metric.
	body := []byte(scrapeMetrics(t, c, agentPod))
	for _, p := range []string{"accepted", "admitted", "cgroup", "status"} {
		re := regexp.MustCompile(`resize_agent_kube_resize_duration_seconds_count\{outcome="completed",phase="` + p + `"\} (\d+)`)
		m := re.FindSubmatch(body)
		if m == nil || string(m[1]) == "0" {
			t.Errorf("resize_agent_kube_resize_duration_seconds{phase=%q,outcome=completed}: %q", p, m)
		}
	}

	// The kubelet's own figure for the same resize.
	kubeletAfter := kubeletResizeMs(t, c, node.Name)
	if kubeletAfter.count > kubeletBefore.count {
		ms := (kubeletAfter.sum - kubeletBefore.sum) / (kubeletAfter.count - kubeletBefore.count)
		t.Logf("kubelet_pod_resize_duration_milliseconds{success=true}: %d resize(s), %.0f ms each", int(kubeletAfter.count-kubeletBefore.count), ms)
		timing(t, "latency_kubelet_pod_resize_duration", time.Duration(ms*float64(time.Millisecond)))
	} else {
		t.Logf("kubelet_pod_resize_duration_milliseconds did not count this resize (before %+v, after %+v)", kubeletBefore, kubeletAfter)
	}
}

func f(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'g', 4, 64)
}

func admittedFor(p *corev1.Pod, gen int64) bool {
	if p.Generation < gen {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodResizeInProgress && c.ObservedGeneration >= gen {
			return true
		}
		if c.Type == corev1.PodResizePending && c.ObservedGeneration >= gen {
			return false
		}
	}
	return p.Status.ObservedGeneration >= gen
}

func statusReports(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, c := range p.Spec.Containers {
		var st *corev1.ContainerStatus
		for j := range p.Status.ContainerStatuses {
			if p.Status.ContainerStatuses[j].Name == c.Name {
				st = &p.Status.ContainerStatuses[j]
			}
		}
		if st == nil || st.Resources == nil || !sameResources(*st.Resources, c.Resources) {
			return false
		}
	}
	return true
}

type histo struct{ sum, count float64 }

var kubeletResizeRE = regexp.MustCompile(`(?m)^kubelet_pod_resize_duration_milliseconds_(sum|count)\{success="true"\} (\S+)$`)

// kubeletResizeMs reads the kubelet's kubelet_pod_resize_duration_milliseconds
// through the API server's node proxy.
func kubeletResizeMs(t *testing.T, c *cluster, node string) histo {
	t.Helper()
	raw, err := c.cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics").DoRaw(context.Background())
	if err != nil {
		t.Logf("kubelet /metrics through the API server: %v", err)
		return histo{}
	}
	var h histo
	for _, m := range kubeletResizeRE.FindAllSubmatch(raw, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		if string(m[1]) == "sum" {
			h.sum = v
		} else {
			h.count = v
		}
	}
	if !bytes.Contains(raw, []byte("kubelet_pod_resize_duration_milliseconds")) {
		t.Log("no kubelet_pod_resize_duration_milliseconds in the kubelet's /metrics (none observed yet, or not exported)")
	}
	return h
}
