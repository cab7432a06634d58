package integration_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// driftInterval is short so the tests are quick; the daemon's default is 10s.
const driftInterval = 500 * time.Millisecond

type driftEnv struct {
	*env
	a *agent.Agent
	m *metrics.Metrics
}

// setupDrift is an agent on the real hierarchy running its drift loop.
func setupDrift(t *testing.T, opts ...agent.Option) *driftEnv {
	t.Helper()
	mnt, base := cgrouptest.Real(t)
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := cg.Check(); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	srv := agenttest.ServeWith(t, cg, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30}, append([]agent.Option{agent.WithMetrics(m)}, opts...)...)
	runDrift(t, srv.Agent)
	return &driftEnv{&env{mnt, base, srv, api.NewClient(srv.Socket)}, srv.Agent, m}
}

func runDrift(t *testing.T, a *agent.Agent) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.RunDrift(ctx, driftInterval); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitFile polls a cgroup file until it holds want and returns how long
// that took.
func waitFile(t *testing.T, mnt, p, file, want string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := cgrouptest.ReadFile(t, mnt, p, file)
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s/%s = %q after %v, want %q", p, file, got, timeout, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func driftIntents(a *agent.Agent) []intent.Intent {
	var out []intent.Intent
	for _, it := range a.List(agent.Filter{}, "") {
		if strings.HasPrefix(it.ID, agent.DriftIntentPrefix) {
			out = append(out, it)
		}
	}
	return out
}

func containerInfo(t *testing.T, a *agent.Agent, name string) agent.ContainerInfo {
	t.Helper()
	for _, c := range a.Containers() {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return agent.ContainerInfo{}
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
	}
}

// TestDriftRestoreBareCgroup writes cpu.max and memory.max of a managed
// cgroup behind the agent's back: the agent finds each within its interval
// and writes its values back through an intent, which the kernel's files
// then hold, and counts it.
func TestDriftRestoreBareCgroup(t *testing.T) {
	e := setupDrift(t)
	p := cgrouptest.Child(t, e.mnt, e.base, "drift")
	holder := helper("RA_HELPER=alloc", "RA_MB=1", "RA_HOLD=1")
	cgrouptest.StartIn(t, e.mnt, p, holder)
	mustState(t, e.resize(t, "drift", p, "", res{"cpu": "250m", "memory": "32Mi"}, res{"cpu": "500m", "memory": "64Mi"}), intent.Completed)

	for _, step := range []struct{ file, theirs, ours, resource string }{
		{"cpu.max", "max 100000", "50000 100000", "cpu"},
		{"cpu.max", "90000 100000", "50000 100000", "cpu"},
		{"memory.max", "max", "67108864", "memory"},
	} {
		before := testutil.ToFloat64(e.m.Drift.WithLabelValues(step.resource, agent.DriftActionRestore))
		// Wait for the previous restore to be verified, so this is a new drift.
		waitFor(t, "drift cleared", 5*driftInterval, func() bool { return containerInfo(t, e.a, "drift").Drift == nil })
		cgrouptest.SetFile(t, e.mnt, p, step.file, step.theirs)
		took := waitFile(t, e.mnt, p, step.file, step.ours, 4*driftInterval+2*time.Second)
		t.Logf("%s written %q behind the agent's back: restored to %q in %v (interval %v)", step.file, step.theirs, step.ours, took, driftInterval)
		// One interval to notice, plus the apply; slack for the emulated VM.
		if took > 2*driftInterval+2*time.Second {
			t.Errorf("restore took %v, more than two intervals of %v (+2s)", took, driftInterval)
		}
		if got := testutil.ToFloat64(e.m.Drift.WithLabelValues(step.resource, agent.DriftActionRestore)); got != before+1 {
			t.Errorf("drift_total{%s,restore} = %v, want %v", step.resource, got, before+1)
		}
	}
	// The file holds the value once the write is done; the intent is
	// Completed after its read-back and journal record, a moment later.
	waitFor(t, "drift intents settled", 5*driftInterval, func() bool {
		for _, it := range driftIntents(e.a) {
			if !it.Status.State.Terminal() {
				return false
			}
		}
		return true
	})
	ds := driftIntents(e.a)
	if len(ds) != 3 {
		t.Fatalf("%d drift intents, want 3", len(ds))
	}
	for _, it := range ds {
		if it.Status.State != intent.Completed || it.Status.Via != "cgroup" {
			t.Errorf("drift intent %s: %s %s via %s: %s", it.ID, it.Status.State, it.Status.Reason, it.Status.Via, it.Status.Message)
		}
	}
	waitFor(t, "drift cleared", 5*driftInterval, func() bool { return containerInfo(t, e.a, "drift").Drift == nil })
	if got := testutil.ToFloat64(e.m.DriftedContainers); got != 0 {
		t.Errorf("drifted_containers = %v", got)
	}
}

