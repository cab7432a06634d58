package faults_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
	"github.com/resizer/resize-agent/test/ctrtest"
)

const (
	containerdPID = "/run/containerd.pid" // written by test/vm/guest-init.sh
	// criTimeout bounds each of the agent's CRI calls (10s by default),
	// shorter to keep the hung-runtime test short.
	criTimeout = 5 * time.Second
)

// env is the real agent on the real cgroup hierarchy behind the real API on
// a unix socket, with hooks between the agent and the kernel / runtime
// where a fault must strike at a known point.
type env struct {
	mnt, base string
	cg        *hookCgroups
	rt        *hookRuntime     // nil without containerd
	ctr       *ctrtest.Runtime // nil without containerd
	srv       *agenttest.Server
	c         *api.Client
}

func setup(t *testing.T, alloc admission.Capacity, withRuntime bool) *env {
	t.Helper()
	mnt, base := cgrouptest.Real(t)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	e := &env{mnt: mnt, base: base, cg: &hookCgroups{Cgroups: m}}
	var logs bytes.Buffer
	var logMu sync.Mutex
	opts := []agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil)))}
	if withRuntime {
		e.ctr = ctrtest.Dial(t, cri.WithTimeout(criTimeout))
		e.rt = &hookRuntime{Runtime: e.ctr.CRI, cc: e.ctr.CRI}
		opts = append(opts, agent.WithRuntime(e.rt))
	}
	e.srv = agenttest.ServeWith(t, e.cg, alloc, opts...)
	e.c = api.NewClient(e.srv.Socket)
	t.Cleanup(func() {
		if t.Failed() {
			logMu.Lock()
			t.Logf("agent log:\n%s", logs.String())
			logMu.Unlock()
		}
	})
	return e
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// hookCgroups is the real cgroup.Manager with a hook run before a write.
type hookCgroups struct {
	agent.Cgroups
	mu     sync.Mutex
	before func(path string, r cgroup.Resources)
}

func (h *hookCgroups) setBefore(f func(string, cgroup.Resources)) {
	h.mu.Lock()
	h.before = f
	h.mu.Unlock()
}

func (h *hookCgroups) Write(p string, r cgroup.Resources) error {
	h.mu.Lock()
	f := h.before
	h.mu.Unlock()
	if f != nil {
		f(p, r)
	}
	return h.Cgroups.Write(p, r)
}

// hookRuntime is the real CRI client with a hook run before an update.
type hookRuntime struct {
	agent.Runtime
	cc     *cri.Client
	mu     sync.Mutex
	before func(id string)
}

func (h *hookRuntime) setBefore(f func(string)) {
	h.mu.Lock()
	h.before = f
	h.mu.Unlock()
}

func (h *hookRuntime) Update(ctx context.Context, id string, r cri.Resources) error {
	h.mu.Lock()
	f := h.before
	h.mu.Unlock()
	if f != nil {
		f(id)
	}
	return h.Runtime.Update(ctx, id, r)
}

// once makes a hook that runs f the first time only.
func once(f func()) func() {
	var o sync.Once
	return func() { o.Do(f) }
}

