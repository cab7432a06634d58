package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

const mi = int64(1) << 20

// kernelish plays the kernel's part in a shrink on a FakeTree: each cgroup
// holds some reclaimable memory, memory.high and memory.reclaim take what
// they can of it, per call at most perCall bytes.
type kernelish struct {
	*recorder
	root        string
	mu          sync.Mutex
	reclaimable map[string]int64
	perCall     int64         // 0: no limit
	stallPer    time.Duration // PSI memory full stall added by each reclaim
	stalled     time.Duration
	calls       []string
}

func (k *kernelish) take(p string, n int64) int64 {
	cur, _ := strconv.ParseInt(readFake(k.root, p, "memory.current"), 10, 64)
	got := min(n, k.reclaimable[p])
	if k.perCall > 0 {
		got = min(got, k.perCall)
	}
	k.reclaimable[p] -= got
	writeFake(k.root, p, "memory.current", fmt.Sprint(cur-got))
	return got
}

func (k *kernelish) SetMemoryHigh(p string, v int64) error {
	k.mu.Lock()
	k.calls = append(k.calls, p+":memory.high="+fmt.Sprint(v))
	if v != cgroup.Unlimited {
		cur, _ := strconv.ParseInt(readFake(k.root, p, "memory.current"), 10, 64)
		if cur > v {
			k.take(p, cur-v)
		}
	}
	k.mu.Unlock()
	return k.recorder.SetMemoryHigh(p, v)
}

func (k *kernelish) Reclaim(p string, n int64) (int64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, p+":memory.reclaim")
	if k.stallPer > 0 {
		k.stalled += k.stallPer
		us := k.stalled.Microseconds()
		writeFake(k.root, p, "memory.pressure", fmt.Sprintf(
			"some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=%d\n", us, us))
	}
	if got := k.take(p, n); got < n {
		return got, &cgroup.ReclaimError{Path: p, Requested: n, Reclaimed: got, Err: cgroup.ErrReclaimIncomplete}
	}
	return n, nil
}

func (k *kernelish) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.calls...)
}

// readFake and writeFake reach the fake tree from the agent's goroutines,
// where a test's Fatal cannot be called; a miss shows as a wrong figure.
func readFake(root, p, f string) string {
	b, _ := os.ReadFile(filepath.Join(root, p, f))
	return strings.TrimSpace(string(b))
}

func writeFake(root, p, f, v string) {
	_ = os.WriteFile(filepath.Join(root, p, f), []byte(v), 0o644)
}

type shrinkFixture struct {
	root string
	k    *kernelish
	a    *agent.Agent
}

// newShrinkFixture has the cgroups hold memory.reclaim (a 5.19+ kernel)
// and the given usage, of which reclaimable can be reclaimed.
func newShrinkFixture(t *testing.T, usage, reclaimable map[string]int64, opts ...agent.Option) *shrinkFixture {
	t.Helper()
	var paths []string
	for p := range usage {
		paths = append(paths, p)
	}
	root := cgrouptest.FakeTree(t, paths...)
	for _, p := range paths {
		cgrouptest.SetFile(t, root, p, "memory.high", "max")
		cgrouptest.SetFile(t, root, p, "memory.reclaim", "")
		cgrouptest.SetFile(t, root, p, "memory.stat", fmt.Sprintf("anon %d\nfile %d\n", usage[p]-reclaimable[p], reclaimable[p]))
	}
	k := &kernelish{
		recorder:    &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())},
		root:        root,
		reclaimable: reclaimable,
	}
	opts = append([]agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	a := agent.New(k, admission.NewLedger(admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}), opts...)
	t.Cleanup(func() {
		if err := a.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	f := &shrinkFixture{root, k, a}
	// Usage is set after a first resize to the starting limit.
	for _, p := range paths {
		cgrouptest.SetFile(t, root, p, "memory.current", fmt.Sprint(usage[p]))
	}
	return f
}

func memSpec(name, path, pod, limit string) intent.Spec {
	s := spec(name, path, map[string]string{"memory": limit}, map[string]string{"memory": limit})
	s.Target.PodCgroupPath = pod
	return s
}

func TestShrinkReclaimsThenLowersMemoryMax(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 500 * mi})
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	want(t, it, intent.Completed, intent.ReasonApplied)
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.max"); got != fmt.Sprint(512*mi) {
		t.Errorf("memory.max = %s", got)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.high"); got != "max" {
		t.Errorf("memory.high = %s, want it restored to max", got)
	}
	for _, w := range []string{"/c: reclaimed ", "memory.current 600.0 MiB -> ", "then 1 cgroup step(s) written", "memory.high of /c restored to max"} {
		if !strings.Contains(it.Status.Message, w) {
			t.Errorf("message %q lacks %q", it.Status.Message, w)
		}
	}
	// memory.high first, memory.max after usage came down, memory.high back.
	calls, writes := f.k.Calls(), f.cg().Writes()
	if len(calls) < 2 || calls[0] != "/c:memory.high=536870912" || calls[len(calls)-1] != "/c:memory.high=-1" {
		t.Errorf("memory.high calls %v", calls)
	}
	if writes[len(writes)-1] != "/c:memory.max=536870912" {
		t.Errorf("writes %v", writes)
	}
}