// TestDriftReportBareCgroup: the report policy leaves the file as found and
// shows the drift in the container listing.
func TestDriftReportBareCgroup(t *testing.T) {
	e := setupDrift(t, agent.WithDriftPolicy(agent.DriftReport))
	p := cgrouptest.Child(t, e.mnt, e.base, "report")
	mustState(t, e.resize(t, "report", p, "", nil, res{"cpu": "500m"}), intent.Completed)
	cgrouptest.SetFile(t, e.mnt, p, "cpu.max", "max 100000")
	start := time.Now()
	waitFor(t, "drift reported", 4*driftInterval+2*time.Second, func() bool { return containerInfo(t, e.a, "report").Drift != nil })
	t.Logf("drift reported in %v", time.Since(start))
	d := containerInfo(t, e.a, "report").Drift
	if d.Action != agent.DriftActionReport || len(d.Files) != 1 || d.Files[0].Found != "max 100000" || d.Files[0].Expected != "50000 100000" {
		t.Errorf("drift: %+v", d)
	}
	time.Sleep(2 * driftInterval)
	if got := cgrouptest.ReadFile(t, e.mnt, p, "cpu.max"); got != "max 100000" {
		t.Errorf("report policy changed cpu.max to %q", got)
	}
	if got := testutil.ToFloat64(e.m.Drift.WithLabelValues("cpu", agent.DriftActionReport)); got != 1 {
		t.Errorf("drift_total{cpu,report} = %v, want 1", got)
	}
}

// TestDriftAdoptBareCgroup: the adopt policy takes a new CPU limit written
// to cpu.max as the container's, and refuses a memory.max below the
// declared memory request.
func TestDriftAdoptBareCgroup(t *testing.T) {
	e := setupDrift(t, agent.WithDriftPolicy(agent.DriftAdopt))
	p := cgrouptest.Child(t, e.mnt, e.base, "adopt")
	mustState(t, e.resize(t, "adopt", p, "", res{"cpu": "250m", "memory": "32Mi"}, res{"cpu": "500m", "memory": "64Mi"}), intent.Completed)

	cgrouptest.SetFile(t, e.mnt, p, "cpu.max", "150000 100000")
	start := time.Now()
	waitFor(t, "cpu limit adopted", 4*driftInterval+2*time.Second, func() bool {
		return containerInfo(t, e.a, "adopt").Resources.CPULimit == 1500
	})
	t.Logf("cpu.max 150000 100000 adopted in %v", time.Since(start))
	ds := driftIntents(e.a)
	if len(ds) != 1 || ds[0].Status.Reason != agent.ReasonDriftAdopted {
		t.Fatalf("adoption record: %+v", ds)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "cpu.max"); got != "150000 100000" {
		t.Errorf("cpu.max = %q after adoption", got)
	}
	if got := testutil.ToFloat64(e.m.Drift.WithLabelValues("cpu", agent.DriftActionAdopt)); got != 1 {
		t.Errorf("drift_total{cpu,adopt} = %v", got)
	}

	cgrouptest.SetFile(t, e.mnt, p, "memory.max", "16777216")
	waitFor(t, "memory drift refused", 4*driftInterval+2*time.Second, func() bool {
		d := containerInfo(t, e.a, "adopt").Drift
		return d != nil && d.Action == agent.DriftActionRefuse
	})
	c := containerInfo(t, e.a, "adopt")
	t.Logf("refused: %s", c.Drift.Message)
	if c.Resources.MemoryLimit != 64<<20 || !strings.Contains(c.Drift.Message, "memory request") {
		t.Errorf("after a refused adoption: %+v %s", c.Resources, c.Drift.Message)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.max"); got != "16777216" {
		t.Errorf("adopt policy wrote memory.max: %q", got)
	}
}

