package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// criEnv is a real containerd reached through CRI, with the agent on the
// real cgroup hierarchy using it.
type criEnv struct {
	*ctrtest.Runtime
	mnt string
	a   *agent.Agent
	c   *api.Client
}

func setupCRI(t *testing.T, alloc admission.Capacity, opts ...agent.Option) *criEnv {
	t.Helper()
	mnt, _ := cgrouptest.Real(t)
	rt := ctrtest.Dial(t)
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	srv := agenttest.ServeWith(t, cg, alloc, append([]agent.Option{agent.WithRuntime(rt.CRI)}, opts...)...)
	return &criEnv{Runtime: rt, mnt: mnt, a: srv.Agent, c: api.NewClient(srv.Socket)}
}

// runPod starts a pod sandbox under the kubelet's cgroupfs layout
// (/kubepods/burstable/pod<uid>).
func (e *criEnv) runPod(t *testing.T) ctrtest.Pod { return e.RunPod(t, ctrtest.KubepodsParent) }

// runContainer starts a busybox container in p with the given resources.
func (e *criEnv) runContainer(t *testing.T, p ctrtest.Pod, name string, res *runtimeapi.LinuxContainerResources, cmd ...string) cri.Container {
	return e.RunContainer(t, p, name, res, cmd...)
}

func (e *criEnv) resize(t *testing.T, p ctrtest.Pod, name string, req, lim res, pol []corev1.ContainerResizePolicy) intent.Intent {
	t.Helper()
	s := intent.Spec{Target: intent.Target{Name: name, PodUID: p.UID}, ResizePolicy: pol}
	s.Resources.Requests, s.Resources.Limits = list(req), list(lim)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	it, _, err := e.c.Submit(ctx, s)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if it, err = e.c.WaitSettled(ctx, it.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("resize %s %v %v -> %s %s via=%s %s", name, req, lim, it.Status.State, it.Status.Reason, it.Status.Via, it.Status.Message)
	return it
}

func (e *criEnv) cgroupOf(t *testing.T, ct cri.Container) string {
	t.Helper()
	p, err := cgroup.New(cgroup.WithMountpoint(e.mnt)).PathOf(ct.PID)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *criEnv) exec(t *testing.T, id string, cmd ...string) (int32, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := e.RT.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 50})
	if err != nil {
		t.Fatalf("ExecSync %v: %v", cmd, err)
	}
	return r.ExitCode, string(r.Stdout) + string(r.Stderr)
}

// sameContainer checks that the container was not restarted.
func (e *criEnv) sameContainer(t *testing.T, before cri.Container) {
	t.Helper()
	now, err := e.CRI.Get(context.Background(), before.ID)
	if err != nil {
		t.Fatalf("the container is gone: %v", err)
	}
	if !now.Running() || now.PID != before.PID || !now.StartedAt.Equal(before.StartedAt) || now.Attempt != 0 || now.RestartCount != 0 {
		t.Errorf("container restarted or stopped: before pid %d started %v, now %s pid %d started %v attempt %d restarts %d",
			before.PID, before.StartedAt, now.State, now.PID, now.StartedAt, now.Attempt, now.RestartCount)
	}
}

