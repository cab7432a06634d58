package integration_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// The test binary doubles as the workload: RA_HELPER=busy spins, and
// RA_HELPER=alloc touches RA_MB MiB of anonymous memory, says so, and holds
// it until killed.
func TestMain(m *testing.M) {
	switch os.Getenv("RA_HELPER") {
	case "busy":
		for {
		}
	case "alloc":
		mb, _ := strconv.Atoi(os.Getenv("RA_MB"))
		buf := make([]byte, mb<<20)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		fmt.Println("allocated", mb, "MiB")
		if os.Getenv("RA_HOLD") == "" {
			os.Exit(0)
		}
		time.Sleep(time.Hour)
		_ = buf[0]
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper(env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

type env struct {
	mnt, base string
	srv       *agenttest.Server
	c         *api.Client
}

func setup(t *testing.T, alloc admission.Capacity) *env {
	t.Helper()
	mnt, base := cgrouptest.Real(t)
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := cg.Check(); err != nil {
		t.Fatal(err)
	}
	srv := agenttest.ServeWith(t, cg, alloc)
	return &env{mnt, base, srv, api.NewClient(srv.Socket)}
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

func (e *env) resize(t *testing.T, name, path, pod string, req, lim res) intent.Intent {
	t.Helper()
	s := intent.Spec{Target: intent.Target{Name: name, CgroupPath: path, PodCgroupPath: pod}}
	s.Resources.Requests, s.Resources.Limits = list(req), list(lim)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it, _, err := e.c.Submit(ctx, s)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	it, err = e.c.WaitSettled(ctx, it.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("resize %s %v %v -> %s %s %s", name, req, lim, it.Status.State, it.Status.Reason, it.Status.Message)
	return it
}

func mustState(t *testing.T, it intent.Intent, s intent.State) {
	t.Helper()
	if it.Status.State != s {
		t.Fatalf("intent %s is %s (%s: %s), want %s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message, s)
	}
}

// TestCPULimitFollowsRate raises and lowers a running process's CPU limit
// and measures that the CPU it gets follows cpu.max, with the same process
// throughout.
func TestCPULimitFollowsRate(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30})
	p := cgrouptest.Child(t, e.mnt, e.base, "busy")
	busy := helper("RA_HELPER=busy")
	cgrouptest.StartIn(t, e.mnt, p, busy)
	pid := busy.Process.Pid
	for _, step := range []struct {
		limit  string
		cpuMax string
		lo, hi float64
	}{
		{"200m", "20000 100000", 0.12, 0.28},
		{"600m", "60000 100000", 0.45, 0.75},
		{"300m", "30000 100000", 0.2, 0.4},
	} {
		mustState(t, e.resize(t, "busy", p, "", nil, res{"cpu": step.limit}), intent.Completed)
		if got := cgrouptest.ReadFile(t, e.mnt, p, "cpu.max"); got != step.cpuMax {
			t.Fatalf("cpu.max = %q, want %q", got, step.cpuMax)
		}
		time.Sleep(300 * time.Millisecond) // let the new quota take hold
		rate := cgrouptest.CPURate(t, e.mnt, p, 3*time.Second)
		t.Logf("limit %s: measured %.3f CPUs (want %.2f..%.2f)", step.limit, rate, step.lo, step.hi)
		if rate < step.lo || rate > step.hi {
			t.Errorf("limit %s: the busy loop used %.3f CPUs", step.limit, rate)
		}
	}
	if procs := cgrouptest.ReadFile(t, e.mnt, p, "cgroup.procs"); procs != strconv.Itoa(pid) {
		t.Errorf("cgroup.procs = %q, want the same process %d throughout", procs, pid)
	}
	if err := busy.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process did not survive the resizes: %v", err)
	}
}

// TestMemoryLimit shows an allocation the old limit made fail (the kernel
// OOM-killed it) succeed after the limit is raised, a decrease that stays
// above usage complete, and one below usage refused with the process alive.
func TestMemoryLimit(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30})
	p := cgrouptest.Child(t, e.mnt, e.base, "mem")
	mustState(t, e.resize(t, "mem", p, "", nil, res{"memory": "32Mi"}), intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.max"); got != "33554432" {
		t.Fatalf("memory.max = %s", got)
	}
	run := func(mb int, hold bool) (*exec.Cmd, error) {
		env := []string{"RA_HELPER=alloc", "RA_MB=" + strconv.Itoa(mb)}
		if hold {
			env = append(env, "RA_HOLD=1")
		}
		cmd := helper(env...)
		out := &strings.Builder{}
		cmd.Stdout = out
		cgrouptest.StartIn(t, e.mnt, p, cmd)
		if hold {
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(out.String(), "allocated") && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			return cmd, nil
		}
		return cmd, cmd.Wait()
	}
	_, err := run(48, false)
	t.Logf("48MiB under a 32Mi limit: %v; memory.events: %s", err, strings.ReplaceAll(cgrouptest.ReadFile(t, e.mnt, p, "memory.events"), "\n", " "))
	if err == nil {
		t.Fatal("allocating 48MiB under a 32Mi limit succeeded")
	}
	mustState(t, e.resize(t, "mem", p, "", res{"memory": "96Mi"}, res{"memory": "96Mi"}), intent.Completed)
	if _, err := run(48, false); err != nil {
		t.Fatalf("allocating 48MiB under a 96Mi limit: %v", err)
	}
	holder, _ := run(48, true)
	cur, _ := strconv.ParseInt(cgrouptest.ReadFile(t, e.mnt, p, "memory.current"), 10, 64)
	t.Logf("holding 48MiB: memory.current = %d", cur)
	mustState(t, e.resize(t, "mem", p, "", res{"memory": "80Mi"}, res{"memory": "80Mi"}), intent.Completed)
	it := e.resize(t, "mem", p, "", res{"memory": "16Mi"}, res{"memory": "16Mi"})
	mustState(t, it, intent.Failed)
	if it.Status.Reason != intent.ReasonMemoryBelowUsage {
		t.Errorf("reason %s", it.Status.Reason)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.max"); got != "83886080" {
		t.Errorf("memory.max = %s after a refused decrease, want 80Mi", got)
	}
	if err := holder.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the holder died: %v", err)
	}
}