func (f *shrinkFixture) cg() *recorder { return f.k.recorder }

func TestShrinkOfUnreclaimableFailsAndRestores(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 10 * mi})
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	cgrouptest.SetFile(t, f.root, "/c", "memory.high", fmt.Sprint(900*mi)) // as MemoryQoS might leave it
	start := time.Now()
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	took := time.Since(start)
	want(t, it, intent.Failed, intent.ReasonMemoryBelowUsage)
	if took > 5*time.Second {
		t.Errorf("giving up took %s; usage that does not fall should end it early", took)
	}
	for _, w := range []string{"memory limit 512Mi is below the current usage 600.0 MiB of /c", "usage stopped falling",
		"memory.current 600.0 MiB -> 590.0 MiB", "reclaimed 10.0 MiB", "memory.max left at 1Gi", "memory.high of /c restored to 900Mi"} {
		if !strings.Contains(it.Status.Message, w) {
			t.Errorf("message %q lacks %q", it.Status.Message, w)
		}
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.max"); got != fmt.Sprint(gi) {
		t.Errorf("memory.max = %s, want 1Gi untouched", got)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.high"); got != fmt.Sprint(900*mi) {
		t.Errorf("memory.high = %s, want 900Mi restored", got)
	}
}

func TestShrinkTimeout(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 500 * mi}, agent.WithShrinkTimeout(300*time.Millisecond))
	f.k.perCall = 2 * mi // slow but steady: only the timeout ends it
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	f.k.reclaimable["/c"] = 500 * mi
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	want(t, it, intent.Failed, intent.ReasonMemoryBelowUsage)
	if !strings.Contains(it.Status.Message, "usage did not come down within the") {
		t.Errorf("message %q", it.Status.Message)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.high"); got != "max" {
		t.Errorf("memory.high = %s after a timeout", got)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.max"); got != fmt.Sprint(gi) {
		t.Errorf("memory.max = %s after a timeout", got)
	}
}

func TestShrinkRestoresHighWhenTheWriteFails(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 500 * mi})
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	f.cg().mu.Lock()
	f.cg().fail = func(p string, r cgroup.Resources) error {
		if r.MemoryMax != nil {
			return &cgroup.WriteError{Path: p, File: "memory.max", Err: syscall.EBUSY}
		}
		return nil
	}
	f.cg().mu.Unlock()
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	want(t, it, intent.Failed, intent.ReasonWriteFailed)
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.high"); got != "max" {
		t.Errorf("memory.high = %s after a failed write", got)
	}
	if !strings.Contains(it.Status.Message, "reclaimed") || !strings.Contains(it.Status.Message, "restored to max") {
		t.Errorf("message %q", it.Status.Message)
	}
}