// TestDriftFightBackoff: a writer that keeps putting its value back gets
// three restores, then the agent backs off and reports, and restores once
// the writer has stopped and the backoff has passed.
func TestDriftFightBackoff(t *testing.T) {
	const window = 4 * time.Second
	e := setupDrift(t, agent.WithDriftBackoff(window, 3))
	p := cgrouptest.Child(t, e.mnt, e.base, "fight")
	mustState(t, e.resize(t, "fight", p, "", nil, res{"cpu": "500m"}), intent.Completed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			_ = os.WriteFile(e.mnt+p+"/cpu.max", []byte("max 100000"), 0)
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	waitFor(t, "backoff", window, func() bool {
		d := containerInfo(t, e.a, "fight").Drift
		return d != nil && d.Action == agent.DriftActionBackoff
	})
	time.Sleep(window / 2)
	close(stop)
	wg.Wait()
	d := containerInfo(t, e.a, "fight").Drift
	t.Logf("backoff: %s", d.Message)
	if n := len(driftIntents(e.a)); n != 3 {
		t.Errorf("%d restore intents during the fight, want 3", n)
	}
	if got := testutil.ToFloat64(e.m.Drift.WithLabelValues("cpu", agent.DriftActionBackoff)); got != 1 {
		t.Errorf("drift_total{cpu,backoff} = %v", got)
	}
	if d.BackoffUntil == nil {
		t.Fatal("no backoffUntil")
	}
	took := waitFile(t, e.mnt, p, "cpu.max", "50000 100000", time.Until(*d.BackoffUntil)+4*driftInterval+2*time.Second)
	t.Logf("restored %v after the writer stopped", took)
	if n := len(driftIntents(e.a)); n != 4 {
		t.Errorf("%d restore intents, want 4", n)
	}
}

// TestDriftRestoreCRIContainer: cpu.max of a containerd container written
// behind the agent's back is restored through CRI, so that containerd's
// record and the kernel's files both hold the agent's values, and the
// container is not restarted. Its pod has a sidecar the agent does not
// manage: the pod cgroup, which counts it, is no drift, and is restored to
// the sum when written.
func TestDriftRestoreCRIContainer(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	e := setupCRI(t, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30}, agent.WithMetrics(m))
	runDrift(t, e.a)
	mnt, cc := e.mnt, e.CRI

	p := e.runPod(t)
	ct := e.runContainer(t, p, "app", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 205},
		"/bin/busybox", "sleep", "3600")
	e.runContainer(t, p, "side", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 10000, CpuShares: 102},
		"/bin/busybox", "sleep", "3600")
	cg := e.cgroupOf(t, ct)
	podCg := cg[:strings.LastIndex(cg, "/")]
	mustState(t, e.resize(t, p, "app", res{"cpu": "200m"}, res{"cpu": "400m"}, nil), intent.Completed)
	if got := cgrouptest.ReadFile(t, mnt, podCg, "cpu.max"); got != "50000 100000" {
		t.Fatalf("pod cpu.max = %q, want app 400m + side 100m", got)
	}
	time.Sleep(3 * driftInterval)
	if ds := driftIntents(e.a); len(ds) != 0 {
		t.Fatalf("drift found with nothing written: %+v", containerInfo(t, e.a, "app").Drift)
	}

	cgrouptest.SetFile(t, mnt, podCg, "cpu.max", "max 100000")
	took := waitFile(t, mnt, podCg, "cpu.max", "50000 100000", 4*driftInterval+5*time.Second)
	t.Logf("pod cpu.max restored in %v", took)
	waitFor(t, "pod drift cleared", 10*time.Second, func() bool { return containerInfo(t, e.a, "app").Drift == nil })

	cgrouptest.SetFile(t, mnt, cg, "cpu.max", "max 100000")
	took = waitFile(t, mnt, cg, "cpu.max", "40000 100000", 4*driftInterval+5*time.Second)
	t.Logf("container cpu.max restored in %v", took)
	var d intent.Intent
	waitFor(t, "drift intent settled", 10*time.Second, func() bool {
		ds := driftIntents(e.a)
		if len(ds) == 2 {
			d = ds[1]
		}
		return len(ds) == 2 && d.Status.State.Terminal()
	})
	if d.Status.State != intent.Completed || d.Status.Via != "runtime" || d.Spec.Target.PodUID != p.UID {
		t.Errorf("drift intent: %s via %q target %+v: %s", d.Status.State, d.Status.Via, d.Spec.Target, d.Status.Message)
	}
	st, err := cc.Get(context.Background(), ct.ID)
	if err != nil || st.Resources.CPUQuota != 40000 {
		t.Errorf("containerd's record: quota %d (%v), want 40000", st.Resources.CPUQuota, err)
	}
	if got := testutil.ToFloat64(m.Drift.WithLabelValues("cpu", agent.DriftActionRestore)); got != 2 {
		t.Errorf("drift_total{cpu,restore} = %v", got)
	}
	e.sameContainer(t, ct)
}
