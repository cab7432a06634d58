package faults_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

var node = admission.Capacity{MilliCPU: 1000, Memory: 1 << 30}

// The runtime's socket goes away (containerd killed) while an intent is in
// flight and before others, and comes back. The intent in flight fails
// RuntimeUnavailable with its steps undone (the runtime's record and the
// cgroup must not disagree); submissions that need the runtime are refused
// with 503 RuntimeUnavailable while it is away; bare cgroups are served
// throughout; once containerd is back, new intents complete through it
// without restarting the agent.
func TestContainerdGoesAwayAndComesBack(t *testing.T) {
	e := setup(t, node, true)
	ensureContainerd(t)
	p := e.runPod(t)
	ct := e.runContainer(t, p, "app")
	bare, _ := e.bare(t, "bare")

	first := e.settled(t, e.submit(t, podSpec(p, "app", res{"cpu": "100m"}, res{"cpu": "500m"})).ID)
	expect(t, first, intent.Completed, intent.ReasonApplied)
	app, _ := e.managed(t, "app")

	// In flight: containerd dies between admission and the runtime update.
	killed := make(chan struct{})
	e.rt.setBefore(onceHook(func() { killContainerd(t); close(killed) }))
	mid := e.settled(t, e.submit(t, podSpec(p, "app", res{"cpu": "100m"}, res{"cpu": "700m"})).ID)
	<-killed
	e.rt.setBefore(nil)
	if t.Failed() {
		t.FailNow()
	}
	expect(t, mid, intent.Failed, intent.ReasonRuntimeUnavailable, "unavailable")
	if got := cgrouptest.ReadFile(t, e.mnt, app.CgroupPath, "cpu.max"); got != "50000 100000" {
		t.Errorf("after the failed intent cpu.max = %q, want the last completed 50000 100000", got)
	}
	e.healthy(t)

	// Before: the runtime is away when the intent comes.
	for _, s := range []struct {
		name string
		spec intent.Spec
	}{
		{"by pod UID", podSpec(p, "app", nil, res{"cpu": "800m"})},
		{"by container ID", func() intent.Spec {
			s := podSpec(p, "app", nil, res{"cpu": "800m"})
			s.Target.PodUID, s.Target.ContainerID = "", ct.ID
			return s
		}()},
	} {
		t0 := time.Now()
		_, _, err := e.c.Submit(ctx(t, 60*time.Second), s.spec)
		code, reason := statusCode(err)
		if code != http.StatusServiceUnavailable || reason != "RuntimeUnavailable" {
			t.Fatalf("submit %s with containerd down: %v, want 503 RuntimeUnavailable", s.name, err)
		}
		t.Logf("submit %s with containerd down: refused after %v: %v", s.name, time.Since(t0).Round(time.Millisecond), err)
	}
	b := e.settled(t, e.submit(t, bareSpec("bare", bare, res{"cpu": "200m"}, nil)).ID)
	expect(t, b, intent.Completed, intent.ReasonApplied)
	e.healthy(t)

	// Back: new intents go through the runtime again, same agent.
	startContainerd(t)
	t0 := time.Now()
	var back intent.Intent
	for {
		it, _, err := e.c.Submit(ctx(t, 60*time.Second), podSpec(p, "app", res{"cpu": "100m"}, res{"cpu": "900m"}))
		if err == nil {
			back = e.settled(t, it.ID)
			break
		}
		if code, _ := statusCode(err); code != http.StatusServiceUnavailable || time.Since(t0) > 30*time.Second {
			t.Fatalf("submit after containerd came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("agent reaches containerd again %v after it answers", time.Since(t0).Round(time.Millisecond))
	// cri.Dial redials at most a second apart.
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("the agent took %v to reach containerd again after it came back", d)
	}
	expect(t, back, intent.Completed, intent.ReasonApplied)
	if back.Status.Via != "runtime" {
		t.Errorf("via %q, want runtime", back.Status.Via)
	}
	now, err := e.rt.cc.Get(ctx(t, 10*time.Second), ct.ID)
	if err != nil {
		t.Fatal(err)
	}
	if now.Resources.CPUQuota != 90000 {
		t.Errorf("containerd's record: cpu quota %d, want 90000", now.Resources.CPUQuota)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, app.CgroupPath, "cpu.max"); got != "90000 100000" {
		t.Errorf("cpu.max = %q", got)
	}
	e.healthy(t)
}

// gate holds a hooked write until opened; it opens when the test ends, so
// that a failed test does not leave the agent's worker waiting.
type gateT struct {
	ch   chan struct{}
	once sync.Once
}

func gate(t *testing.T) *gateT {
	g := &gateT{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gateT) open() { g.once.Do(func() { close(g.ch) }) }
func (g *gateT) wait() { <-g.ch }

func onceHook(f func()) func(string) {
	o := once(f)
	return func(string) { o() }
}

// A container exits (its process killed; the runtime removes its cgroup)
// while one resize is in flight and two more are queued behind it (the
// second superseding the first). The one in flight and the one queued fail
// ContainerGone, the superseded one stays Superseded, and once the agent
// resyncs, the container is forgotten and what it held is released.
func TestContainerExitsMidResize(t *testing.T) {
	e := setup(t, node, true)
	p := e.runPod(t)
	ct := e.runContainer(t, p, "app")
	first := e.settled(t, e.submit(t, podSpec(p, "app", res{"cpu": "200m", "memory": "64Mi"}, res{"cpu": "500m", "memory": "256Mi"})).ID)
	expect(t, first, intent.Completed, intent.ReasonApplied)
	info, _ := e.managed(t, "app")
	if info.Allocated.MilliCPU != 200 {
		t.Fatalf("allocated %+v", info.Allocated)
	}

	inFlight, release := make(chan struct{}), gate(t)
	e.rt.setBefore(onceHook(func() { close(inFlight); release.wait() }))
	running := e.submit(t, podSpec(p, "app", res{"cpu": "300m"}, res{"cpu": "600m"}))
	<-inFlight
	e.rt.setBefore(nil)
	queued := e.submit(t, podSpec(p, "app", res{"cpu": "400m"}, nil))
	latest := e.submit(t, podSpec(p, "app", res{"cpu": "450m"}, nil))

	if err := syscall.Kill(ct.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := waitGone(t, e.mnt, info.CgroupPath, 30*time.Second)
	st, err := e.rt.cc.Get(ctx(t, 10*time.Second), ct.ID)
	t.Logf("container killed; state %s (err %v); cgroup gone after %v", st.State, err, gone)
	release.open()

	expect(t, e.settled(t, running.ID), intent.Failed, intent.ReasonContainerGone)
	expect(t, e.settled(t, queued.ID), intent.Superseded, intent.ReasonSuperseded)
	expect(t, e.settled(t, latest.ID), intent.Failed, intent.ReasonContainerGone)
	e.healthy(t)
	// The daemon resyncs every --resync-interval (its exit watcher, when
	// on, acts sooner); either way the container is forgotten.
	e.srv.Agent.Resync()
	if c, ok := e.managed(t, "app"); ok {
		t.Errorf("the gone container is still managed, holding %+v", c.Allocated)
	}
	if n, _ := e.c.Node(ctx(t, 10*time.Second)); n.Allocated != (admission.Capacity{}) {
		t.Errorf("capacity not released: %+v", n.Allocated)
	}
	_, _, err = e.c.Submit(ctx(t, 30*time.Second), podSpec(p, "app", res{"cpu": "100m"}, nil))
	if code, _ := statusCode(err); code != http.StatusNotFound {
		t.Errorf("submit for the exited container: %v, want 404", err)
	}
}

// waitGone waits for a cgroup directory to be removed.
func waitGone(t *testing.T, mnt, p string, d time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for {
		if _, err := os.Stat(filepath.Join(mnt, p)); os.IsNotExist(err) {
			return time.Since(t0).Round(time.Millisecond)
		}
		if time.Since(t0) > d {
			t.Fatalf("cgroup %s still there %v after its process was killed", p, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A bare cgroup is removed under the agent (its process exits, then rmdir):
// a Deferred intent for it fails ContainerGone on Resync, which releases
// its capacity so that another Deferred intent goes ahead; an intent in
// flight and one queued behind it fail ContainerGone.
func TestCgroupRemovedUnderTheAgent(t *testing.T) {
	e := setup(t, node, false)
	x, xcmd := e.bare(t, "x")
	y, _ := e.bare(t, "y")
	z, _ := e.bare(t, "z")
	w, wcmd := e.bare(t, "w")

	expect(t, e.settled(t, e.submit(t, bareSpec("y", y, res{"cpu": "300m"}, nil)).ID), intent.Completed, intent.ReasonApplied)
	expect(t, e.settled(t, e.submit(t, bareSpec("x", x, res{"cpu": "600m"}, nil)).ID), intent.Completed, intent.ReasonApplied)
	xd := e.settled(t, e.submit(t, bareSpec("x", x, res{"cpu": "900m"}, nil)).ID)
	expect(t, xd, intent.Deferred, intent.ReasonDeferred)
	zd := e.settled(t, e.submit(t, bareSpec("z", z, res{"cpu": "500m"}, nil)).ID)
	expect(t, zd, intent.Deferred, intent.ReasonDeferred)

	e.removeCgroup(t, x, xcmd)
	e.srv.Agent.Resync()
	expect(t, e.settled(t, xd.ID), intent.Failed, intent.ReasonContainerGone, "no longer exists")
	zc := e.settled(t, zd.ID)
	expect(t, zc, intent.Completed, intent.ReasonApplied)
	if got, want := cgrouptest.ReadFile(t, e.mnt, z, "cpu.weight"), strconv.FormatUint(cgroup.MilliCPUToWeight(500), 10); got != want {
		t.Errorf("z cpu.weight = %s, want %s", got, want)
	}
	if _, ok := e.managed(t, "x"); ok {
		t.Error("x still managed after Resync")
	}
	if n, _ := e.c.Node(ctx(t, 10*time.Second)); n.Allocated.MilliCPU != 800 {
		t.Errorf("allocated %+v, want 800m (y 300m + z 500m)", n.Allocated)
	}
	e.healthy(t)

	// In flight: the cgroup goes while the agent is about to write it.
	expect(t, e.settled(t, e.submit(t, bareSpec("w", w, res{"cpu": "100m"}, nil)).ID), intent.Completed, intent.ReasonApplied)
	inFlight, release := make(chan struct{}), gate(t)
	hold := once(func() { close(inFlight); release.wait() })
	e.cg.setBefore(func(p string, _ cgroup.Resources) {
		if p == w {
			hold()
		}
	})
	running := e.submit(t, bareSpec("w", w, res{"cpu": "150m"}, nil))
	<-inFlight
	queued := e.submit(t, bareSpec("w", w, res{"cpu": "200m"}, nil))
	e.removeCgroup(t, w, wcmd)
	release.open()
	expect(t, e.settled(t, running.ID), intent.Failed, intent.ReasonContainerGone)
	expect(t, e.settled(t, queued.ID), intent.Failed, intent.ReasonContainerGone)
	e.srv.Agent.Resync()
	if _, ok := e.managed(t, "w"); ok {
		t.Error("w still managed after Resync")
	}
	if n, _ := e.c.Node(ctx(t, 10*time.Second)); n.Allocated.MilliCPU != 800 {
		t.Errorf("allocated %+v, want 800m once w is gone", n.Allocated)
	}
	e.healthy(t)
}

// The kernel refuses a write: a cpu.max quota below the cgroup's
// cpu.max.burst is EINVAL (kernel/sched/core.c tg_set_cfs_bandwidth), which
// is what an operator's burst setting on a pod cgroup leads to. The
// container's cpu step, written first because its limit shrinks, is undone;
// the intent fails CgroupWriteFailed naming the errno; the agent goes on,
// and the next intents for the same container complete.
func TestKernelRefusesWrite(t *testing.T) {
	e := setup(t, node, false)
	pod := cgrouptest.Child(t, e.mnt, e.base, "pod")
	c := cgrouptest.Child(t, e.mnt, pod, "c")
	cgrouptest.StartIn(t, e.mnt, c, exec.Command("sleep", "3600"))
	burst := filepath.Join(e.mnt, pod, "cpu.max.burst")
	if err := os.WriteFile(burst, []byte("800000"), 0); err != nil {
		t.Fatalf("set cpu.max.burst: %v", err)
	}
	files := func(p string) map[string]string {
		out := map[string]string{}
		for _, f := range []string{"cpu.max", "cpu.weight", "memory.max"} {
			out[f] = cgrouptest.ReadFile(t, e.mnt, p, f)
		}
		return out
	}
	podBefore, cBefore := files(pod), files(c)

	s := bareSpec("c", c, res{"cpu": "200m", "memory": "64Mi"}, res{"cpu": "500m", "memory": "128Mi"})
	s.Target.PodCgroupPath = pod
	bad := e.settled(t, e.submit(t, s).ID)
	expect(t, bad, intent.Failed, intent.ReasonWriteFailed, "invalid argument", "cpu.max", "undone")
	for p, before := range map[string]map[string]string{pod: podBefore, c: cBefore} {
		for f, v := range files(p) {
			if v != before[f] {
				t.Errorf("%s/%s = %q after the refused intent, was %q", p, f, v, before[f])
			}
		}
	}
	e.healthy(t)

	// The agent keeps serving the same container: without a CPU limit the
	// pod's cpu.max stays max, which the burst allows.
	s2 := bareSpec("c", c, res{"cpu": "300m"}, nil)
	s2.Target.PodCgroupPath = pod
	expect(t, e.settled(t, e.submit(t, s2).ID), intent.Completed, intent.ReasonApplied)
	// And once the operator drops the burst, the refused resize goes through.
	if err := os.WriteFile(burst, []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	expect(t, e.settled(t, e.submit(t, s).ID), intent.Completed, intent.ReasonApplied)
	if got := cgrouptest.ReadFile(t, e.mnt, pod, "cpu.max"); got != "50000 100000" {
		t.Errorf("pod cpu.max = %q", got)
	}
	e.healthy(t)
}

// containerd hangs (SIGSTOP) instead of going away: the agent must not
// hang with it. An update in flight fails RuntimeUnavailable when the CRI
// call times out (criTimeout), a submission that needs the runtime
// is refused 503 after the same time, and meanwhile the API answers and
// bare cgroups are served. Once containerd resumes, the next intent
// completes through it.
func TestContainerdHangs(t *testing.T) {
	e := setup(t, node, true)
	ensureContainerd(t)
	p := e.runPod(t)
	e.runContainer(t, p, "app")
	bare, _ := e.bare(t, "bare")
	expect(t, e.settled(t, e.submit(t, podSpec(p, "app", res{"cpu": "100m"}, res{"cpu": "500m"})).ID), intent.Completed, intent.ReasonApplied)
	app, _ := e.managed(t, "app")

	pid := containerdPIDOf(t)
	resume := once(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	t.Cleanup(resume)
	stopped := make(chan struct{})
	e.rt.setBefore(onceHook(func() { _ = syscall.Kill(pid, syscall.SIGSTOP); close(stopped) }))
	t0 := time.Now()
	mid := e.submit(t, podSpec(p, "app", res{"cpu": "100m"}, res{"cpu": "700m"}))
	<-stopped
	e.rt.setBefore(nil)

	refused := make(chan error, 1)
	go func() {
		_, _, err := e.c.Submit(ctx(t, 60*time.Second), podSpec(p, "app", nil, res{"cpu": "800m"}))
		refused <- err
	}()
	// The agent serves while the runtime hangs.
	t1 := time.Now()
	expect(t, e.settled(t, e.submit(t, bareSpec("bare", bare, res{"cpu": "200m"}, nil)).ID), intent.Completed, intent.ReasonApplied)
	if _, err := e.c.Node(ctx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.List(ctx(t, 5*time.Second), "", ""); err != nil {
		t.Fatal(err)
	}
	t.Logf("with containerd stopped: a bare-cgroup intent, node and list answered in %v", time.Since(t1).Round(time.Millisecond))

	got := e.settled(t, mid.ID)
	t.Logf("intent in flight settled after %v", time.Since(t0).Round(time.Millisecond))
	expect(t, got, intent.Failed, intent.ReasonRuntimeUnavailable)
	err := <-refused
	if code, reason := statusCode(err); code != http.StatusServiceUnavailable || reason != "RuntimeUnavailable" {
		t.Errorf("submit with containerd hung: %v, want 503 RuntimeUnavailable", err)
	}
	t.Logf("submit with containerd hung refused after %v: %v", time.Since(t1).Round(time.Millisecond), err)
	e.healthy(t)

	resume()
	time.Sleep(time.Second)
	// What the stopped containerd did with the update the agent gave up
	// on, once it runs again.
	st, gerr := e.rt.cc.Get(ctx(t, 10*time.Second), app.ContainerID)
	t.Logf("after SIGCONT: cgroup cpu.max %q, containerd's record quota %d (err %v); the agent holds the last Completed (50000)",
		cgrouptest.ReadFile(t, e.mnt, app.CgroupPath, "cpu.max"), st.Resources.CPUQuota, gerr)

	var back intent.Intent
	for t2 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		it, _, err := e.c.Submit(ctx(t, 60*time.Second), podSpec(p, "app", res{"cpu": "100m"}, res{"cpu": "900m"}))
		if err == nil {
			back = e.settled(t, it.ID)
			break
		}
		if code, _ := statusCode(err); code != http.StatusServiceUnavailable || time.Since(t2) > 30*time.Second {
			t.Fatalf("submit after containerd resumed: %v", err)
		}
	}
	expect(t, back, intent.Completed, intent.ReasonApplied)
	if v := cgrouptest.ReadFile(t, e.mnt, app.CgroupPath, "cpu.max"); v != "90000 100000" {
		t.Errorf("cpu.max = %q after the intent once containerd resumed", v)
	}
	e.healthy(t)
}
