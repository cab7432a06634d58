package cgroup_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

const (
	podSlice = "kubepods-burstable-pod0f1e_2d3c.slice"
	podPath  = "/kubepods.slice/kubepods-burstable.slice/" + podSlice
	scope    = "cri-containerd-4a5b6c.scope"
	ctrPath  = podPath + "/" + scope
)

func TestUnitName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{ctrPath, scope, true},
		{podPath, podSlice, true},
		{"/kubepods.slice", "kubepods.slice", true},
		{"/system.slice/docker-1.scope", "docker-1.scope", true},
		{"/kubepods/burstable/pod1/4a5b6c", "", false},
		{"/system.slice/containerd.service", "", false},
		{"/.slice", "", false},
	} {
		got, ok := cgroup.UnitName(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("UnitName(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestExpandSlice(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"kubepods.slice", "/kubepods.slice"},
		{"kubepods-besteffort.slice", "/kubepods.slice/kubepods-besteffort.slice"},
		{podSlice, podPath},
		{"kubepods-pod7_8.slice", "/kubepods.slice/kubepods-pod7_8.slice"},
		{"-.slice", "/"},
		{"a-b-c-d.slice", "/a.slice/a-b.slice/a-b-c.slice/a-b-c-d.slice"},
	} {
		got, err := cgroup.ExpandSlice(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ExpandSlice(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", ".slice", "kubepods", "a--b.slice", "-a.slice", "a-.slice", "a/b.slice", "x.scope"} {
		if got, err := cgroup.ExpandSlice(bad); !errors.Is(err, cgroup.ErrInvalidPath) {
			t.Errorf("ExpandSlice(%q) = %q, %v; want ErrInvalidPath", bad, got, err)
		}
	}
}

func TestKubePodSliceAndScopePath(t *testing.T) {
	for _, tc := range []struct{ qos, uid, want string }{
		{"Burstable", "0f1e-2d3c", podSlice},
		{"BestEffort", "u-1", "kubepods-besteffort-podu_1.slice"},
		{"Guaranteed", "u-1", "kubepods-podu_1.slice"},
	} {
		got, err := cgroup.KubePodSlice(tc.qos, tc.uid)
		if err != nil || got != tc.want {
			t.Errorf("KubePodSlice(%q, %q) = %q, %v; want %q", tc.qos, tc.uid, got, err, tc.want)
		}
	}
	if _, err := cgroup.KubePodSlice("Gold", "u"); !errors.Is(err, cgroup.ErrInvalidPath) {
		t.Errorf("KubePodSlice(Gold) err = %v", err)
	}
	if _, err := cgroup.KubePodSlice("Burstable", "a/b"); !errors.Is(err, cgroup.ErrInvalidPath) {
		t.Errorf("KubePodSlice(uid with /) err = %v", err)
	}
	got, err := cgroup.ScopePath(podSlice, "cri-containerd", "4a5b6c")
	if err != nil || got != ctrPath {
		t.Errorf("ScopePath = %q, %v; want %q", got, err, ctrPath)
	}
	if _, err := cgroup.ScopePath(podSlice, "cri-containerd", "../x"); !errors.Is(err, cgroup.ErrInvalidPath) {
		t.Errorf("ScopePath(../x) err = %v", err)
	}
}

func TestIsSystemdLayout(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{ctrPath, true},
		{podPath, true},
		{"/kubepods.slice", true},
		{"/system.slice/docker-1.scope", true},
		{"/kubepods/burstable/x.scope", false},                   // cgroupfs dirs named like units
		{"/kubepods.slice/kubepods-burstable-pod1.slice", false}, // skips kubepods-burstable.slice
		{"/system.slice/containerd.service/x.scope", false},      // inside a service's delegated tree
		{"/kubepods/burstable/pod1/4a5b6c", false},
	} {
		if got := cgroup.IsSystemdLayout(tc.in); got != tc.ok {
			t.Errorf("IsSystemdLayout(%q) = %v, want %v", tc.in, got, tc.ok)
		}
	}
}

func TestParseDriver(t *testing.T) {
	for _, s := range []string{"auto", "cgroupfs", "systemd"} {
		if d, err := cgroup.ParseDriver(s); err != nil || string(d) != s {
			t.Errorf("ParseDriver(%q) = %q, %v", s, d, err)
		}
	}
	if _, err := cgroup.ParseDriver("Systemd"); err == nil {
		t.Error("ParseDriver(Systemd) accepted")
	}
}

// The rounding figures: what systemd keeps (CPUQuotaPerSecUSec) and then
// writes to cpu.max for a requested quota/period.
func TestQuotaRounding(t *testing.T) {
	for _, tc := range []struct {
		quota      int64
		period     uint64
		perSec     uint64
		storedFile int64
	}{
		{123400, 100000, 1240000, 124000}, // 1234m -> 1240m
		{50000, 100000, 500000, 50000},    // 500m: exact
		{100000, 100000, 1000000, 100000}, // 1 CPU: exact
		{1000, 100000, 10000, 1000},       // kubelet's 1ms minimum: 10m
		{1001, 100000, 20000, 2000},       // just above a step: up to the next
		{33333, 50000, 670000, 33500},     // odd period: 666660 -> 670000
		{25000, 1000000, 30000, 30000},    // 1s period: 25ms -> 30ms
		// A period not a multiple of 100µs: systemd truncates the quota
		// per period (310000 * 33333 / 1e6 = 10333.2), it does not round up.
		{10000, 33333, 310000, 10333},
		{50000, 100001, 500000, 50000}, // 50000.5 -> 50000
		{1000, 1001, 1000000, 1001},    // a whole CPU on an odd period
	} {
		c := cgroup.CPUMax{Quota: tc.quota, Period: tc.period}
		if got := cgroup.QuotaPerSec(c); got != tc.perSec {
			t.Errorf("QuotaPerSec(%v) = %d, want %d", c, got, tc.perSec)
		}
		st := cgroup.SystemdStored(cgroup.Resources{CPUMax: &c})
		want := cgroup.CPUMax{Quota: tc.storedFile, Period: tc.period}
		if *st.CPUMax != want {
			t.Errorf("SystemdStored(%v) = %v, want %v", c, *st.CPUMax, want)
		}
	}
	unl := cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}
	if got := cgroup.QuotaPerSec(unl); got != math.MaxUint64 {
		t.Errorf("QuotaPerSec(max) = %d, want infinity", got)
	}
	if st := cgroup.SystemdStored(cgroup.Resources{CPUMax: &unl}); *st.CPUMax != unl {
		t.Errorf("SystemdStored(max) = %v", *st.CPUMax)
	}
}

func TestSystemdProperties(t *testing.T) {
	r := cgroup.Resources{
		CPUMax:    &cgroup.CPUMax{Quota: 123400, Period: 100000},
		CPUWeight: ptr(uint64(59)),
		MemoryMax: ptr(int64(64 << 20)),
	}
	got := propMap(cgroup.SystemdProperties(r))
	want := map[string]uint64{
		"CPUWeight": 59, "CPUQuotaPeriodUSec": 100000, "CPUQuotaPerSecUSec": 1240000, "MemoryMax": 64 << 20,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("properties %v, want %v", got, want)
	}
	got = propMap(cgroup.SystemdProperties(cgroup.Resources{MemoryMax: ptr(cgroup.Unlimited)}))
	if len(got) != 1 || got["MemoryMax"] != math.MaxUint64 {
		t.Errorf("memory max: %v", got)
	}
}

func propMap(props []sddbus.Property) map[string]uint64 {
	m := map[string]uint64{}
	for _, p := range props {
		m[p.Name] = p.Value.Value().(uint64)
	}
	return m
}

// fakeSystemd stands in for systemd: it records the calls and writes the
// files of the unit's cgroup the way systemd does, after a delay (systemd
// writes them from its event loop after it has answered).
type fakeSystemd struct {
	t      *testing.T
	root   string
	units  map[string]string // unit -> cgroup path
	delay  time.Duration
	refuse error
	ignore bool

	mu    sync.Mutex
	calls []string
	wg    sync.WaitGroup
}

func (f *fakeSystemd) dial(context.Context) (cgroup.UnitConn, error) { return f, nil }
func (f *fakeSystemd) Connected() bool                               { return true }
func (f *fakeSystemd) Close()                                        {}

func (f *fakeSystemd) SetUnitPropertiesContext(_ context.Context, name string, runtime bool, props ...sddbus.Property) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := propMap(props)
	f.calls = append(f.calls, fmt.Sprintf("%s runtime=%v %v", name, runtime, p))
	if f.refuse != nil {
		return f.refuse
	}
	dir, ok := f.units[name]
	if !ok {
		return fmt.Errorf("Unit %s not loaded", name)
	}
	if f.ignore {
		return nil
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		time.Sleep(f.delay)
		d := filepath.Join(f.root, dir)
		if w, ok := p["CPUWeight"]; ok {
			f.write(d, "cpu.weight", fmt.Sprint(w))
		}
		if q, ok := p["CPUQuotaPerSecUSec"]; ok {
			period := p["CPUQuotaPeriodUSec"]
			if q == math.MaxUint64 {
				f.write(d, "cpu.max", fmt.Sprintf("max %d", period))
			} else {
				f.write(d, "cpu.max", fmt.Sprintf("%d %d", max((q*period+999999)/1000000, 1000), period))
			}
		}
		if m, ok := p["MemoryMax"]; ok {
			v := "max"
			if m != math.MaxUint64 {
				v = fmt.Sprint(m)
			}
			f.write(d, "memory.max", v)
		}
	}()
	return nil
}