// TestCRIResizeCPUWithoutRestart resizes a running containerd container's
// CPU through the agent's CRI path: containerd's record and the kernel's
// files both change, the CPU the container gets follows, and it is the
// same process throughout.
func TestCRIResizeCPUWithoutRestart(t *testing.T) {
	e := setupCRI(t, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30})
	p := e.runPod(t)
	ct := e.runContainer(t, p, "busy", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 205},
		"/bin/busybox", "sh", "-c", "while :; do :; done")
	cg := e.cgroupOf(t, ct)
	for _, step := range []struct {
		limit, cpuMax string
		quota         int64
		lo, hi        float64
	}{
		{"600m", "60000 100000", 60000, 0.45, 0.75},
		{"250m", "25000 100000", 25000, 0.15, 0.35},
	} {
		it := e.resize(t, p, "busy", res{"cpu": "200m"}, res{"cpu": step.limit}, nil)
		mustState(t, it, intent.Completed)
		if it.Status.Via != "runtime" {
			t.Errorf("via %q: %s", it.Status.Via, it.Status.Message)
		}
		if got := cgrouptest.ReadFile(t, e.mnt, cg, "cpu.max"); got != step.cpuMax {
			t.Errorf("kernel cpu.max = %q, want %q", got, step.cpuMax)
		}
		st, err := e.CRI.Get(context.Background(), ct.ID)
		if err != nil || st.Resources.CPUQuota != step.quota {
			t.Errorf("containerd's record: quota %d (%v), want %d", st.Resources.CPUQuota, err, step.quota)
		}
		time.Sleep(300 * time.Millisecond)
		rate := cgrouptest.CPURate(t, e.mnt, cg, 3*time.Second)
		t.Logf("limit %s: measured %.3f CPUs", step.limit, rate)
		if rate < step.lo || rate > step.hi {
			t.Errorf("limit %s: container used %.3f CPUs, want %.2f..%.2f", step.limit, rate, step.lo, step.hi)
		}
	}
	e.sameContainer(t, ct)
}

// TestCRIMemoryResize raises a container's memory limit so that an
// allocation inside it that the old limit OOM-killed succeeds, then refuses
// a decrease below what it holds, with the container alive.
func TestCRIMemoryResize(t *testing.T) {
	e := setupCRI(t, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30})
	p := e.runPod(t)
	ct := e.runContainer(t, p, "mem", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 32 << 20},
		"/bin/busybox", "sleep", "3600")
	cg := e.cgroupOf(t, ct)
	// busybox tail keeps a line with no newline whole in memory.
	alloc := []string{"/bin/busybox", "sh", "-c", "/bin/busybox head -c 48m /dev/zero | /bin/busybox tail >/dev/null"}
	code, out := e.exec(t, ct.ID, alloc...)
	t.Logf("48MiB under 32Mi: exit %d %s; memory.events %s", code, out, strings.ReplaceAll(cgrouptest.ReadFile(t, e.mnt, cg, "memory.events"), "\n", " "))
	if code == 0 {
		t.Fatal("allocating 48MiB under a 32Mi limit succeeded")
	}
	mustState(t, e.resize(t, p, "mem", res{"memory": "96Mi"}, res{"memory": "96Mi"}, nil), intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, cg, "memory.max"); got != "100663296" {
		t.Errorf("kernel memory.max = %s", got)
	}
	if st, _ := e.CRI.Get(context.Background(), ct.ID); st.Resources.MemoryLimit != 96<<20 {
		t.Errorf("containerd's record: memory limit %d", st.Resources.MemoryLimit)
	}
	if code, out := e.exec(t, ct.ID, alloc...); code != 0 {
		t.Fatalf("48MiB under 96Mi: exit %d %s", code, out)
	}
	// Hold 40MiB of shared memory, which nothing can reclaim without swap.
	if code, out := e.exec(t, ct.ID, "/bin/busybox", "sh", "-c", "/bin/busybox head -c 40m /dev/zero >/dev/shm/hold"); code != 0 {
		t.Fatalf("holding 40MiB: %d %s", code, out)
	}
	t.Logf("memory.current holding 40MiB: %s", cgrouptest.ReadFile(t, e.mnt, cg, "memory.current"))
	it := e.resize(t, p, "mem", res{"memory": "16Mi"}, res{"memory": "16Mi"}, nil)
	mustState(t, it, intent.Failed)
	if it.Status.Reason != intent.ReasonMemoryBelowUsage {
		t.Errorf("reason %s", it.Status.Reason)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, cg, "memory.max"); got != "100663296" {
		t.Errorf("memory.max = %s after a refused decrease", got)
	}
	mustState(t, e.resize(t, p, "mem", res{"memory": "64Mi"}, res{"memory": "64Mi"}, nil), intent.Completed)
	e.sameContainer(t, ct)
}