// killContainerd SIGKILLs the guest's containerd (its shims, and so the
// containers, live on) and removes its socket, as a crash would leave it
// gone for a client that dials again. It may run in an agent's goroutine,
// so it reports rather than stops the test.
func killContainerd(t *testing.T) {
	b, err := os.ReadFile(containerdPID)
	if err != nil {
		t.Errorf("containerd's pid: %v", err)
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Error(err)
		return
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill containerd (pid %d): %v", pid, err)
		return
	}
	for i := 0; alive(pid); i++ {
		if i > 200 {
			t.Errorf("containerd (pid %d) still alive after SIGKILL", pid)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = os.Remove(ctrtest.Socket)
	t.Logf("containerd (pid %d) killed, socket removed", pid)
}

func containerdPIDOf(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(containerdPID)
	if err != nil {
		t.Fatalf("containerd's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// containerdRunning reports whether the guest's containerd runs.
func containerdRunning() bool {
	b, err := os.ReadFile(containerdPID)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && alive(pid)
}

// startContainerd starts containerd as test/vm/guest-init.sh does (same
// command line and config, log appended), in its own session so that it
// outlives the test binary, and waits until it answers CRI. It returns how
// long that took.
func startContainerd(t *testing.T) time.Duration {
	t.Helper()
	logf, err := os.OpenFile("/var/log/containerd.log", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("containerd", "--config", "/etc/containerd/config.toml")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	if err := os.WriteFile(containerdPID, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	probe, err := cri.Dial(ctrtest.Socket, cri.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := probe.Version(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Since(t0) > 90*time.Second || !alive(pid) {
			t.Fatalf("containerd (pid %d) did not come back: %v", pid, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	d := time.Since(t0)
	t.Logf("containerd restarted (pid %d), answering CRI after %v", pid, d.Round(time.Millisecond))
	return d
}

// ensureContainerd leaves containerd running for the tests that follow,
// whatever became of this one.
func ensureContainerd(t *testing.T) {
	t.Cleanup(func() {
		if !containerdRunning() {
			startContainerd(t)
		}
	})
}

// runPod starts a sandbox in the kubelet's cgroupfs layout.
func (e *env) runPod(t *testing.T) ctrtest.Pod { return e.ctr.RunPod(t, ctrtest.KubepodsParent) }

// runContainer starts busybox sleeping in p, with the kubelet's labels.
func (e *env) runContainer(t *testing.T, p ctrtest.Pod, name string) cri.Container {
	return e.ctr.RunContainer(t, p, name, &runtimeapi.LinuxContainerResources{
		CpuShares: 102, CpuPeriod: 100000, CpuQuota: 100000, MemoryLimitInBytes: 256 << 20,
	}, "sleep", "3600")
}

// bare makes a cgroup below the test's with a sleeping process in it.
func (e *env) bare(t *testing.T, name string) (string, *exec.Cmd) {
	t.Helper()
	p := cgrouptest.Child(t, e.mnt, e.base, name)
	cmd := exec.Command("sleep", "3600")
	cgrouptest.StartIn(t, e.mnt, p, cmd)
	return p, cmd
}

// removeCgroup kills what runs in p, reaps it and removes the cgroup, as
// the runtime does when a container exits.
func (e *env) removeCgroup(t *testing.T, p string, cmd *exec.Cmd) {
	t.Helper()
	_ = cmd.Process.Kill()
	_, _ = cmd.Process.Wait()
	for i := 0; ; i++ {
		err := os.Remove(e.mnt + p)
		if err == nil {
			return
		}
		if i > 100 {
			t.Fatalf("rmdir %s: %v", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type res map[corev1.ResourceName]string

func list(r res) corev1.ResourceList {
	if r == nil {
		return nil
	}
	l := corev1.ResourceList{}
	for k, v := range r {
		l[k] = resource.MustParse(v)
	}
	return l
}

func bareSpec(name, path string, req, lim res) intent.Spec {
	s := intent.Spec{Target: intent.Target{Name: name, CgroupPath: path}}
	s.Resources.Requests, s.Resources.Limits = list(req), list(lim)
	return s
}

func podSpec(p ctrtest.Pod, name string, req, lim res) intent.Spec {
	s := intent.Spec{Target: intent.Target{Name: name, PodUID: p.UID}}
	s.Resources.Requests, s.Resources.Limits = list(req), list(lim)
	return s
}

func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

func (e *env) submit(t *testing.T, s intent.Spec) intent.Intent {
	t.Helper()
	it, _, err := e.c.Submit(ctx(t, 60*time.Second), s)
	if err != nil {
		t.Fatalf("submit %s: %v", s.Target.Name, err)
	}
	return it
}

// settled waits (bounded) for the intent to be terminal or Deferred.
func (e *env) settled(t *testing.T, id string) intent.Intent {
	t.Helper()
	it, err := e.c.WaitSettled(ctx(t, 60*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	return it
}

// waitState polls until the intent is in state s.
func (e *env) waitState(t *testing.T, id string, s intent.State) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		it, err := e.c.Get(ctx(t, 10*time.Second), id)
		if err != nil {
			t.Fatal(err)
		}
		if it.Status.State == s {
			return
		}
	}
	t.Fatalf("intent %s never reached %s", id, s)
}

func expect(t *testing.T, it intent.Intent, s intent.State, reason string, msg ...string) {
	t.Helper()
	if it.Status.State != s || it.Status.Reason != reason {
		t.Fatalf("intent %s: %s/%s %q, want %s/%s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message, s, reason)
	}
	for _, m := range msg {
		if !strings.Contains(it.Status.Message, m) {
			t.Errorf("intent %s: message %q does not say %q", it.ID, it.Status.Message, m)
		}
	}
	t.Logf("intent %s: %s/%s: %s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message)
}

// healthy is what must hold after every fault: no intent left
// non-terminal (waited for, bounded), the API answers, and the ledger adds
// up: what GET /v1/node says is allocated is the sum of what the managed
// containers hold, and each holds its declared requests.
func (e *env) healthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		all, err := e.c.List(ctx(t, 10*time.Second), "", "")
		if err != nil {
			t.Fatalf("API does not answer: %v", err)
		}
		var open []string
		for _, it := range all {
			if !it.Status.State.Terminal() {
				open = append(open, it.ID+" "+string(it.Status.State))
			}
		}
		if len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("intents stuck non-terminal: %v", open)
		}
		time.Sleep(50 * time.Millisecond)
	}
	node, err := e.c.Node(ctx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctrs, err := e.c.Containers(ctx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var sum admission.Capacity
	for _, c := range ctrs {
		sum.MilliCPU += c.Allocated.MilliCPU
		sum.Memory += c.Allocated.Memory
		if c.Allocated.MilliCPU != c.Resources.CPURequest || c.Allocated.Memory != c.Resources.MemoryRequest {
			t.Errorf("container %s holds %+v on the ledger, but its requests are cpu=%dm memory=%d", c.Name, c.Allocated, c.Resources.CPURequest, c.Resources.MemoryRequest)
		}
	}
	if node.Allocated != sum {
		t.Errorf("ledger: node allocated %+v, containers hold %+v", node.Allocated, sum)
	}
	if node.Free.MilliCPU != node.Allocatable.MilliCPU-node.Allocated.MilliCPU || node.Free.Memory != node.Allocatable.Memory-node.Allocated.Memory ||
		node.Allocated.MilliCPU < 0 || node.Allocated.Memory < 0 {
		t.Errorf("ledger inconsistent: %+v", node)
	}
}

// managed returns the agent's view of a container, if it manages it.
func (e *env) managed(t *testing.T, name string) (agent.ContainerInfo, bool) {
	t.Helper()
	ctrs, err := e.c.Containers(ctx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctrs {
		if c.Name == name {
			return c, true
		}
	}
	return agent.ContainerInfo{}, false
}

func statusCode(err error) (int, string) {
	var se *api.StatusError
	if errors.As(err, &se) {
		return se.Code, se.Body.Reason
	}
	return 0, ""
}
