// Package systemd_test runs the agent against containerd + runc with the
// systemd cgroup driver, on a host whose PID 1 is systemd (the VM harness's
// --systemd mode, see test/run-vm-tests.sh): containers are scopes in the
// kubelet's pod slices, and the agent's writes to them must be unit
// properties that a `systemctl daemon-reload` keeps.
package systemd_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
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

// RequireEnv, set to 1 where systemd must be PID 1 (the --systemd VM),
// turns the skip of these tests into a failure.
const RequireEnv = "RESIZE_AGENT_REQUIRE_SYSTEMD"

const mnt = cgroup.DefaultMountpoint

type env struct {
	*ctrtest.Runtime
	cg *cgroup.Manager
	c  *api.Client
}

func need(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("required here ("+RequireEnv+"=1): "+format, args...)
	}
	t.Skipf("needs systemd as PID 1 with containerd's systemd cgroup driver (test/run-vm-tests.sh): "+format, args...)
}

func setup(t *testing.T) *env {
	t.Helper()
	_, err := os.Stat("/run/systemd/system")
	need(t, err == nil, "systemd is not running: %v", err)
	_, err = exec.LookPath("systemctl")
	need(t, err == nil, "no systemctl: %v", err)
	cg := cgroup.New(cgroup.WithDriver(cgroup.DriverSystemd))
	need(t, cg.Check() == nil, "cgroup v2: %v", cg.Check())
	_, err = os.Stat(ctrtest.Socket)
	need(t, err == nil, "containerd: %v", err)
	rt := ctrtest.Dial(t)
	srv := agenttest.ServeWith(t, cg, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30}, agent.WithRuntime(rt.CRI))
	return &env{Runtime: rt, cg: cg, c: api.NewClient(srv.Socket)}
}

type pod struct {
	ctrtest.Pod
	slice string
}

// runPod starts a host-network pod in the slice the kubelet's systemd
// driver gives a Burstable pod.
func (e *env) runPod(t *testing.T) pod {
	t.Helper()
	var slice string
	p := e.RunPod(t, func(uid string) string {
		var err error
		if slice, err = cgroup.KubePodSlice("Burstable", uid); err != nil {
			t.Fatal(err)
		}
		return slice
	})
	return pod{Pod: p, slice: slice}
}