// TestCRIRestartContainerPolicy resizes memory with resizePolicy
// RestartContainer: that container is restarted with the new limit, its
// sidecar in the same pod is not.
func TestCRIRestartContainerPolicy(t *testing.T) {
	e := setupCRI(t, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30})
	p := e.runPod(t)
	main := e.runContainer(t, p, "main", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 32 << 20}, "/bin/busybox", "sleep", "3600")
	side := e.runContainer(t, p, "side", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 32 << 20}, "/bin/busybox", "sleep", "3600")
	pol := []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	// CPU changes with NotRequired: no restart.
	mustState(t, e.resize(t, p, "main", res{"cpu": "100m"}, res{"cpu": "500m"}, pol), intent.Completed)
	e.sameContainer(t, main)
	it := e.resize(t, p, "main", res{"memory": "64Mi"}, res{"memory": "64Mi"}, pol)
	mustState(t, it, intent.Completed)
	if !it.Status.Restarted || it.Status.ContainerID == main.ID {
		t.Fatalf("not restarted: %+v", it.Status)
	}
	now, err := e.CRI.Find(context.Background(), p.UID, "main")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("main restarted: %s -> %s, attempt %d, restart count %d, pid %d -> %d", main.ID[:12], now.ID[:12], now.Attempt, now.RestartCount, main.PID, now.PID)
	if now.ID != it.Status.ContainerID || now.Attempt != 1 || now.RestartCount != 1 || now.PID == main.PID {
		t.Errorf("new container %+v", now)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, e.cgroupOf(t, now), "memory.max"); got != "67108864" {
		t.Errorf("new container memory.max = %s", got)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, e.cgroupOf(t, now), "cpu.max"); got != "50000 100000" {
		t.Errorf("new container kept cpu.max = %s", got)
	}
	if _, err := e.CRI.Get(context.Background(), main.ID); err == nil {
		t.Error("the old container still exists")
	}
	e.sameContainer(t, side)
	// And the agent follows the new container for the next resize.
	mustState(t, e.resize(t, p, "main", nil, res{"cpu": "700m"}, pol), intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, e.cgroupOf(t, now), "cpu.max"); got != "70000 100000" {
		t.Errorf("after restart, cpu.max = %s", got)
	}
}

// TestCRIAdmission: Infeasible, then Deferred until another container
// shrinks, with runtime containers.
func TestCRIAdmission(t *testing.T) {
	e := setupCRI(t, admission.Capacity{MilliCPU: 1000, Memory: 2 << 30})
	p := e.runPod(t)
	e.runContainer(t, p, "a", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102}, "/bin/busybox", "sleep", "3600")
	b := e.runContainer(t, p, "b", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102}, "/bin/busybox", "sleep", "3600")
	mustState(t, e.resize(t, p, "a", res{"cpu": "800m"}, nil, nil), intent.Completed)
	mustState(t, e.resize(t, p, "b", res{"cpu": "1500m"}, nil, nil), intent.Infeasible)
	def := e.resize(t, p, "b", res{"cpu": "500m"}, nil, nil)
	mustState(t, def, intent.Deferred)
	mustState(t, e.resize(t, p, "a", res{"cpu": "300m"}, nil, nil), intent.Completed)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	it, err := e.c.WaitSettled(ctx, def.ID)
	for err == nil && it.Status.State == intent.Deferred {
		time.Sleep(20 * time.Millisecond)
		it, err = e.c.Get(ctx, def.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	mustState(t, it, intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, e.cgroupOf(t, b), "cpu.weight"); got != "59" {
		t.Errorf("b cpu.weight = %s, want 59 (500m)", got)
	}
	e.sameContainer(t, b)
}
