package cgroup_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func ptr[T any](v T) *T { return &v }

func TestCleanPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"kubepods/pod1/c1", "/kubepods/pod1/c1", true},
		{"/kubepods/pod1/c1", "/kubepods/pod1/c1", true},
		{"/a", "/a", true},
		{"", "", false},
		{"/", "", false},
		{"..", "", false},
		{"/../etc", "", false},
		{"a/../../etc", "", false},
		{"a/./b", "", false},
		{"a//b", "", false},
		{"a/b/", "", false},
		{"/sys/fs/cgroup/a", "", false},
		{"a\x00b", "", false},
		{"/" + strings.Repeat("a", 5000), "", false},
	} {
		got, err := cgroup.CleanPath(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, cgroup.ErrInvalidPath) {
			t.Errorf("CleanPath(%q) error %v does not match ErrInvalidPath", tc.in, err)
		}
	}
}

func TestResourcesValues(t *testing.T) {
	r := cgroup.Resources{
		CPUMax:    &cgroup.CPUMax{Quota: 50000, Period: 100000},
		CPUWeight: ptr(uint64(59)),
		MemoryMax: ptr(cgroup.Unlimited),
	}
	got := r.Values()
	want := []cgroup.Value{{File: "cpu.weight", Data: "59"}, {File: "cpu.max", Data: "50000 100000"}, {File: "memory.max", Data: "max"}}
	if len(got) != len(want) {
		t.Fatalf("Values() = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Values()[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if v := (cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}}).Values(); v[0].Data != "max 100000" {
		t.Errorf("unlimited cpu.max = %q", v[0].Data)
	}
	if !(cgroup.Resources{}).IsZero() {
		t.Error("empty Resources is not zero")
	}
}

func TestResourcesValidate(t *testing.T) {
	for name, r := range map[string]cgroup.Resources{
		"short period": {CPUMax: &cgroup.CPUMax{Quota: 1000, Period: 999}},
		"long period":  {CPUMax: &cgroup.CPUMax{Quota: 1000, Period: 1000001}},
		"tiny quota":   {CPUMax: &cgroup.CPUMax{Quota: 999, Period: 100000}},
		"weight 0":     {CPUWeight: ptr(uint64(0))},
		"weight 10001": {CPUWeight: ptr(uint64(10001))},
		"negative mem": {MemoryMax: ptr(int64(-5))},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%s: Validate() accepted %v", name, r.Values())
		}
	}
}

func TestParseCPUMax(t *testing.T) {
	for in, want := range map[string]cgroup.CPUMax{
		"max 100000":   {Quota: cgroup.Unlimited, Period: 100000},
		"50000 100000": {Quota: 50000, Period: 100000},
		"max":          {Quota: cgroup.Unlimited, Period: 100000},
	} {
		got, err := cgroup.ParseCPUMax(in)
		if err != nil || got != want {
			t.Errorf("ParseCPUMax(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a b", "1 2 3", "-5 100000", "100 x"} {
		if _, err := cgroup.ParseCPUMax(in); !errors.Is(err, cgroup.ErrParse) {
			t.Errorf("ParseCPUMax(%q) error = %v, want ErrParse", in, err)
		}
	}
}

func TestWriteReadFake(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/c1")
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	r := cgroup.Resources{CPUMax: &cgroup.CPUMax{Quota: 25000, Period: 100000}, CPUWeight: ptr(uint64(17)), MemoryMax: ptr(int64(256 << 20))}
	if err := m.Write("pod/c1", r); err != nil {
		t.Fatal(err)
	}
	s, err := m.Read("/pod/c1")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Matches(r, m.PageSize()) {
		t.Errorf("Read = %+v after writing %v", s, r.Values())
	}
	if got := cgrouptest.ReadFile(t, root, "/pod/c1", "memory.max"); got != "268435456" {
		t.Errorf("memory.max = %q", got)
	}
	if err := m.Write("/pod/c1", cgroup.Resources{MemoryMax: ptr(cgroup.Unlimited)}); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ReadFile(t, root, "/pod/c1", "memory.max"); got != "max" {
		t.Errorf("memory.max = %q, want max", got)
	}
}

// TestWriteRejectsBadPaths, with openat2 and with the walk that stands in
// for it on kernels without.
func TestWriteRejectsBadPaths(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(fmt.Sprintf("walk=%v", walk), func(t *testing.T) { testWriteRejectsBadPaths(t, walk) })
	}
}

func testWriteRejectsBadPaths(t *testing.T, walk bool) {
	root := cgrouptest.FakeTree(t, "/pod/c1")
	outside := t.TempDir()
	if err := os.Symlink(outside, root+"/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, root+"/pod/inner"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(outside+"/c2", 0o755); err != nil {
		t.Fatal(err)
	}
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	if walk {
		cgroup.SetWalk(m)
	}
	if err := m.Write("/pod/c1", cgroup.Resources{CPUWeight: ptr(uint64(7))}); err != nil {
		t.Fatal(err)
	}
	r := cgroup.Resources{CPUWeight: ptr(uint64(5))}
	for p, want := range map[string]error{
		"../x":          cgroup.ErrInvalidPath,
		"/pod/../../x":  cgroup.ErrInvalidPath,
		"/":             cgroup.ErrInvalidPath,
		"/nope":         cgroup.ErrNotFound,
		"/link":         cgroup.ErrNotFound,
		"/pod/inner/c2": cgroup.ErrNotFound,
		"/pod/cpu.max":  cgroup.ErrNotFound,
		"/pod/c1/":      cgroup.ErrInvalidPath,
	} {
		if err := m.Write(p, r); !errors.Is(err, want) {
			t.Errorf("Write(%q) = %v, want %v", p, err, want)
		}
		// Reads open their files below the root the same way.
		if _, err := m.ReadFiles(p, cgroup.FileCPUWeight); !errors.Is(err, want) {
			t.Errorf("ReadFiles(%q) = %v, want %v", p, err, want)
		}
		if _, err := m.Read(p); !errors.Is(err, want) {
			t.Errorf("Read(%q) = %v, want %v", p, err, want)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("a write escaped the root: %v", entries)
	}
	if entries, _ := os.ReadDir(outside + "/c2"); len(entries) != 0 {
		t.Errorf("a write escaped the root: c2/%v", entries)
	}
}

func TestWriteRollsBackOnFailure(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/c")
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	cgroup.SetFailWrite(m, func(file string) error {
		if file == "memory.max" {
			return &cgroup.WriteError{Path: "/c", File: file, Err: syscall.EBUSY}
		}
		return nil
	})
	err := m.Write("/c", cgroup.Resources{
		CPUWeight: ptr(uint64(500)),
		CPUMax:    &cgroup.CPUMax{Quota: 20000, Period: 100000},
		MemoryMax: ptr(int64(1 << 20)),
	})
	if !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("Write error = %v, want EBUSY", err)
	}
	for f, want := range map[string]string{"cpu.weight": "100", "cpu.max": "max 100000", "memory.max": "max"} {
		if got := cgrouptest.ReadFile(t, root, "/c", f); got != want {
			t.Errorf("%s = %q after rollback, want %q", f, got, want)
		}
	}
}

func TestCheckFake(t *testing.T) {
	root := cgrouptest.FakeTree(t)
	cgrouptest.SetFile(t, root, "/", "cgroup.controllers", "io pids")
	err := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()).Check()
	if !errors.Is(err, cgroup.ErrMissingController) || !strings.Contains(err.Error(), "cpu, memory") {
		t.Errorf("Check() = %v, want ErrMissingController naming cpu, memory", err)
	}
	if err := cgroup.New(cgroup.WithMountpoint(root)).Check(); !errors.Is(err, cgroup.ErrNotCgroup2) {
		t.Errorf("Check() on a tmp dir = %v, want ErrNotCgroup2", err)
	}
}