func TestShrinkPodLevelContainerFirst(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/pod": 900 * mi, "/pod/a": 500 * mi, "/pod/b": 400 * mi},
		map[string]int64{"/pod": 600 * mi, "/pod/a": 300 * mi})
	want(t, submit(t, f.a, memSpec("a", "/pod/a", "/pod", "512Mi")), intent.Completed, "")
	want(t, submit(t, f.a, memSpec("b", "/pod/b", "/pod", "512Mi")), intent.Completed, "")
	f.k.mu.Lock()
	f.k.calls = nil
	f.k.mu.Unlock()
	cgrouptest.SetFile(t, f.root, "/pod", "memory.current", fmt.Sprint(900*mi))
	cgrouptest.SetFile(t, f.root, "/pod/a", "memory.current", fmt.Sprint(500*mi))
	f.k.reclaimable = map[string]int64{"/pod": 600 * mi, "/pod/a": 300 * mi}
	// The pod's limit goes from 1Gi to 768Mi, below its 900Mi usage; a's
	// from 512Mi to 256Mi, below its 500Mi.
	it := submit(t, f.a, memSpec("a", "/pod/a", "/pod", "256Mi"))
	want(t, it, intent.Completed, intent.ReasonApplied)
	calls := f.k.Calls()
	if len(calls) == 0 || calls[0] != "/pod/a:memory.high="+fmt.Sprint(256*mi) {
		t.Fatalf("calls %v, want the container's memory.high first", calls)
	}
	var podHigh bool
	for _, c := range calls {
		podHigh = podHigh || c == "/pod:memory.high="+fmt.Sprint(768*mi)
	}
	if !podHigh {
		t.Errorf("calls %v: the pod's memory.high was not lowered", calls)
	}
	if n := len(calls); calls[n-2] != "/pod:memory.high=-1" || calls[n-1] != "/pod/a:memory.high=-1" {
		t.Errorf("calls %v: want the pod's then the container's memory.high restored last", calls)
	}
	for p, w := range map[string]string{"/pod/a": fmt.Sprint(256 * mi), "/pod": fmt.Sprint(768 * mi)} {
		if got := cgrouptest.ReadFile(t, f.root, p, "memory.max"); got != w {
			t.Errorf("%s memory.max = %s, want %s", p, got, w)
		}
		if got := cgrouptest.ReadFile(t, f.root, p, "memory.high"); got != "max" {
			t.Errorf("%s memory.high = %s", p, got)
		}
	}
}

func TestShrinkTurnedOffOrUnsupportedRefuses(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 500 * mi}, agent.WithShrinkTimeout(-1))
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	want(t, it, intent.Failed, intent.ReasonMemoryBelowUsage)
	if !strings.Contains(it.Status.Message, "refusing, since the kernel would have to reclaim") {
		t.Errorf("message %q", it.Status.Message)
	}
	if calls := f.k.Calls(); len(calls) != 0 {
		t.Errorf("calls %v with shrinking off", calls)
	}
}

// TestShrinkGivesUpWhenTheWorkloadStalls: usage falls, slowly, while the
// container spends most of its time stalled on memory; the shrink stops
// once past the grace period instead of waiting for the timeout.
func TestShrinkGivesUpWhenTheWorkloadStalls(t *testing.T) {
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 500 * mi})
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	f.k.mu.Lock()
	f.k.perCall, f.k.stallPer = mi, 200*time.Millisecond
	f.k.reclaimable["/c"] = 500 * mi
	f.k.mu.Unlock()
	cgrouptest.SetFile(t, f.root, "/c", "memory.current", fmt.Sprint(600*mi))
	start := time.Now()
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	want(t, it, intent.Failed, intent.ReasonMemoryBelowUsage)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %s", took)
	}
	for _, w := range []string{"fully stalled on memory for", "memory stall some"} {
		if !strings.Contains(it.Status.Message, w) {
			t.Errorf("message %q lacks %q", it.Status.Message, w)
		}
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.high"); got != "max" {
		t.Errorf("memory.high = %s", got)
	}
}
