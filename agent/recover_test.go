package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// journaled is an agent on the fake tree root with a journal in dir.
func journaled(t *testing.T, root, dir string, alloc admission.Capacity, opts ...agent.Option) (*agent.Agent, *recorder, *admission.Ledger) {
	t.Helper()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	cg := &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())}
	l := admission.NewLedger(alloc)
	opts = append([]agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithJournal(j)}, opts...)
	a := agent.New(cg, l, opts...)
	t.Cleanup(func() {
		if cg.block != nil {
			close(cg.block)
		}
		a.Close(context.Background())
		j.Close()
	})
	return a, cg, l
}

// crash copies what is on disk of dir's journal now, as a crash would
// leave it, into a new state directory.
func crash(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, journal.FileName))
	if err != nil {
		t.Fatal(err)
	}
	to := t.TempDir()
	if err := os.WriteFile(filepath.Join(to, journal.FileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return to
}

func readJournal(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, journal.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func recoverAgent(t *testing.T, a *agent.Agent) agent.Recovery {
	t.Helper()
	rec, err := a.Recover()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovery %+v", rec)
	return rec
}

var big = admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}

// TestRecoverAfterCrash: a Completed intent gives its container back its
// resources (and the ledger accounts them); the intent being written at the
// crash is not journaled as InProgress (only a shrink is), so it comes back
// Proposed with a newer one queued behind it for the same container, which
// supersedes it as it would have at acceptance.
func TestRecoverAfterCrash(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web", "/pod/api")
	dir := t.TempDir()
	a1, cg1, _ := journaled(t, root, dir, big)
	done := submit(t, a1, spec("web", "/pod/web", map[string]string{"cpu": "500m", "memory": "256Mi"}, map[string]string{"cpu": "1", "memory": "512Mi"}))
	want(t, done, intent.Completed, intent.ReasonApplied)
	cg1.block = make(chan struct{}) // the next writes hang: a crash mid-apply
	inFlight, _, err := a1.Submit(spec("web", "/pod/web", map[string]string{"cpu": "700m"}, map[string]string{"cpu": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, a1, inFlight.ID, intent.InProgress)
	queued, _, err := a1.Submit(spec("web", "/pod/web", map[string]string{"cpu": "800m"}, map[string]string{"cpu": "3"}))
	if err != nil {
		t.Fatal(err)
	}
	api, _, err := a1.Submit(spec("api", "/pod/api", map[string]string{"cpu": "100m"}, nil))
	if err != nil {
		t.Fatal(err)
	}

	a2, _, l2 := journaled(t, root, crash(t, dir), big)
	rec := recoverAgent(t, a2)
	if rec.Intents != 4 || rec.Requeued != 3 || rec.Containers != 1 {
		t.Errorf("recovery %+v, want 4 intents, 3 requeued, 1 container", rec)
	}
	if got, _ := a2.Get(done.ID); got.Status.State != intent.Completed || !got.Status.AcceptedAt.Equal(done.Status.AcceptedAt) {
		t.Errorf("completed intent after recovery: %+v", got.Status)
	}
	again := settle(t, a2, inFlight.ID)
	want(t, again, intent.Superseded, intent.ReasonSuperseded)
	if again.Status.SupersededBy != queued.ID {
		t.Errorf("superseded by %q, want %s", again.Status.SupersededBy, queued.ID)
	}
	last := settle(t, a2, queued.ID)
	want(t, last, intent.Completed, intent.ReasonApplied)
	if !strings.Contains(last.Status.Message, "restart") {
		t.Errorf("message does not say it was recovered: %q", last.Status.Message)
	}
	want(t, settle(t, a2, api.ID), intent.Completed, "")
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "cpu.max"); got != "300000 100000" {
		t.Errorf("cpu.max %q after recovery", got)
	}
	// The memory declared by the first intent is still managed and held.
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "memory.max"); got != fmt.Sprint(512<<20) {
		t.Errorf("memory.max %q after recovery", got)
	}
	if got := l2.Allocated(); got.MilliCPU != 900 || got.Memory != 256<<20 {
		t.Errorf("ledger after recovery %+v, want 900m and 256Mi", got)
	}
	ids := []string{}
	for _, it := range a2.List(agent.Filter{}, "") {
		ids = append(ids, it.ID)
	}
	if fmt.Sprint(ids) != fmt.Sprint([]string{done.ID, inFlight.ID, queued.ID, api.ID}) {
		t.Errorf("order after recovery %v", ids)
	}
}

// TestRecoverShrinkInProgress: a shrink journals its intent InProgress,
// and waits for it, before it lowers memory.high; after a crash in the
// middle, recovery puts memory.high back and applies the intent again.
func TestRecoverShrinkInProgress(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	f := newShrinkFixture(t, map[string]int64{"/pod/web": 600 * mi}, map[string]int64{"/pod/web": 500 * mi}, agent.WithJournal(j))
	want(t, submit(t, f.a, memSpec("web", "/pod/web", "", "1Gi")), intent.Completed, "")
	block := make(chan struct{})
	f.cg().block = block
	t.Cleanup(func() { close(block) })
	it, _, err := f.a.Submit(memSpec("web", "/pod/web", "", "512Mi"))
	if err != nil {
		t.Fatal(err)
	}
	// The reclaim is done and memory.max's write hangs: a crash mid-shrink.
	for i := 0; f.cg().blocked.Load() == 0; i++ {
		if i > 500 {
			t.Fatal("the write after the reclaim never came")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := cgrouptest.ReadFile(t, f.root, "/pod/web", "memory.high"); v == "max" {
		t.Fatalf("memory.high %q: the shrink did not lower it", v)
	}
	state := crash(t, dir)
	if !strings.Contains(readJournal(t, state), `"state":"InProgress"`) {
		t.Fatal("memory.high was lowered before the intent was journaled InProgress")
	}
	a2, _, _ := journaled(t, f.root, state, big)
	recoverAgent(t, a2)
	got := settle(t, a2, it.ID)
	want(t, got, intent.Completed, "")
	if v := cgrouptest.ReadFile(t, f.root, "/pod/web", "memory.high"); v != "max" {
		t.Errorf("memory.high %q after recovery, want max", v)
	}
	if got.Status.Attempts != 2 {
		t.Errorf("attempts %d, want 2", got.Status.Attempts)
	}
	if v := cgrouptest.ReadFile(t, f.root, "/pod/web", "memory.max"); v != fmt.Sprint(512*mi) {
		t.Errorf("memory.max %q", v)
	}
}

// secondWaitFails is a journal that takes the first record it is waited
// for (an acceptance) and fails every wait after it.
type secondWaitFails struct {
	*journal.Journal
	waits atomic.Int32
}

func (s *secondWaitFails) Wait(t journal.Ticket) error {
	if s.waits.Add(1) > 1 {
		return errors.New("disk full")
	}
	return s.Journal.Wait(t)
}

// TestShrinkNotJournaledNotBegun: a shrink whose InProgress record cannot
// be put on disk is refused before memory.high is touched.
func TestShrinkNotJournaledNotBegun(t *testing.T) {
	j, err := journal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	sj := &secondWaitFails{Journal: j}
	f := newShrinkFixture(t, map[string]int64{"/c": 600 * mi}, map[string]int64{"/c": 500 * mi}, agent.WithJournal(sj))
	// The starting limit is applied before usage is set: no shrink, one wait.
	want(t, submit(t, f.a, memSpec("c", "/c", "", "1Gi")), intent.Completed, "")
	sj.waits.Store(0)
	it := submit(t, f.a, memSpec("c", "/c", "", "512Mi"))
	want(t, it, intent.Failed, intent.ReasonMemoryBelowUsage)
	if !strings.Contains(it.Status.Message, "not reclaimed first") || !strings.Contains(it.Status.Message, "disk full") {
		t.Errorf("message %q", it.Status.Message)
	}
	if calls := f.k.Calls(); len(calls) != 0 {
		t.Errorf("memory.high touched: %v", calls)
	}
	if got := cgrouptest.ReadFile(t, f.root, "/c", "memory.max"); got != fmt.Sprint(1<<30) {
		t.Errorf("memory.max = %s", got)
	}
}

func TestRecoverDeferredStaysDeferred(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	dir := t.TempDir()
	small := admission.Capacity{MilliCPU: 1000, Memory: gi}
	a1, _, _ := journaled(t, root, dir, small)
	// Deferred needs capacity held elsewhere: another container.
	cgrouptest.AddFake(t, root, "/pod/db")
	want(t, submit(t, a1, spec("db", "/pod/db", map[string]string{"cpu": "800m"}, nil)), intent.Completed, "")
	d := submit(t, a1, spec("web", "/pod/web", map[string]string{"cpu": "500m"}, nil))
	want(t, d, intent.Deferred, intent.ReasonDeferred)

	a2, _, _ := journaled(t, root, crash(t, dir), small)
	recoverAgent(t, a2)
	got := settle(t, a2, d.ID)
	want(t, got, intent.Deferred, intent.ReasonDeferred)
	if !got.Status.AcceptedAt.Equal(d.Status.AcceptedAt) {
		t.Errorf("accepted at %v, was %v", got.Status.AcceptedAt, d.Status.AcceptedAt)
	}
	// db's 800m is accounted again, so web still does not fit; once db
	// shrinks, web goes ahead.
	want(t, submit(t, a2, spec("db", "/pod/db", map[string]string{"cpu": "200m"}, nil)), intent.Completed, "")
	want(t, settleTerminal(t, a2, d.ID), intent.Completed, "")
}

func TestRecoverContainerGone(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	dir := t.TempDir()
	a1, cg1, _ := journaled(t, root, dir, big)
	cg1.block = make(chan struct{})
	it, _, err := a1.Submit(spec("web", "/pod/web", map[string]string{"cpu": "100m"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, a1, it.ID, intent.InProgress)
	state := crash(t, dir)
	if err := os.RemoveAll(filepath.Join(root, "pod", "web")); err != nil {
		t.Fatal(err)
	}
	a2, _, _ := journaled(t, root, state, big)
	rec := recoverAgent(t, a2)
	if rec.Failed != 1 {
		t.Errorf("recovery %+v, want 1 failed", rec)
	}
	got, err := a2.Get(it.ID)
	if err != nil {
		t.Fatal(err)
	}
	want(t, got, intent.Failed, intent.ReasonContainerGone)
}

// TestRecoverRuntimeTargetFollowsNewContainer: a container of the runtime
// is found again by pod UID and name, in its new cgroup.
func TestRecoverRuntimeTargetFollowsNewContainer(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/kubepods/pod-u1/c1", "/kubepods/pod-u1/c2")
	dir := t.TempDir()
	newAgent := func(dir string, rt *fakeRuntime, pids map[int]string) (*agent.Agent, *recorder) {
		j, err := journal.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		cg := &pidCgroups{recorder: &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())}, pids: pids}
		a := agent.New(cg, admission.NewLedger(big), agent.WithRuntime(rt), agent.WithJournal(j),
			agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		t.Cleanup(func() {
			if cg.block != nil {
				close(cg.block)
			}
			a.Close(context.Background())
			j.Close()
		})
		return a, cg.recorder
	}
	rt1 := &fakeRuntime{ctr: cri.Container{ID: "c1", Name: "web", PodUID: "u1", PID: 100, State: "CONTAINER_RUNNING"}}
	rt1.apply = func(cri.Resources) error { return errors.New("no") } // the agent writes the files itself
	a1, cg1 := newAgent(dir, rt1, map[int]string{100: "/kubepods/pod-u1/c1"})
	cg1.block = make(chan struct{})
	it, _, err := a1.Submit(podSpec(nil, map[string]string{"cpu": "1500m"}))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, a1, it.ID, intent.InProgress)
	state := crash(t, dir)

	rt2 := &fakeRuntime{ctr: cri.Container{ID: "c1-new", Name: "web", PodUID: "u1", PID: 101, State: "CONTAINER_RUNNING"}}
	rt2.apply = rt1.apply
	a2, _ := newAgent(state, rt2, map[int]string{101: "/kubepods/pod-u1/c2"})
	recoverAgent(t, a2)
	want(t, settle(t, a2, it.ID), intent.Completed, "")
	if v := cgrouptest.ReadFile(t, root, "/kubepods/pod-u1/c2", "cpu.max"); v != "150000 100000" {
		t.Errorf("new cgroup's cpu.max %q", v)
	}
	cs := a2.Containers()
	if len(cs) != 1 || cs[0].ContainerID != "c1-new" || cs[0].CgroupPath != "/kubepods/pod-u1/c2" {
		t.Errorf("containers %+v", cs)
	}
}

// failingJournal refuses every record.
type failingJournal struct{ j *journal.Journal }

func (f failingJournal) Append(r journal.Record) journal.Ticket { return f.j.Append(r) }
func (f failingJournal) Wait(journal.Ticket) error              { return errors.New("disk full") }
func (f failingJournal) Records() []journal.Record              { return nil }

func TestJournalFailureRejectsIntent(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	j, err := journal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	cg := &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())}
	a := agent.New(cg, admission.NewLedger(big), agent.WithJournal(failingJournal{j}), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer a.Close(context.Background())
	_, _, err = a.Submit(spec("web", "/pod/web", map[string]string{"cpu": "100m"}, map[string]string{"cpu": "1"}))
	if !errors.Is(err, agent.ErrJournal) {
		t.Fatalf("Submit = %v, want ErrJournal", err)
	}
	if l := a.List(agent.Filter{}, ""); len(l) != 0 {
		t.Errorf("intents after a failed journal write: %+v", l)
	}
	if w := cg.Writes(); len(w) != 0 {
		t.Errorf("writes after a failed journal write: %v", w)
	}
}

// TestConcurrentSubmitsWithJournal: submissions that come back from their
// sync out of order never let an older intent win over a newer one.
func TestConcurrentSubmitsWithJournal(t *testing.T) {
	names := []string{"a", "b", "c"}
	root := cgrouptest.FakeTree(t, "/pod/a", "/pod/b", "/pod/c")
	a, _, _ := journaled(t, root, t.TempDir(), big)
	var wg sync.WaitGroup
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				n := names[(g+i)%3]
				if _, _, err := a.Submit(spec(n, "/pod/"+n, map[string]string{"cpu": "10m"}, map[string]string{"cpu": fmt.Sprintf("%dm", 100+g*10+i)})); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for _, n := range names {
		its := a.List(agent.Filter{Container: n}, "")
		last := settleTerminal(t, a, its[len(its)-1].ID)
		want(t, last, intent.Completed, "")
		for _, it := range its {
			settleTerminal(t, a, it.ID)
		}
	}
}

// TestRecoverOlderIntentBehindNewerCompleted: a crash after a newer intent
// completed but before the older one's Superseded was on disk must not
// apply the older one.
func TestRecoverOlderIntentBehindNewerCompleted(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	dir := t.TempDir()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	older := intent.Intent{ID: "older", Spec: spec("web", "/pod/web", nil, map[string]string{"cpu": "1"}),
		Status: intent.Status{State: intent.Proposed, AcceptedAt: now, UpdatedAt: now}}
	older.Spec.ID = older.ID
	newer := intent.Intent{ID: "newer", Spec: spec("web", "/pod/web", nil, map[string]string{"cpu": "2"}),
		Status: intent.Status{State: intent.Completed, AcceptedAt: now, UpdatedAt: now, CompletedAt: &now}}
	newer.Spec.ID = newer.ID
	for _, r := range []journal.Record{{Seq: 1, Container: "/pod/web", Intent: older},
		{Seq: 2, Container: "/pod/web", Intent: newer, Resources: &journal.Resources{Resources: intent.Resources{CPULimit: 2000}, CPU: true}}} {
		if err := j.Wait(j.Append(r)); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()
	a, cg, _ := journaled(t, root, dir, big)
	recoverAgent(t, a)
	got, _ := a.Get("older")
	want(t, got, intent.Superseded, intent.ReasonSuperseded)
	if got.Status.SupersededBy != "newer" {
		t.Errorf("superseded by %q", got.Status.SupersededBy)
	}
	if w := cg.Writes(); len(w) != 0 {
		t.Errorf("writes %v", w)
	}
	if cs := a.Containers(); len(cs) != 1 || cs[0].Resources.CPULimit != 2000 {
		t.Errorf("containers %+v", cs)
	}
}

// TestSameIDWhileJournaling: a retry of an intent still being journaled
// waits for it and gets the same intent, not a second one.
func TestSameIDWhileJournaling(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	a, _, _ := journaled(t, root, t.TempDir(), big)
	s := spec("web", "/pod/web", map[string]string{"cpu": "10m"}, map[string]string{"cpu": "1"})
	s.ID = "same"
	var wg sync.WaitGroup
	var created sync.Map
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, c, err := a.Submit(s)
			if err != nil || it.ID != "same" {
				t.Errorf("Submit = %+v, %v", it, err)
			}
			created.Store(i, c)
		}()
	}
	wg.Wait()
	n := 0
	created.Range(func(_, v any) bool {
		if v.(bool) {
			n++
		}
		return true
	})
	if n != 1 {
		t.Errorf("%d submissions created the intent, want 1", n)
	}
	if l := a.List(agent.Filter{}, ""); len(l) != 1 {
		t.Errorf("%d intents", len(l))
	}
}

// TestRecoverForgottenStaysForgotten: a container forgotten before the
// crash does not come back with its last intent's resources, nor hold them
// on the ledger, while another one does.
func TestRecoverForgottenStaysForgotten(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/a", "/b")
	dir := t.TempDir()
	a1, _, _ := journaled(t, root, dir, big)
	want(t, submit(t, a1, spec("a", "/a", map[string]string{"cpu": "1"}, nil)), intent.Completed, "")
	want(t, submit(t, a1, spec("b", "/b", map[string]string{"cpu": "500m"}, nil)), intent.Completed, "")
	if err := a1.Forget("a"); err != nil {
		t.Fatal(err)
	}
	for i := 0; !strings.Contains(readJournal(t, dir), `"Forgotten"`); i++ {
		if i > 500 {
			t.Fatal("the forget never reached the journal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	a2, _, l2 := journaled(t, root, crash(t, dir), big)
	recoverAgent(t, a2)
	cs := a2.Containers()
	if len(cs) != 1 || cs[0].Name != "b" {
		t.Errorf("containers after recovery: %+v", cs)
	}
	if got := l2.Allocated().MilliCPU; got != 500 {
		t.Errorf("allocated %dm after recovery, want b's 500m", got)
	}
}

// TestRecoverForgetThenManagedAgain (issue 15, finding 3): a container
// forgotten, then managed again after a restart, keeps its new resources
// across later restarts. The Forget marker took a sequence number the
// restarted agent handed out again, so the marker and the new intent tied,
// and replay ordered them either way.
func TestRecoverForgetThenManagedAgain(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/a")
	dir := t.TempDir()
	a1, _, _ := journaled(t, root, dir, big)
	want(t, submit(t, a1, spec("a", "/a", map[string]string{"cpu": "1"}, nil)), intent.Completed, "")
	if err := a1.Forget("a"); err != nil {
		t.Fatal(err)
	}
	for i := 0; !strings.Contains(readJournal(t, dir), `"Forgotten"`); i++ {
		if i > 500 {
			t.Fatal("the forget never reached the journal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	dir2 := crash(t, dir)
	a2, _, _ := journaled(t, root, dir2, big)
	recoverAgent(t, a2)
	it := submit(t, a2, spec("a", "/a", map[string]string{"cpu": "700m"}, nil))
	want(t, it, intent.Completed, "")
	completed := func() bool {
		for _, line := range strings.Split(readJournal(t, dir2), "\n") {
			if strings.Contains(line, `"id":"`+it.ID+`"`) && strings.Contains(line, `"state":"Completed"`) {
				return true
			}
		}
		return false
	}
	for i := 0; !completed(); i++ { // appended without waiting
		if i > 500 {
			t.Fatal("the intent's Completed record never reached the journal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Replay's order of records that tie is that of a map: restart several
	// times so that a tie shows.
	for i := range 8 {
		a3, _, l3 := journaled(t, root, crash(t, dir2), big)
		recoverAgent(t, a3)
		if cs := a3.Containers(); len(cs) != 1 || cs[0].Name != "a" {
			t.Fatalf("restart %d: containers after recovery: %+v", i, cs)
		}
		if got := l3.Allocated().MilliCPU; got != 700 {
			t.Fatalf("restart %d: allocated %dm after recovery, want a's 700m", i, got)
		}
	}
}

// TestRecoverForgottenAfterCompaction (issue 15, finding 4): compaction
// keeps a forgotten container's last Completed intent as history; it must
// keep the Forget marker with it, or a restart manages the container again
// and gives it its old capacity on the ledger.
func TestRecoverForgottenAfterCompaction(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/a", "/b")
	dir := t.TempDir()
	j, err := journal.Open(dir, journal.WithCompactAt(1<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	cg := &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())}
	a1 := agent.New(cg, admission.NewLedger(big), agent.WithJournal(j), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer a1.Close(context.Background())
	want(t, submit(t, a1, spec("a", "/a", map[string]string{"cpu": "1"}, nil)), intent.Completed, "")
	if err := a1.Forget("a"); err != nil {
		t.Fatal(err)
	}
	before := j.Stats().Compactions
	for i := 0; j.Stats().Compactions == before; i++ {
		if i > 200 {
			t.Fatalf("no compaction after %d intents: %+v", i, j.Stats())
		}
		want(t, submit(t, a1, spec("b", "/b", map[string]string{"cpu": fmt.Sprintf("%dm", 100+i%2*100)}, nil)), intent.Completed, "")
	}
	a2, _, l2 := journaled(t, root, crash(t, dir), big)
	recoverAgent(t, a2)
	for _, c := range a2.Containers() {
		if c.Name == "a" {
			t.Errorf("the forgotten container is managed again after compaction and a restart: %+v", c)
		}
	}
	if got := l2.Allocated().MilliCPU; got > 200 {
		t.Errorf("allocated %dm after recovery, want only b's (at most 200m)", got)
	}
}

// TestRecoverRestartNotRepeated: an intent whose resizePolicy restarts the
// container is journaled as restarting it before the restart begins. After
// a crash that came once the restart was done (the runtime runs a newer
// attempt), recovery resizes that attempt in place and does not restart it
// again; after a crash before the restart (the same container runs), it
// restarts it.
func TestRecoverRestartNotRepeated(t *testing.T) {
	for _, restartedBeforeCrash := range []bool{true, false} {
		t.Run(fmt.Sprintf("restarted_before_crash=%v", restartedBeforeCrash), func(t *testing.T) {
			root := cgrouptest.FakeTree(t, "/kubepods/pod-u1/c1", "/kubepods/pod-u1/c2")
			newAgent := func(dir string, rt *fakeRuntime, cg *pidCgroups) *agent.Agent {
				j, err := journal.Open(dir)
				if err != nil {
					t.Fatal(err)
				}
				a := agent.New(cg, admission.NewLedger(big), agent.WithRuntime(rt), agent.WithJournal(j),
					agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
				t.Cleanup(func() {
					a.Close(context.Background())
					j.Close()
				})
				return a
			}
			newCgroups := func() *pidCgroups {
				return &pidCgroups{recorder: &recorder{Manager: cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())},
					pids: map[int]string{100: "/kubepods/pod-u1/c1", 200: "/kubepods/pod-u1/c2"}}
			}
			restarted := func(cg *pidCgroups) func(r cri.Resources) cri.Container {
				return func(r cri.Resources) cri.Container {
					m := r.MemoryLimit
					if err := cg.Manager.Write("/kubepods/pod-u1/c2", cgroup.Resources{MemoryMax: &m}); err != nil {
						t.Error(err)
					}
					return cri.Container{ID: "c2", Name: "web", PodUID: "u1", PID: 200, State: "CONTAINER_RUNNING", RestartCount: 1}
				}
			}
			s := podSpec(map[string]string{"memory": "64Mi"}, map[string]string{"memory": "64Mi"})
			s.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}

			dir := t.TempDir()
			cg1 := newCgroups()
			rt1 := &fakeRuntime{ctr: cri.Container{ID: "c1", Name: "web", PodUID: "u1", PID: 100, State: "CONTAINER_RUNNING"}}
			var state string
			rt1.onRestart = func(r cri.Resources) cri.Container {
				// What is on disk the moment the runtime is asked to restart.
				state = crash(t, dir)
				return restarted(cg1)(r)
			}
			a1 := newAgent(dir, rt1, cg1)
			it := submit(t, a1, s)
			want(t, it, intent.Completed, intent.ReasonApplied)
			if state == "" || rt1.restarts != 1 {
				t.Fatalf("the runtime was asked to restart %d times", rt1.restarts)
			}
			if !strings.Contains(readJournal(t, state), `"restarting":"c1"`) {
				t.Fatalf("the restart was not on disk before it began:\n%s", readJournal(t, state))
			}
			if !restartedBeforeCrash {
				// The crash came first: the runtime still runs c1, as it was.
				cgrouptest.SetFile(t, root, "/kubepods/pod-u1/c2", "memory.max", "max")
			}

			ctr := rt1.ctr
			if !restartedBeforeCrash {
				ctr = cri.Container{ID: "c1", Name: "web", PodUID: "u1", PID: 100, State: "CONTAINER_RUNNING"}
			}
			cg2 := newCgroups()
			rt2 := &fakeRuntime{ctr: ctr}
			rt2.onRestart = restarted(cg2)
			rt2.apply = func(r cri.Resources) error {
				if r.MemoryLimit == 0 {
					return nil
				}
				m := r.MemoryLimit
				return cg2.Manager.Write("/kubepods/pod-u1/c2", cgroup.Resources{MemoryMax: &m})
			}
			a2 := newAgent(state, rt2, cg2)
			recoverAgent(t, a2)
			got := settle(t, a2, it.ID)
			want(t, got, intent.Completed, "")
			wantRestarts := 0
			if !restartedBeforeCrash {
				wantRestarts = 1
			}
			if rt2.restarts != wantRestarts {
				t.Errorf("restarted %d times after recovery, want %d", rt2.restarts, wantRestarts)
			}
			if !got.Status.Restarted || got.Status.ContainerID != "c2" {
				t.Errorf("status %+v", got.Status)
			}
			if v := cgrouptest.ReadFile(t, root, "/kubepods/pod-u1/c2", "memory.max"); v != fmt.Sprint(64<<20) {
				t.Errorf("memory.max of the running attempt %s", v)
			}
			if cs := a2.Containers(); len(cs) != 1 || cs[0].ContainerID != "c2" {
				t.Errorf("containers %+v", cs)
			}
			t.Logf("%s: %s", got.Status.Reason, got.Status.Message)
		})
	}
}

// TestRecoverWriteBeforeShutdownRefusal: an intent being written when the
// agent was killed in its shutdown (Proposed on disk: a plain write is not
// journaled InProgress), with a newer one that the shutdown refused as it
// was journaled, is applied again, not superseded by the refused one.
func TestRecoverWriteBeforeShutdownRefusal(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/web")
	dir := t.TempDir()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	key := agent.Key{Cgroup: "/pod/web"}.String()
	now := time.Now()
	inFlight := spec("web", "/pod/web", map[string]string{"cpu": "100m"}, map[string]string{"cpu": "700m"})
	inFlight.ID = "in-flight"
	refused := spec("web", "/pod/web", map[string]string{"cpu": "100m"}, map[string]string{"cpu": "900m"})
	refused.ID = "refused"
	for _, r := range []journal.Record{
		{Seq: 1, Container: key, Intent: intent.Intent{ID: inFlight.ID, Origin: intent.OriginAPI, Spec: inFlight,
			Status: intent.Status{State: intent.Proposed, AcceptedAt: now, UpdatedAt: now}}},
		{Seq: 2, Container: key, Intent: intent.Intent{ID: refused.ID, Origin: intent.OriginAPI, Spec: refused,
			Status: intent.Status{State: intent.Failed, Reason: intent.ReasonShutdown, AcceptedAt: now, UpdatedAt: now, CompletedAt: &now}}},
	} {
		if err := j.Wait(j.Append(r)); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	a, _, _ := journaled(t, root, dir, big)
	recoverAgent(t, a)
	want(t, settle(t, a, inFlight.ID), intent.Completed, intent.ReasonApplied)
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "cpu.max"); got != "70000 100000" {
		t.Errorf("cpu.max %q after recovery", got)
	}
}
