package e2eresize

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

func addMilli(v string, n int) string {
	q := resource.MustParse(v)
	q.Add(resource.MustParse(fmt.Sprintf("%dm", n)))
	return q.String()
}

func addMi(v string, n int) string {
	q := resource.MustParse(v)
	q.Add(resource.MustParse(fmt.Sprintf("%dMi", n)))
	return q.String()
}

func milli(v string) int64 {
	if v == "" {
		return 0
	}
	q := resource.MustParse(v)
	return q.MilliValue()
}

func bytes(v string) int64 {
	if v == "" {
		return 0
	}
	q := resource.MustParse(v)
	return q.Value()
}

// cpuRequest is the request the kubelet uses: the API server defaults a
// missing request to the limit.
func (r rr) cpuRequest() int64 {
	if r.cpuReq == "" {
		return milli(r.cpuLim)
	}
	return milli(r.cpuReq)
}

// kubeletCRI is what the kubelet sends the runtime for a container with r
// (calculateLinuxResources): shares, quota (0: no limit), period, memory
// limit (0: no limit).
func kubeletCRI(r rr) *runtimeapi.LinuxContainerResources {
	out := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: int64(cgroup.MilliCPUToShares(r.cpuRequest())), MemoryLimitInBytes: bytes(r.memLim)}
	if r.cpuLim != "" {
		out.CpuQuota = cgroup.MilliCPUToQuota(milli(r.cpuLim), 100000)
	}
	return out
}

// files are the cgroup files compared.
type files map[string]string

// containerFiles is what runc writes for the kubelet's CRI values.
func containerFiles(r rr) files {
	c := kubeletCRI(r)
	f := files{"cpu.weight": strconv.FormatUint(cgroup.SharesToWeight(uint64(c.CpuShares)), 10), "cpu.max": "max 100000", "memory.max": "max"}
	if c.CpuQuota > 0 {
		f["cpu.max"] = fmt.Sprintf("%d 100000", c.CpuQuota)
	}
	if c.MemoryLimitInBytes > 0 {
		f["memory.max"] = strconv.FormatInt(c.MemoryLimitInBytes, 10)
	}
	return f
}

// podFiles is what the kubelet writes to the pod cgroup
// (ResourceConfigForPod, cgroup_manager_linux.go getCPUWeight), worked out
// here from the formulas themselves.
func podFiles(rs []rr) files {
	var req, lim, mem int64
	cpuLimited, memLimited := true, true
	for _, r := range rs {
		req += r.cpuRequest()
		lim += milli(r.cpuLim)
		mem += bytes(r.memLim)
		cpuLimited = cpuLimited && r.cpuLim != ""
		memLimited = memLimited && r.memLim != ""
	}
	shares := req * 1024 / 1000
	shares = max(min(shares, 262144), 2)
	f := files{"cpu.weight": strconv.FormatInt(1+(shares-2)*9999/262142, 10), "cpu.max": "max 100000", "memory.max": "max"}
	if cpuLimited {
		f["cpu.max"] = fmt.Sprintf("%d 100000", max(lim*100, 1000))
	}
	if memLimited {
		f["memory.max"] = strconv.FormatInt(mem/4096*4096, 10)
	}
	return f
}

func qosParent(rs []rr) string {
	guaranteed, best := true, true
	for _, r := range rs {
		if r != (rr{}) {
			best = false
		}
		if r.cpuLim == "" || r.memLim == "" || r.cpuRequest() != milli(r.cpuLim) || (r.memReq != "" && bytes(r.memReq) != bytes(r.memLim)) {
			guaranteed = false
		}
	}
	switch {
	case best:
		return "besteffort/"
	case guaranteed:
		return ""
	}
	return "burstable/"
}

// tally counts what the suite compared.
type tally struct {
	mu                          sync.Mutex
	cases, values, mismatches   int
	restarts, restartMismatches int
	refusals, refusalMismatches int
	records, recordMismatches   int
	detail                      []string
}