// ReadFiles reads the named files only, and WriteFrom takes what they hold
// from its caller's read: it writes what differs, verifies it, and on a
// failure restores what the read said.
func TestReadFilesWriteFrom(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/c")
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	cgrouptest.SetFile(t, root, "/c", "memory.current", "4096")
	cgrouptest.SetFile(t, root, "/c", "cpu.stat", "usage_usec 0")
	cur, err := m.ReadFiles("/c", cgroup.FileCPUMax, cgroup.FileCPUWeight)
	if err != nil {
		t.Fatal(err)
	}
	if cur.CPUWeight != 100 || cur.CPUMax.Quota != cgroup.Unlimited || cur.MemoryCurrent != 0 || cur.MemoryMax != 0 {
		t.Fatalf("ReadFiles(cpu.max, cpu.weight) = %+v: want the CPU files only", cur)
	}
	if _, err := m.ReadFiles("/c", "cpu.stat"); !errors.Is(err, cgroup.ErrParse) {
		t.Errorf("ReadFiles(cpu.stat) error = %v, want ErrParse", err)
	}

	want := cgroup.Resources{CPUWeight: ptr(uint64(100)), CPUMax: &cgroup.CPUMax{Quota: 20000, Period: 100000}}
	if err := m.WriteFrom("/c", want, cur); err != nil {
		t.Fatal(err)
	}
	if got := cgrouptest.ReadFile(t, root, "/c", "cpu.max"); got != "20000 100000" {
		t.Errorf("cpu.max = %q", got)
	}

	// A write that fails puts back what cur says the files held.
	cur, err = m.ReadFiles("/c", cgroup.FileCPUMax, cgroup.FileCPUWeight, cgroup.FileMemoryMax)
	if err != nil {
		t.Fatal(err)
	}
	cgroup.SetFailWrite(m, func(file string) error {
		if file == "memory.max" {
			return &cgroup.WriteError{Path: "/c", File: file, Err: syscall.EBUSY}
		}
		return nil
	})
	err = m.WriteFrom("/c", cgroup.Resources{
		CPUWeight: ptr(uint64(500)),
		CPUMax:    &cgroup.CPUMax{Quota: 50000, Period: 100000},
		MemoryMax: ptr(int64(1 << 20)),
	}, cur)
	if !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("WriteFrom error = %v, want EBUSY", err)
	}
	for f, want := range map[string]string{"cpu.weight": "100", "cpu.max": "20000 100000", "memory.max": "max"} {
		if got := cgrouptest.ReadFile(t, root, "/c", f); got != want {
			t.Errorf("%s = %q after rollback, want %q", f, got, want)
		}
	}
}

// Children lists the cgroups directly below one, not its files, and
// refuses a path outside the root as every call does.
func TestChildren(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod", "/pod/a", "/pod/b", "/pod/b/inner")
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	got, err := m.Children("/pod")
	if err != nil || !slices.Equal(got, []string{"/pod/a", "/pod/b"}) {
		t.Fatalf("Children(/pod) = %v, %v; want [/pod/a /pod/b]", got, err)
	}
	if got, err := m.Children("/pod/a"); err != nil || len(got) != 0 {
		t.Errorf("Children(/pod/a) = %v, %v; want none", got, err)
	}
	for p, want := range map[string]error{"/nope": cgroup.ErrNotFound, "/pod/../..": cgroup.ErrInvalidPath, "/pod/cpu.max": cgroup.ErrNotFound} {
		if _, err := m.Children(p); !errors.Is(err, want) {
			t.Errorf("Children(%q) = %v, want %v", p, err, want)
		}
	}
}
