package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// pidCgroups resolves fake PIDs to fake-tree cgroups.
type pidCgroups struct {
	*recorder
	mu   sync.Mutex
	pids map[int]string
}

func (p *pidCgroups) PathOf(pid int) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.pids[pid]; ok {
		return c, nil
	}
	return "", fmt.Errorf("%w: pid %d", cgroup.ErrNotFound, pid)
}

// fakeRuntime stands in for CRI in unit tests; apply decides what an update
// does to the fake cgroup.
type fakeRuntime struct {
	mu        sync.Mutex
	ctr       cri.Container
	updates   []cri.Resources
	apply     func(cri.Resources) error
	restarts  int
	onRestart func(cri.Resources) cri.Container
}

func (f *fakeRuntime) Version(context.Context) (string, error) { return "fake 0", nil }

func (f *fakeRuntime) Find(_ context.Context, uid, name string) (cri.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if uid != f.ctr.PodUID || name != f.ctr.Name {
		return cri.Container{}, cri.ErrNotFound
	}
	return f.ctr, nil
}

func (f *fakeRuntime) Get(_ context.Context, id string) (cri.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id != f.ctr.ID {
		return cri.Container{}, cri.ErrNotFound
	}
	return f.ctr, nil
}

func (f *fakeRuntime) Update(_ context.Context, id string, r cri.Resources) error {
	f.mu.Lock()
	f.updates = append(f.updates, r)
	apply := f.apply
	f.mu.Unlock()
	if apply != nil {
		return apply(r)
	}
	return nil
}

func (f *fakeRuntime) Restart(_ context.Context, id string, r cri.Resources, _ time.Duration) (cri.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarts++
	f.ctr = f.onRestart(r)
	return f.ctr, nil
}

func runtimeFixture(t *testing.T) (*fixture, *fakeRuntime, *pidCgroups) {
	t.Helper()
	root := cgrouptest.FakeTree(t, "/kubepods/pod-u1/c1", "/kubepods/pod-u1/c2")
	cg := &pidCgroups{recorder: &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())},
		pids: map[int]string{100: "/kubepods/pod-u1/c1"}}
	rt := &fakeRuntime{ctr: cri.Container{ID: "c1", Name: "web", PodUID: "u1", PID: 100, State: "CONTAINER_RUNNING"}}
	// By default the runtime does what containerd + runc do.
	rt.apply = func(r cri.Resources) error {
		var res cgroup.Resources
		if r.CPUPeriod != 0 {
			w := cgroup.SharesToWeight(uint64(r.CPUShares))
			res.CPUWeight = &w
			res.CPUMax = &cgroup.CPUMax{Quota: r.CPUQuota, Period: uint64(r.CPUPeriod)}
		}
		if r.MemoryLimit != 0 {
			m := r.MemoryLimit
			res.MemoryMax = &m
		}
		return cg.Manager.Write("/kubepods/pod-u1/c1", res)
	}
	l := admission.NewLedger(admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	a := agent.New(cg, l, agent.WithRuntime(rt), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { a.Close(context.Background()) })
	return &fixture{root, cg.recorder, a, l}, rt, cg
}

func podSpec(req, lim map[string]string) intent.Spec {
	s := spec("web", "", req, lim)
	s.Target.CgroupPath = ""
	s.Target.PodUID = "u1"
	return s
}

func TestRuntimeUpdateIsVerifiedOnTheFiles(t *testing.T) {
	f, rt, _ := runtimeFixture(t)
	it := submit(t, f.a, podSpec(map[string]string{"cpu": "500m", "memory": "64Mi"}, map[string]string{"cpu": "1", "memory": "128Mi"}))
	want(t, it, intent.Completed, intent.ReasonApplied)
	if it.Status.Via != "runtime" {
		t.Errorf("via %q (%s)", it.Status.Via, it.Status.Message)
	}
	// Per resource, as the kubelet 1.34-1.37 does: memory first (with CPU
	// left alone), then CPU.
	if len(rt.updates) != 2 || rt.updates[1] != (cri.Resources{CPUPeriod: 100000, CPUQuota: 100000, CPUShares: 512}) ||
		rt.updates[0] != (cri.Resources{MemoryLimit: 128 << 20}) {
		t.Errorf("updates %+v", rt.updates)
	}
	if len(f.cg.Writes()) != 0 {
		t.Errorf("the agent wrote the cgroup itself: %v", f.cg.Writes())
	}
	cs := f.a.Containers()
	if len(cs) != 1 || cs[0].ContainerID != "c1" || cs[0].CgroupPath != "/kubepods/pod-u1/c1" {
		t.Errorf("containers %+v", cs)
	}
}