func (tl *tally) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return fmt.Sprintf("%d cases, %d values compared, %d mismatches; restart counts %d compared, %d mismatches; containerd records %d compared, %d mismatches; refusals %d, %d mismatches",
		tl.cases, tl.values, tl.mismatches, tl.restarts, tl.restartMismatches, tl.records, tl.recordMismatches, tl.refusals, tl.refusalMismatches)
}

func (tl *tally) compare(t *testing.T, what, got, want string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.values++
	if got != want {
		tl.mismatches++
		tl.detail = append(tl.detail, fmt.Sprintf("%s: %q, want %q", what, got, want))
		t.Errorf("%s = %q, want %q (a kubelet-driven node)", what, got, want)
	}
}

type env struct {
	*ctrtest.Runtime
	mnt, base string
	qos       map[string]string // qosParent's answer to the QoS cgroup
	c         *api.Client
}

// TestKubeletE2EResizeCases runs every case: the pod is created as the
// kubelet creates it (pod cgroup values, CRI resources), each container's
// current spec is declared to the agent (what an intake does on first
// sight: no restart), then the resize, then its rollback, all containers
// of the pod at once; after each step the files, restart counts and
// containerd's record are compared with a kubelet-driven node's.
func TestKubeletE2EResizeCases(t *testing.T) {
	mnt, base := cgrouptest.Real(t)
	// Under TCG on a loaded host a sandbox has taken over a minute to
	// start: allow what the kubelet allows.
	ctrtest.CallTimeout = 4 * time.Minute
	rt := ctrtest.Dial(t)
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	opts := []agent.Option{agent.WithRuntime(rt.CRI)}
	if os.Getenv("E2E_RESIZE_AGENT_LOG") == "1" {
		opts = append(opts, agent.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	}
	srv := agenttest.ServeWith(t, cg, admission.Capacity{MilliCPU: 64000, Memory: 64 << 30}, opts...)
	e := &env{Runtime: rt, mnt: mnt, base: base, c: api.NewClient(srv.Socket)}
	var only *regexp.Regexp
	if re := os.Getenv("E2E_RESIZE_CASES"); re != "" {
		var err error
		if only, err = regexp.Compile(re); err != nil {
			t.Fatalf("E2E_RESIZE_CASES: %v", err)
		}
	}
	tl := &tally{}
	// The kubelet's QoS cgroups (cgroupfs driver): guaranteed pods under
	// kubepods, the others under kubepods/burstable and .../besteffort.
	kubepods := cgrouptest.Child(t, mnt, base, "kubepods")
	e.qos = map[string]string{"": kubepods}
	for _, q := range []string{"burstable", "besteffort"} {
		e.qos[q+"/"] = cgrouptest.Child(t, mnt, kubepods, q)
	}
	// Cases run side by side: on a slow node most of a case's time is
	// runc init waiting out the few milliseconds per period that the
	// e2e's 15m-39m CPU limits allow, not CPU the node lacks.
	workers := 4
	if v := os.Getenv("E2E_RESIZE_PARALLEL"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 32 {
			t.Fatalf("E2E_RESIZE_PARALLEL=%q: want a number from 1 to 32", v)
		}
		workers = n
	}
	deadline, hasDeadline := t.Deadline()
	var notRun atomic.Int64
	queue := make(chan resizeCase)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tc := range queue {
				// Under TCG a case can take minutes: stop in time to
				// report what was compared, and fail for the cases
				// not run.
				if hasDeadline && time.Until(deadline) < 6*time.Minute {
					notRun.Add(1)
					continue
				}
				t0 := time.Now()
				t.Run(tc.name, func(t *testing.T) { e.run(t, tc, tl) })
				t.Logf("%s: %.1fs (guest uptime %s); so far %s", tc.name, time.Since(t0).Seconds(), uptime(), tl)
			}
		}()
	}
	for _, tc := range cases() {
		if selected(tc.name, only) {
			queue <- tc
		}
	}
	close(queue)
	wg.Wait()
	if n := notRun.Load(); n > 0 {
		t.Errorf("%d case(s) not run before the test binary's deadline (slow VM); run with a longer -test.timeout", n)
	}
	t.Logf("kubelet e2e resize cases: %s", tl)
	for _, d := range tl.detail {
		t.Log("mismatch: " + d)
	}
	if out := os.Getenv("E2E_RESIZE_REPORT"); out != "" {
		_ = os.WriteFile(out, []byte(strings.Join(tl.detail, "\n")), 0o644)
	}
}