// write replaces the file at once, as a cgroupfs write appears to readers.
func (f *fakeSystemd) write(d, file, v string) {
	tmp := filepath.Join(d, "."+file)
	if err := os.WriteFile(tmp, []byte(v), 0o644); err != nil {
		f.t.Error(err)
	}
	if err := os.Rename(tmp, filepath.Join(d, file)); err != nil {
		f.t.Error(err)
	}
}

func (f *fakeSystemd) Calls() []string {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

const fsPath = "/kubepods/burstable/pod1/c1"

func newSystemdManager(t *testing.T, d cgroup.Driver, booted bool) (*cgroup.Manager, *fakeSystemd, string) {
	return newSystemdManagerWait(t, d, booted, 10*time.Second)
}

// newSystemdManagerWait is newSystemdManager with a bound on the wait for
// the fake to write the files (generous: machines under load are slow).
func newSystemdManagerWait(t *testing.T, d cgroup.Driver, booted bool, wait time.Duration) (*cgroup.Manager, *fakeSystemd, string) {
	t.Helper()
	root := cgrouptest.FakeTree(t, ctrPath, fsPath)
	run := filepath.Join(t.TempDir(), "run-systemd-system")
	if booted {
		if err := os.Mkdir(run, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakeSystemd{t: t, root: root, units: map[string]string{scope: ctrPath}, delay: 30 * time.Millisecond}
	t.Cleanup(f.wg.Wait)
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck(),
		cgroup.WithFakeSystemd(d, run, wait, f.dial))
	return m, f, root
}

func readState(t *testing.T, m *cgroup.Manager, p string) cgroup.State {
	t.Helper()
	s, err := m.Read(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestWriteSystemdUnit(t *testing.T) {
	for _, d := range []cgroup.Driver{cgroup.DriverSystemd, cgroup.DriverAuto} {
		t.Run(string(d), func(t *testing.T) {
			m, f, _ := newSystemdManager(t, d, true)
			q := cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 123400, Period: 100000}}
			if got := m.Stored(ctrPath, q).CPUMax.Quota; got != 124000 {
				t.Errorf("Stored(unit) quota %d, want 124000", got)
			}
			if got := m.Stored(fsPath, q).CPUMax.Quota; got != 123400 {
				t.Errorf("Stored(cgroupfs path) quota %d, want 123400", got)
			}
			if !m.UsesSystemd(ctrPath) || m.UsesSystemd(fsPath) {
				t.Fatalf("UsesSystemd: unit %v, cgroupfs path %v", m.UsesSystemd(ctrPath), m.UsesSystemd(fsPath))
			}
			r := cgroup.Resources{
				CPUMax:    &cgroup.CPUMax{Quota: 123400, Period: 100000},
				CPUWeight: ptr(uint64(59)),
				MemoryMax: ptr(int64(64 << 20)),
			}
			if err := m.Write(ctrPath, r); err != nil {
				t.Fatal(err)
			}
			s := readState(t, m, ctrPath)
			if s.CPUMax != (cgroup.CPUMax{Quota: 124000, Period: 100000}) || s.CPUWeight != 59 || s.MemoryMax != 64<<20 {
				t.Errorf("files hold %+v", s)
			}
			calls := f.Calls()
			want := fmt.Sprintf("%s runtime=true map[CPUQuotaPerSecUSec:1240000 CPUQuotaPeriodUSec:100000 CPUWeight:59 MemoryMax:%d]", scope, 64<<20)
			if len(calls) != 1 || calls[0] != want {
				t.Errorf("calls %q, want [%q]", calls, want)
			}
			// A cgroupfs path under the same manager: the files, no D-Bus.
			if err := m.Write(fsPath, cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 123400, Period: 100000}}); err != nil {
				t.Fatal(err)
			}
			if s := readState(t, m, fsPath); s.CPUMax.Quota != 123400 {
				t.Errorf("cgroupfs path: cpu.max %v", s.CPUMax)
			}
			if n := len(f.Calls()); n != 1 {
				t.Errorf("%d D-Bus calls, want 1", n)
			}
		})
	}
}

