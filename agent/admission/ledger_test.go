package admission_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resizer/resize-agent/agent/admission"
)

const gi = 1 << 30

func TestReserve(t *testing.T) {
	l := admission.NewLedger(admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	steps := []struct {
		key     string
		req     admission.Capacity
		verdict admission.Verdict
		msg     string
	}{
		{"a", admission.Capacity{MilliCPU: 2000, Memory: 4 * gi}, admission.Fit, ""},
		{"b", admission.Capacity{MilliCPU: 1500, Memory: 2 * gi}, admission.Fit, ""},
		// Alone it fits the node, but only 500m is free.
		{"c", admission.Capacity{MilliCPU: 1000}, admission.Deferred, "cpu: requested 1, free 500m, allocatable 4"},
		// Never fits.
		{"c", admission.Capacity{MilliCPU: 5000}, admission.Infeasible, "cpu: requested 5, free 500m, allocatable 4"},
		{"c", admission.Capacity{Memory: 9 * gi}, admission.Infeasible, "memory: requested 9Gi, free 2Gi, allocatable 8Gi"},
		// Growing in place counts only the growth against what is free.
		{"a", admission.Capacity{MilliCPU: 2500, Memory: 4 * gi}, admission.Fit, ""},
		{"a", admission.Capacity{MilliCPU: 2600, Memory: 4 * gi}, admission.Deferred, "cpu: requested 2600m, free 0, allocatable 4 (the container holds 2500m)"},
		// A shrink always fits, even when the node is over-committed.
		{"b", admission.Capacity{MilliCPU: 100, Memory: 1 * gi}, admission.Fit, ""},
		{"c", admission.Capacity{MilliCPU: 1000}, admission.Fit, ""},
	}
	for i, s := range steps {
		d := l.Reserve(s.key, s.req)
		if d.Verdict != s.verdict || !strings.Contains(d.Message, s.msg) {
			t.Fatalf("step %d: Reserve(%s, %+v) = %+v, want verdict %d with %q", i, s.key, s.req, d, s.verdict, s.msg)
		}
	}
	if got := l.Allocated(); got != (admission.Capacity{MilliCPU: 3600, Memory: 5 * gi}) {
		t.Errorf("Allocated() = %+v", got)
	}
	l.Release("a")
	if got := l.Allocated(); got != (admission.Capacity{MilliCPU: 1100, Memory: 1 * gi}) {
		t.Errorf("Allocated() after release = %+v", got)
	}
}

func TestDeferredDoesNotRecord(t *testing.T) {
	l := admission.NewLedger(admission.Capacity{MilliCPU: 1000, Memory: gi})
	l.Reserve("a", admission.Capacity{MilliCPU: 800})
	if d := l.Reserve("b", admission.Capacity{MilliCPU: 300}); d.Verdict != admission.Deferred {
		t.Fatal(d)
	}
	if got := l.Get("b"); got != (admission.Capacity{}) {
		t.Errorf("a Deferred reserve recorded %+v", got)
	}
}

func TestReadMachine(t *testing.T) {
	dir := t.TempDir()
	cpuinfo := "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n\nprocessor\t: 2\n"
	meminfo := "MemTotal:       16384000 kB\nMemFree:        1000 kB\n"
	os.WriteFile(filepath.Join(dir, "cpuinfo"), []byte(cpuinfo), 0o644)
	os.WriteFile(filepath.Join(dir, "meminfo"), []byte(meminfo), 0o644)
	m, err := admission.ReadMachine(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.MilliCPU != 3000 || m.Memory != 16384000*1024 {
		t.Errorf("ReadMachine = %+v", m)
	}
	if _, err := admission.ReadMachine(t.TempDir()); err == nil {
		t.Error("ReadMachine of an empty dir succeeded")
	}
	// And the real one.
	if m, err := admission.ReadMachine("/proc"); err != nil || m.MilliCPU < 1000 || m.Memory <= 0 {
		t.Errorf("ReadMachine(/proc) = %+v, %v", m, err)
	}
}

func TestAllocatable(t *testing.T) {
	m := admission.Machine{MilliCPU: 8000, Memory: 32 * gi}
	for _, tc := range []struct {
		limCPU, limMem int64
		reserved       admission.Capacity
		want           admission.Capacity
	}{
		{0, 0, admission.Capacity{}, admission.Capacity{MilliCPU: 8000, Memory: 32 * gi}},
		{4000, 16 * gi, admission.Capacity{MilliCPU: 500, Memory: gi}, admission.Capacity{MilliCPU: 3500, Memory: 15 * gi}},
		{0, 0, admission.Capacity{MilliCPU: 9000, Memory: 40 * gi}, admission.Capacity{}},
	} {
		if got := admission.Allocatable(m, tc.limCPU, tc.limMem, tc.reserved); got != tc.want {
			t.Errorf("Allocatable(%d, %d, %+v) = %+v, want %+v", tc.limCPU, tc.limMem, tc.reserved, got, tc.want)
		}
	}
}