// runContainer starts a busybox sleeper in p and returns it with its cgroup
// (from /proc/<pid>/cgroup), checked against the systemd layout.
func (e *env) runContainer(t *testing.T, p pod, name string, res *runtimeapi.LinuxContainerResources) (cri.Container, string) {
	t.Helper()
	ct := e.RunContainer(t, p.Pod, name, res, "/bin/busybox", "sleep", "3600")
	path, err := e.cg.PathOf(ct.PID)
	if err != nil {
		t.Fatal(err)
	}
	want, err := cgroup.ScopePath(p.slice, "cri-containerd", ct.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("container %s %s pid %d cgroupsPath %s cgroup %s", name, ct.ID[:12], ct.PID, ct.CgroupsPath, path)
	if path != want || !cgroup.IsSystemdLayout(path) || !e.cg.UsesSystemd(path) {
		t.Fatalf("cgroup %s: want %s, a systemd unit (layout %v, driver %v)", path, want, cgroup.IsSystemdLayout(path), e.cg.UsesSystemd(path))
	}
	return ct, path
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

func (e *env) resize(t *testing.T, tgt intent.Target, req, lim res) intent.Intent {
	t.Helper()
	s := intent.Spec{Target: tgt}
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
	t.Logf("resize %s %v %v -> %s %s via=%s %s", tgt.Name, req, lim, it.Status.State, it.Status.Reason, it.Status.Via, it.Status.Message)
	if it.Status.State != intent.Completed {
		t.Fatalf("intent %s is %s (%s: %s), want Completed", it.ID, it.Status.State, it.Status.Reason, it.Status.Message)
	}
	return it
}

// unitProps is what `systemctl show` says of a unit.
func unitProps(t *testing.T, unit string) map[string]string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", "--no-pager", "-p", "CPUQuotaPerSecUSec,CPUQuotaPeriodUSec,CPUWeight,MemoryMax", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemctl show %s: %v: %s", unit, err, out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

func daemonReload(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("systemctl", "daemon-reload").CombinedOutput(); err != nil {
		t.Fatalf("systemctl daemon-reload: %v: %s", err, out)
	}
	// systemd re-applies unit properties to the files from its event loop.
	time.Sleep(300 * time.Millisecond)
}

// want is one expected state of a cgroup and its unit.
type want struct {
	files map[string]string // cgroup file -> content
	props map[string]string // unit property -> systemctl show value
}

func check(t *testing.T, what, path string, w want) {
	t.Helper()
	unit, _ := cgroup.UnitName(path)
	for f, v := range w.files {
		if got := cgrouptest.ReadFile(t, mnt, path, f); got != v {
			t.Errorf("%s: %s = %q, want %q", what, f, got, v)
		}
	}
	props := unitProps(t, unit)
	for k, v := range w.props {
		if props[k] != v {
			t.Errorf("%s: unit %s %s=%q, want %q", what, unit, k, props[k], v)
		}
	}
	t.Logf("%s: %s cpu.max=%q cpu.weight=%s memory.max=%s; %v", what, unit,
		cgrouptest.ReadFile(t, mnt, path, "cpu.max"), cgrouptest.ReadFile(t, mnt, path, "cpu.weight"),
		cgrouptest.ReadFile(t, mnt, path, "memory.max"), props)
}

// checkAcrossReload checks w, runs `systemctl daemon-reload`, and checks w
// again: systemd re-applies what its units say, so only limits that are
// unit properties survive.
func checkAcrossReload(t *testing.T, what, path string, w want) {
	t.Helper()
	check(t, what, path, w)
	daemonReload(t)
	check(t, what+", after daemon-reload", path, w)
}

// TestSystemdResizeThroughCRI resizes a container of a systemd-driver pod
// through the agent's runtime path: runc turns the CRI update into unit
// properties, the agent verifies on the files, and a daemon-reload keeps
// the values.
func TestSystemdResizeThroughCRI(t *testing.T) {
	e := setup(t)
	p := e.runPod(t)
	ct, path := e.runContainer(t, p, "app", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 205, MemoryLimitInBytes: 64 << 20})
	check(t, "created", path, want{
		files: map[string]string{"cpu.max": "50000 100000", "memory.max": "67108864"},
		props: map[string]string{"CPUQuotaPerSecUSec": "500ms", "MemoryMax": "67108864"},
	})
	tgt := intent.Target{Name: "app", PodUID: p.UID}
	it := e.resize(t, tgt, res{"cpu": "500m", "memory": "96Mi"}, res{"cpu": "600m", "memory": "96Mi"})
	if it.Status.Via != "runtime" {
		t.Errorf("via %q, want runtime: %s", it.Status.Via, it.Status.Message)
	}
	checkAcrossReload(t, "600m/96Mi via CRI", path, want{
		files: map[string]string{"cpu.max": "60000 100000", "cpu.weight": "59", "memory.max": "100663296"},
		props: map[string]string{"CPUQuotaPerSecUSec": "600ms", "CPUWeight": "59", "MemoryMax": "100663296"},
	})
	st, err := e.CRI.Get(context.Background(), ct.ID)
	if err != nil || st.Resources.CPUQuota != 60000 || st.Resources.MemoryLimit != 96<<20 {
		t.Errorf("containerd's record: %+v (%v)", st.Resources, err)
	}
	// 1234m is not a whole number of 10ms per second: runc rounds the
	// unit's quota up to 1.24s, and the files follow.
	it = e.resize(t, tgt, nil, res{"cpu": "1234m"})
	t.Logf("1234m through CRI: via %s (%s)", it.Status.Via, it.Status.Message)
	checkAcrossReload(t, "1234m via CRI", path, want{
		files: map[string]string{"cpu.max": "124000 100000"},
		props: map[string]string{"CPUQuotaPerSecUSec": "1.240000s"},
	})
}

// TestSystemdResizeDirect resizes a container named by its cgroup path (no
// runtime): the agent's write is a D-Bus SetUnitProperties on the scope,
// which survives a daemon-reload, where a plain file write does not.
func TestSystemdResizeDirect(t *testing.T) {
	e := setup(t)
	p := e.runPod(t)
	_, path := e.runContainer(t, p, "direct", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 205, MemoryLimitInBytes: 64 << 20})
	tgt := intent.Target{Name: "direct", CgroupPath: path}
	it := e.resize(t, tgt, res{"cpu": "250m", "memory": "80Mi"}, res{"cpu": "1234m", "memory": "80Mi"})
	if it.Status.Via != "cgroup" {
		t.Errorf("via %q, want cgroup: %s", it.Status.Via, it.Status.Message)
	}
	checkAcrossReload(t, "1234m/80Mi direct", path, want{
		files: map[string]string{"cpu.max": "124000 100000", "cpu.weight": "35", "memory.max": "83886080"},
		props: map[string]string{"CPUQuotaPerSecUSec": "1.240000s", "CPUQuotaPeriodUSec": "100ms", "CPUWeight": "35", "MemoryMax": "83886080"},
	})
	e.resize(t, tgt, res{"cpu": "250m", "memory": "80Mi"}, res{"cpu": "300m", "memory": "200Mi"})
	checkAcrossReload(t, "300m/200Mi direct", path, want{
		files: map[string]string{"cpu.max": "30000 100000", "memory.max": "209715200"},
		props: map[string]string{"CPUQuotaPerSecUSec": "300ms", "MemoryMax": "209715200"},
	})
}