func TestWriteSystemdOff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		d      cgroup.Driver
		booted bool
	}{
		{"cgroupfs driver", cgroup.DriverCgroupfs, true},
		{"auto without systemd", cgroup.DriverAuto, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, f, _ := newSystemdManager(t, tc.d, tc.booted)
			if m.UsesSystemd(ctrPath) {
				t.Error("UsesSystemd = true")
			}
			if err := m.Write(ctrPath, cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 123400, Period: 100000}}); err != nil {
				t.Fatal(err)
			}
			if s := readState(t, m, ctrPath); s.CPUMax.Quota != 123400 {
				t.Errorf("cpu.max %v, want the exact quota", s.CPUMax)
			}
			if c := f.Calls(); len(c) != 0 {
				t.Errorf("D-Bus calls %q", c)
			}
		})
	}
}

func TestWriteSystemdFailures(t *testing.T) {
	r := cgroup.Resources{CPUWeight: ptr(uint64(300)), MemoryMax: ptr(int64(32 << 20))}
	t.Run("not booted", func(t *testing.T) {
		m, f, _ := newSystemdManager(t, cgroup.DriverSystemd, false)
		err := m.Write(ctrPath, r)
		if !errors.Is(err, cgroup.ErrNoSystemd) {
			t.Fatalf("err = %v, want ErrNoSystemd", err)
		}
		if c := f.Calls(); len(c) != 0 {
			t.Errorf("D-Bus calls %q", c)
		}
		if s := readState(t, m, ctrPath); s.CPUWeight != 100 || s.MemoryMax != cgroup.Unlimited {
			t.Errorf("changed: %+v", s)
		}
	})
	t.Run("refused", func(t *testing.T) {
		m, f, _ := newSystemdManager(t, cgroup.DriverSystemd, true)
		f.refuse = errors.New("Access denied")
		err := m.Write(ctrPath, r)
		if !errors.Is(err, cgroup.ErrSystemd) || !strings.Contains(err.Error(), "Access denied") {
			t.Fatalf("err = %v, want ErrSystemd with the reason", err)
		}
		if s := readState(t, m, ctrPath); s.CPUWeight != 100 || s.MemoryMax != cgroup.Unlimited {
			t.Errorf("changed: %+v", s)
		}
	})
	t.Run("not applied", func(t *testing.T) {
		m, f, _ := newSystemdManagerWait(t, cgroup.DriverSystemd, true, 200*time.Millisecond)
		f.ignore = true
		err := m.Write(ctrPath, r)
		if !errors.Is(err, cgroup.ErrVerify) {
			t.Fatalf("err = %v, want ErrVerify", err)
		}
		// Then the old values are set back through systemd.
		calls := f.Calls()
		if len(calls) != 2 || !strings.Contains(calls[1], "CPUWeight:100") ||
			!strings.Contains(calls[1], fmt.Sprintf("MemoryMax:%d", uint64(math.MaxUint64))) {
			t.Errorf("calls %q, want the write then the restore", calls)
		}
	})
	t.Run("invalid value", func(t *testing.T) {
		m, f, _ := newSystemdManager(t, cgroup.DriverSystemd, true)
		if err := m.Write(ctrPath, cgroup.Resources{CPUWeight: ptr(uint64(0))}); !errors.Is(err, cgroup.ErrInvalidValue) {
			t.Fatalf("err = %v, want ErrInvalidValue", err)
		}
		if c := f.Calls(); len(c) != 0 {
			t.Errorf("D-Bus calls %q", c)
		}
	})
}