func (e *env) run(t *testing.T, tc resizeCase, tl *tally) {
	tl.mu.Lock()
	tl.cases++
	tl.mu.Unlock()
	var from, to []rr
	for _, c := range tc.ctrs {
		from, to = append(from, c.from), append(to, c.to)
	}
	var podPath string
	t0 := time.Now()
	p := e.RunPod(t, func(uid string) string {
		podPath = cgrouptest.Child(t, e.mnt, e.qos[qosParent(from)], "pod"+uid)
		return podPath
	})
	// The pod ends as the kubelet makes it, but its CPU limits come
	// after runc has started its processes: under TCG runc init needs
	// about a second of CPU, a minute under a 20m limit. The kubelet
	// writes the pod cgroup first and creates the containers with their
	// resources; here they are created without a CPU quota and given
	// their resources through the runtime (UpdateContainerResources, as
	// the kubelet resizes), which leaves the same cgroup files and the
	// same record in containerd.
	ids := map[string]cri.Container{}
	for _, c := range tc.ctrs {
		res, create := kubeletCRI(c.from), kubeletCRI(c.from)
		create.CpuQuota = 0
		// A shell that exits on SIGTERM: busybox sleep as PID 1 ignores
		// it, and each restart would wait out the stop timeout.
		ct := e.RunContainer(t, p, c.name, create, "/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait")
		ctx, cancel := context.WithTimeout(context.Background(), ctrtest.CallTimeout)
		_, err := e.RT.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ct.ID, Linux: res})
		cancel()
		if err != nil {
			t.Fatalf("UpdateContainerResources %s: %v", c.name, err)
		}
		ids[c.name] = ct
	}
	for f, v := range podFiles(from) {
		cgrouptest.SetFile(t, e.mnt, podPath, f, v)
	}
	t.Logf("pod and %d container(s) started in %.1fs", len(tc.ctrs), time.Since(t0).Seconds())
	// A refusal is tried twice: as the agent's first sight of the
	// container (judged from what the runtime reports), then once its
	// spec is declared (judged as the API server judges it, knowing the
	// spec).
	if tc.refuse != "" && !tc.needsSpec {
		e.refused(t, tl, p, podPath, tc, "first sight", from, ids)
	}
	// The intake's first sight: every container's current spec declared.
	e.step(t, tl, p, podPath, tc, "declare", from, from, ids, false)
	if tc.refuse != "" {
		e.refused(t, tl, p, podPath, tc, "declared", from, ids)
		return
	}
	e.step(t, tl, p, podPath, tc, "resize", from, to, ids, true)
	if !tc.noRollback {
		e.step(t, tl, p, podPath, tc, "rollback", to, from, ids, true)
	}
}