// TestSystemdDriverVersusFiles shows why the driver matters: the same
// value written as a file (the cgroupfs driver on a systemd host) is exact
// but undone by a daemon-reload; written as a unit property it stays.
func TestSystemdDriverVersusFiles(t *testing.T) {
	e := setup(t)
	p := e.runPod(t)
	_, path := e.runContainer(t, p, "cmp", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 205, MemoryLimitInBytes: 64 << 20})
	q := cgroup.CPUMax{Quota: 123400, Period: 100000}
	mem := int64(48 << 20)

	files := cgroup.New(cgroup.WithDriver(cgroup.DriverCgroupfs))
	if files.UsesSystemd(path) {
		t.Fatal("the cgroupfs driver claims a unit")
	}
	if err := files.Write(path, cgroup.Resources{CPUMax: &q, MemoryMax: &mem}); err != nil {
		t.Fatal(err)
	}
	check(t, "file write", path, want{files: map[string]string{"cpu.max": "123400 100000", "memory.max": "50331648"}})
	daemonReload(t)
	got := cgrouptest.ReadFile(t, mnt, path, "cpu.max") + " / " + cgrouptest.ReadFile(t, mnt, path, "memory.max")
	t.Logf("file write after daemon-reload: cpu.max / memory.max = %s", got)
	if got != "50000 100000 / 67108864" {
		t.Errorf("after daemon-reload the file write left %s; expected systemd to restore its unit's 50000 100000 / 67108864", got)
	}

	auto := cgroup.New(cgroup.WithDriver(cgroup.DriverAuto))
	if !auto.UsesSystemd(path) {
		t.Fatal("auto does not detect systemd")
	}
	if err := auto.Write(path, cgroup.Resources{CPUMax: &q, MemoryMax: &mem}); err != nil {
		t.Fatal(err)
	}
	checkAcrossReload(t, "unit property write", path, want{
		files: map[string]string{"cpu.max": "124000 100000", "memory.max": "50331648"},
		props: map[string]string{"CPUQuotaPerSecUSec": "1.240000s", "MemoryMax": "50331648"},
	})
	// The pod's slice is a unit too.
	podPath, err := cgroup.ExpandSlice(p.slice)
	if err != nil {
		t.Fatal(err)
	}
	pq := cgroup.CPUMax{Quota: 250000, Period: 100000}
	pm := int64(512 << 20)
	if err := auto.Write(podPath, cgroup.Resources{CPUMax: &pq, MemoryMax: &pm}); err != nil {
		t.Fatal(err)
	}
	checkAcrossReload(t, "pod slice", podPath, want{
		files: map[string]string{"cpu.max": "250000 100000", "memory.max": "536870912"},
		props: map[string]string{"CPUQuotaPerSecUSec": "2.500000s", "MemoryMax": "536870912"},
	})
}