func TestRuntimeThatDoesNotApplyIsCorrected(t *testing.T) {
	f, rt, _ := runtimeFixture(t)
	rt.apply = func(r cri.Resources) error { return nil } // records, changes nothing
	it := submit(t, f.a, podSpec(nil, map[string]string{"cpu": "2"}))
	want(t, it, intent.Completed, intent.ReasonApplied)
	if it.Status.Via != "runtime+cgroup" || !strings.Contains(it.Status.Message, "the agent wrote the cgroup itself") {
		t.Errorf("via %q: %s", it.Status.Via, it.Status.Message)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/kubepods/pod-u1/c1", "cpu.max"); got != "200000 100000" {
		t.Errorf("cpu.max %s", got)
	}
	rt.apply = func(r cri.Resources) error { return errors.New("rpc error: code = Unknown desc = update refused") }
	it = submit(t, f.a, podSpec(nil, map[string]string{"cpu": "3"}))
	want(t, it, intent.Completed, "")
	if !strings.Contains(it.Status.Message, "the runtime refused the cpu update") {
		t.Errorf("message %s", it.Status.Message)
	}
}

func TestRuntimeContainerGoneFails(t *testing.T) {
	f, rt, _ := runtimeFixture(t)
	rt.apply = func(r cri.Resources) error { return fmt.Errorf("update: %w", cri.ErrNotFound) }
	it := submit(t, f.a, podSpec(nil, map[string]string{"cpu": "2"}))
	want(t, it, intent.Failed, intent.ReasonContainerGone)
	if got := cgrouptest.ReadFile(t, f.root, "/kubepods/pod-u1/c1", "cpu.max"); got != "max 100000" {
		t.Errorf("cpu.max %s", got)
	}
}

func TestRestartContainerPolicy(t *testing.T) {
	f, rt, cg := runtimeFixture(t)
	rt.onRestart = func(r cri.Resources) cri.Container {
		cg.mu.Lock()
		cg.pids[200] = "/kubepods/pod-u1/c2"
		cg.mu.Unlock()
		m := r.MemoryLimit
		cg.Manager.Write("/kubepods/pod-u1/c2", cgroup.Resources{MemoryMax: &m})
		return cri.Container{ID: "c2", Name: "web", PodUID: "u1", PID: 200, State: "CONTAINER_RUNNING", RestartCount: 1}
	}
	s := podSpec(map[string]string{"memory": "64Mi"}, map[string]string{"memory": "64Mi"})
	s.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	// A CPU-only change does not restart, whatever memory's policy.
	cpu := podSpec(nil, map[string]string{"cpu": "1"})
	cpu.ResizePolicy = s.ResizePolicy
	want(t, submit(t, f.a, cpu), intent.Completed, "")
	if rt.restarts != 0 {
		t.Fatal("a cpu change restarted the container")
	}
	it := submit(t, f.a, s)
	want(t, it, intent.Completed, intent.ReasonApplied)
	if !it.Status.Restarted || it.Status.ContainerID != "c2" || rt.restarts != 1 {
		t.Errorf("status %+v", it.Status)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/kubepods/pod-u1/c2", "memory.max"); got != fmt.Sprint(64<<20) {
		t.Errorf("new container memory.max %s", got)
	}
	if cs := f.a.Containers(); cs[0].ContainerID != "c2" || cs[0].CgroupPath != "/kubepods/pod-u1/c2" {
		t.Errorf("the agent did not follow the restart: %+v", cs[0])
	}
}

func TestRuntimeTargetNeedsRuntime(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 1000, Memory: gi}, "/c")
	if _, _, err := f.a.Submit(podSpec(nil, map[string]string{"cpu": "1"})); !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), "no container runtime") {
		t.Errorf("Submit = %v", err)
	}
}