// spec is the intent for container c going from a to b: every value b
// has, and 0 for a value a had that b has not (a removal).
func spec(uid string, c ctr, a, b rr) intent.Spec {
	s := intent.Spec{Target: intent.Target{Name: c.name, PodUID: uid}}
	req, lim := corev1.ResourceList{}, corev1.ResourceList{}
	set := func(l corev1.ResourceList, name corev1.ResourceName, before, after string) {
		switch {
		case after != "":
			l[name] = resource.MustParse(after)
		case before != "":
			l[name] = resource.MustParse("0")
		}
	}
	set(req, corev1.ResourceCPU, a.cpuReq, b.cpuReq)
	set(lim, corev1.ResourceCPU, a.cpuLim, b.cpuLim)
	set(req, corev1.ResourceMemory, a.memReq, b.memReq)
	set(lim, corev1.ResourceMemory, a.memLim, b.memLim)
	s.Resources.Requests, s.Resources.Limits = req, lim
	for _, pr := range []struct {
		name corev1.ResourceName
		pol  corev1.ResourceResizeRestartPolicy
	}{{corev1.ResourceCPU, c.cpuPol}, {corev1.ResourceMemory, c.memPol}} {
		if pr.pol != "" {
			s.ResizePolicy = append(s.ResizePolicy, corev1.ContainerResizePolicy{ResourceName: pr.name, RestartPolicy: pr.pol})
		}
	}
	return s
}

// step submits every container's intent at once and compares the result.
func (e *env) step(t *testing.T, tl *tally, p ctrtest.Pod, podPath string, tc resizeCase, name string, before, after []rr, ids map[string]cri.Container, judge bool) {
	t.Helper()
	t0 := time.Now()
	defer func() { t.Logf("%s: %.1fs", name, time.Since(t0).Seconds()) }()
	var wg sync.WaitGroup
	results := make([]intent.Intent, len(tc.ctrs))
	for i, c := range tc.ctrs {
		s := spec(p.UID, c, before[i], after[i])
		if len(s.Resources.Requests)+len(s.Resources.Limits) == 0 {
			continue // a BestEffort container declares nothing
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			it, _, err := e.c.Submit(ctx, s)
			if err == nil {
				it, err = e.c.WaitSettled(ctx, it.ID)
			}
			if err != nil {
				t.Errorf("%s %s: %v", name, c.name, err)
				return
			}
			results[i] = it
		}()
	}
	wg.Wait()
	for i, c := range tc.ctrs {
		it := results[i]
		if it.ID != "" && it.Status.State != intent.Completed {
			t.Errorf("%s %s: %s/%s %s", name, c.name, it.Status.State, it.Status.Reason, it.Status.Message)
		}
		// The e2e's rule: a restart when a resource whose policy is
		// RestartContainer changes in the spec (none when declaring).
		want := 0
		if judge && ((c.cpuPol == corev1.RestartContainer && (before[i].cpuReq != after[i].cpuReq || before[i].cpuLim != after[i].cpuLim)) ||
			(c.memPol == corev1.RestartContainer && (before[i].memReq != after[i].memReq || before[i].memLim != after[i].memLim))) {
			want = 1
		}
		got := 0
		if it.Status.Restarted {
			got = 1
			ct, err := e.CRI.Get(context.Background(), it.Status.ContainerID)
			if err != nil || !ct.Running() {
				t.Errorf("%s %s: restarted container %s not running: %v", name, c.name, it.Status.ContainerID, err)
			} else {
				ids[c.name] = ct
			}
		}
		tl.mu.Lock()
		tl.restarts++
		if got != want {
			tl.restartMismatches++
			tl.detail = append(tl.detail, fmt.Sprintf("%s/%s %s: %d restart(s), want %d", tc.name, name, c.name, got, want))
			t.Errorf("%s %s: %d restart(s), the e2e expects %d", name, c.name, got, want)
		}
		tl.mu.Unlock()
		ct := ids[c.name]
		path, err := cgroup.New(cgroup.WithMountpoint(e.mnt)).PathOf(ct.PID)
		if err != nil {
			t.Errorf("%s %s: %v", name, c.name, err)
			continue
		}
		for f, v := range containerFiles(after[i]) {
			tl.compare(t, fmt.Sprintf("%s/%s %s %s", tc.name, name, c.name, f), cgrouptest.ReadFile(t, e.mnt, path, f), v)
		}
		e.record(t, tl, fmt.Sprintf("%s/%s %s", tc.name, name, c.name), ct.ID, after[i])
	}
	for f, v := range podFiles(after) {
		tl.compare(t, fmt.Sprintf("%s/%s pod %s", tc.name, name, f), cgrouptest.ReadFile(t, e.mnt, podPath, f), v)
	}
}