// TestInfeasibleThenDeferredThenCompleted runs admission on real cgroups.
func TestInfeasibleThenDeferredThenCompleted(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 1000, Memory: 1 << 30})
	a := cgrouptest.Child(t, e.mnt, e.base, "a")
	b := cgrouptest.Child(t, e.mnt, e.base, "b")
	mustState(t, e.resize(t, "a", a, "", res{"cpu": "800m"}, res{"cpu": "800m"}), intent.Completed)
	inf := e.resize(t, "b", b, "", res{"cpu": "2"}, nil)
	mustState(t, inf, intent.Infeasible)
	def := e.resize(t, "b", b, "", res{"cpu": "500m"}, res{"cpu": "500m"})
	mustState(t, def, intent.Deferred)
	if got := cgrouptest.ReadFile(t, e.mnt, b, "cpu.max"); got != "max 100000" {
		t.Errorf("deferred intent wrote cpu.max = %s", got)
	}
	mustState(t, e.resize(t, "a", a, "", res{"cpu": "300m"}, res{"cpu": "300m"}), intent.Completed)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		it, err := e.c.Get(ctx, def.ID)
		if err != nil {
			t.Fatal(err)
		}
		if it.Status.State.Terminal() {
			mustState(t, it, intent.Completed)
			t.Logf("deferred intent completed %v after acceptance", it.Status.CompletedAt.Sub(it.Status.AcceptedAt))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, b, "cpu.max"); got != "50000 100000" {
		t.Errorf("cpu.max = %s", got)
	}
}

// TestPodLevelCgroup keeps the pod cgroup at the sum of its containers.
func TestPodLevelCgroup(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 8000, Memory: 4 << 30})
	pod := cgrouptest.Child(t, e.mnt, e.base, "pod")
	c1 := cgrouptest.Child(t, e.mnt, pod, "c1")
	c2 := cgrouptest.Child(t, e.mnt, pod, "c2")
	mustState(t, e.resize(t, "c1", c1, pod, res{"cpu": "250m", "memory": "64Mi"}, res{"cpu": "500m", "memory": "128Mi"}), intent.Completed)
	mustState(t, e.resize(t, "c2", c2, pod, res{"cpu": "250m", "memory": "64Mi"}, res{"cpu": "1", "memory": "256Mi"}), intent.Completed)
	// 500m of requests: the kubelet's rule for pod cgroups gives 20 (runc's
	// container formula 59).
	for f, want := range map[string]string{"cpu.max": "150000 100000", "memory.max": "402653184", "cpu.weight": "20"} {
		if got := cgrouptest.ReadFile(t, e.mnt, pod, f); got != want {
			t.Errorf("pod %s = %s, want %s", f, got, want)
		}
	}
	mustState(t, e.resize(t, "c1", c1, pod, nil, res{"cpu": "2"}), intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, pod, "cpu.max"); got != "300000 100000" {
		t.Errorf("pod cpu.max after growing c1 = %s", got)
	}
	mustState(t, e.resize(t, "c1", c1, pod, nil, res{"memory": "100Mi"}), intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, pod, "memory.max"); got != "373293056" {
		t.Errorf("pod memory.max after shrinking c1 = %s", got)
	}
}