// record compares containerd's record of a container with the kubelet's.
func (e *env) record(t *testing.T, tl *tally, what, id string, r rr) {
	ct, err := e.CRI.Get(context.Background(), id)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	k := kubeletCRI(r)
	want := cri.Resources{CPUPeriod: k.CpuPeriod, CPUQuota: k.CpuQuota, CPUShares: k.CpuShares, MemoryLimit: k.MemoryLimitInBytes}
	tl.mu.Lock()
	tl.records++
	if ct.Resources != want {
		tl.recordMismatches++
		tl.detail = append(tl.detail, fmt.Sprintf("%s containerd record %+v, want %+v", what, ct.Resources, want))
		t.Errorf("%s: containerd's record %+v, a kubelet-driven node's %+v", what, ct.Resources, want)
	}
	tl.mu.Unlock()
}

// refused submits the refused change and checks that nothing changed.
func (e *env) refused(t *testing.T, tl *tally, p ctrtest.Pod, podPath string, tc resizeCase, when string, from []rr, ids map[string]cri.Container) {
	c := tc.ctrs[0]
	tc.name += " (" + when + ")"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	it, _, err := e.c.Submit(ctx, spec(p.UID, c, c.from, c.to))
	if err == nil && !it.Status.State.Terminal() {
		it, err = e.c.WaitSettled(ctx, it.ID)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	} else if it.Status.State != intent.Completed {
		msg = it.Status.Message
	}
	tl.mu.Lock()
	tl.refusals++
	if !strings.Contains(msg, tc.refuse) {
		tl.refusalMismatches++
		tl.detail = append(tl.detail, fmt.Sprintf("%s: %q, want a refusal saying %q", tc.name, msg, tc.refuse))
		t.Errorf("%s: got %q (state %s), want a refusal saying %q", tc.name, msg, it.Status.State, tc.refuse)
	}
	tl.mu.Unlock()
	ct := ids[c.name]
	path, err := cgroup.New(cgroup.WithMountpoint(e.mnt)).PathOf(ct.PID)
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range containerFiles(c.from) {
		tl.compare(t, tc.name+" "+c.name+" "+f+" unchanged", cgrouptest.ReadFile(t, e.mnt, path, f), v)
	}
	for f, v := range podFiles(from) {
		tl.compare(t, tc.name+" pod "+f+" unchanged", cgrouptest.ReadFile(t, e.mnt, podPath, f), v)
	}
	e.record(t, tl, tc.name+" "+c.name, ct.ID, c.from)
}

// uptime is the guest's, to line the test's log up with the console.
func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0] + "s"
}

// selected keeps the VM run within its time under TCG: every entry of each
// table with no restart and with both restarts, the memory-restart entries
// on requests, and every multi-container, extended and refusal case.
// E2E_RESIZE_ALL=1 runs all; E2E_RESIZE_CASES (a regexp) only the cases
// whose name matches, for re-running a few.
func selected(name string, only *regexp.Regexp) bool {
	if only != nil {
		return only.MatchString(name)
	}
	if os.Getenv("E2E_RESIZE_ALL") == "1" {
		return true
	}
	switch {
	case strings.HasPrefix(name, "guaranteed/cpu restart/"), strings.HasPrefix(name, "guaranteed/mem restart/"),
		strings.HasPrefix(name, "burstable/cpu restart/"), strings.HasPrefix(name, "burstable/cpu & mem restart/"):
		return false
	case strings.HasPrefix(name, "burstable/mem restart/"):
		return strings.HasSuffix(name, "/mem requests") || strings.HasSuffix(name, "/cpu requests")
	}
	return true
}
