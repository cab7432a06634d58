package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// The benchmarks below wire the agent as the daemon does (a journal that
// fsyncs, metrics, logging at info) on a fake cgroup tree, so that they
// show the agent's own cost of a resize without the kernel's: in the
// agent (AcceptedAt to CompletedAt) and as an API client sees it.

func daemonOpts(b testing.TB) []agent.Option {
	if os.Getenv("BENCH_NOJOURNAL") != "" {
		return []agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithMetrics(metrics.New(prometheus.NewRegistry()))}
	}
	j, err := journal.Open(filepath.Join(b.TempDir(), "state"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { j.Close() })
	return []agent.Option{
		agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		agent.WithMetrics(metrics.New(prometheus.NewRegistry())),
		agent.WithJournal(j),
	}
}

func benchPaths(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("/bench/%04d", i)
	}
	return out
}

func cpuSpec(i int, path string, milli int64) intent.Spec {
	v := map[string]string{"cpu": fmt.Sprintf("%dm", milli)}
	return spec(fmt.Sprintf("c%d", i), path, v, v)
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per resize since start (client
// and agent both: on a loaded host this is steadier than the latencies).
func reportCPU(b *testing.B, start time.Duration, n int) {
	b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(n), "cpu-ns/resize")
}

// reportQuantiles reports the p50 and p99 of ds.
func reportQuantiles(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))].Nanoseconds()) }
	b.ReportMetric(q(0.5), name+"-p50-ns")
	b.ReportMetric(q(0.99), name+"-p99-ns")
}

// BenchmarkResizeInAgent: one bare cgroup resized again and again, from
// Submit to the watch stream's Completed, with the agent's own
// accepted-to-completed reported.
func BenchmarkResizeInAgent(b *testing.B) {
	root := cgrouptest.FakeTree(b, "/bench/0000")
	a := agent.New(cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()),
		admission.NewLedger(admission.Capacity{MilliCPU: 100000, Memory: 1 << 40}), daemonOpts(b)...)
	b.Cleanup(func() { a.Close(context.Background()) })
	var in []time.Duration
	cpu0 := cpuTime()
	for i := 0; b.Loop(); i++ {
		it, _, err := a.Submit(cpuSpec(0, "/bench/0000", 200+int64(i%2)*100))
		if err != nil {
			b.Fatal(err)
		}
		done := settleB(b, a, it.ID)
		if done.Status.State != intent.Completed {
			b.Fatalf("intent %s: %s %s", done.ID, done.Status.State, done.Status.Message)
		}
		in = append(in, done.Status.CompletedAt.Sub(done.Status.AcceptedAt))
	}
	reportCPU(b, cpu0, len(in))
	reportQuantiles(b, "in-agent", in)
}

func settleB(b *testing.B, a *agent.Agent, id string) intent.Intent {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for e := range a.Watch(ctx, agent.Filter{IntentID: id}) {
		if s := e.Intent.Status.State; s.Terminal() {
			return e.Intent
		}
	}
	b.Fatalf("intent %s did not settle", id)
	return intent.Intent{}
}

func serveBench(b *testing.B, n int) (*api.Client, []string) {
	paths := benchPaths(n)
	root := cgrouptest.FakeTree(b, paths...)
	s := agenttest.ServeWith(b, cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()),
		admission.Capacity{MilliCPU: 1 << 30, Memory: 1 << 50}, daemonOpts(b)...)
	c := api.NewClient(s.Socket)
	b.Cleanup(c.CloseIdleConnections)
	return c, paths
}

// apiResize submits s through the API and waits for it to settle: in the
// submission's own answer (?wait=, as resizectl does), or with watch, on a
// watch stream after it.
func apiResize(b *testing.B, c *api.Client, s intent.Spec, watch bool) (client, server time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	var it intent.Intent
	var err error
	if watch {
		if it, _, err = c.Submit(ctx, s); err == nil {
			it, err = c.WaitSettled(ctx, it.ID)
		}
	} else {
		it, _, err = c.SubmitWait(ctx, s, 30*time.Second)
	}
	if err != nil || it.Status.State != intent.Completed {
		b.Errorf("intent %s: %v %s %s", it.ID, err, it.Status.State, it.Status.Message)
		return
	}
	return time.Since(t0), it.Status.CompletedAt.Sub(it.Status.AcceptedAt)
}

// BenchmarkResizeAPI: as BenchmarkResizeInAgent, through the API on a
// unix socket: the submission answered once settled (wait), as resizectl
// does, and submit then watch (watch). roundtrip is the peer of both: a GET
// of a settled intent, the same answer over the same connection with nothing
// done for it, so that what a resize adds to the API's own round trip shows.
func BenchmarkResizeAPI(b *testing.B) {
	b.Run("roundtrip", func(b *testing.B) {
		c, paths := serveBench(b, 1)
		_, _ = apiResize(b, c, cpuSpec(0, paths[0], 200), false)
		ctx := context.Background()
		its, err := c.List(ctx, "", "")
		if err != nil || len(its) == 0 {
			b.Fatalf("listing the intent: %v (%d)", err, len(its))
		}
		var cl []time.Duration
		cpu0 := cpuTime()
		for b.Loop() {
			t0 := time.Now()
			if _, err := c.Get(ctx, its[0].ID); err != nil {
				b.Fatal(err)
			}
			cl = append(cl, time.Since(t0))
		}
		reportCPU(b, cpu0, len(cl))
		reportQuantiles(b, "client", cl)
	})
	for _, watch := range []bool{false, true} {
		name := "wait"
		if watch {
			name = "watch"
		}
		b.Run(name, func(b *testing.B) {
			c, paths := serveBench(b, 1)
			var cl, in []time.Duration
			cpu0 := cpuTime()
			for i := 0; b.Loop(); i++ {
				x, y := apiResize(b, c, cpuSpec(0, paths[0], 200+int64(i%2)*100), watch)
				cl, in = append(cl, x), append(in, y)
			}
			reportCPU(b, cpu0, len(cl))
			reportQuantiles(b, "client", cl)
			reportQuantiles(b, "in-agent", in)
		})
	}
}

// BenchmarkThroughput: 16 API clients, each resizing its share of 1,000
// bare cgroups one after another; b.N resizes in all.
func BenchmarkThroughput(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("cgroups=%d", n), func(b *testing.B) {
			c, paths := serveBench(b, n)
			workers := min(16, n)
			// Register every cgroup first: the first intent reads it.
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := w; i < n; i += workers {
						apiResize(b, c, cpuSpec(i, paths[i], 100), false)
					}
				})
			}
			wg.Wait()
			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime()
			var mu sync.Mutex
			var in []time.Duration
			for w := range workers {
				k := b.N / workers
				if w < b.N%workers {
					k++
				}
				wg.Go(func() {
					var mine []int
					for i := w; i < n; i += workers {
						mine = append(mine, i)
					}
					for j := range k {
						i := mine[j%len(mine)]
						_, y := apiResize(b, c, cpuSpec(i, paths[i], 200+int64(j%2)*100), false)
						mu.Lock()
						in = append(in, y)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "resizes/s")
			reportCPU(b, cpu0, b.N)
			reportQuantiles(b, "in-agent", in)
		})
	}
}

// TestOrderPerContainerUnderLoad: 16 clients submit to 50 containers at
// once, several to the same container without waiting, through a journal
// whose syncs they share. Per container, in acceptance order, every
// intent but the last ends Completed or Superseded by a later one, none
// is lost, and the cgroup holds the last accepted intent's value.
func TestOrderPerContainerUnderLoad(t *testing.T) {
	const containers, clients, each = 50, 16, 40
	paths := benchPaths(containers)
	root := cgrouptest.FakeTree(t, paths...)
	a := agent.New(cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()),
		admission.NewLedger(admission.Capacity{MilliCPU: 1 << 30, Memory: 1 << 50}), daemonOpts(t)...)
	t.Cleanup(func() { a.Close(context.Background()) })
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			for k := range each {
				i := (w*each + k) % containers
				if _, _, err := a.Submit(cpuSpec(i, paths[i], 100+int64(w*each+k))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	total := 0
	for i, p := range paths {
		var list []intent.Intent
		for {
			list = a.List(agent.Filter{Container: p}, "")
			if !slices.ContainsFunc(list, func(it intent.Intent) bool { return !it.Status.State.Terminal() }) || ctx.Err() != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		total += len(list)
		ids := map[string]int{}
		for k, it := range list {
			ids[it.ID] = k
		}
		for k, it := range list {
			last := k == len(list)-1
			switch s := it.Status.State; {
			case last && s != intent.Completed:
				t.Errorf("container %d: the last intent %s is %s (%s)", i, it.ID, s, it.Status.Message)
			case !last && s == intent.Superseded:
				if by, ok := ids[it.Status.SupersededBy]; !ok || by <= k {
					t.Errorf("container %d: intent %d superseded by %q, not a later one", i, k, it.Status.SupersededBy)
				}
			case !last && s != intent.Completed:
				t.Errorf("container %d: intent %s is %s: %s", i, it.ID, s, it.Status.Message)
			}
		}
		if len(list) > 0 {
			lim := list[len(list)-1].Spec.Resources.Limits.Cpu().MilliValue()
			if got, want := cgrouptest.ReadFile(t, root, p, "cpu.max"), fmt.Sprintf("%d 100000", lim*100); got != want {
				t.Errorf("container %d: cpu.max %q, want %q (the last accepted intent's)", i, got, want)
			}
		}
	}
	if total != clients*each {
		t.Errorf("%d intents listed, %d submitted", total, clients*each)
	}
}

// TestResyncLeavesWatchedToTheWatcher: a Resync does not look at the
// containers the exit watcher watches, but every FullResync-th looks at
// them all, in case the watcher missed an event; an unwatched container is
// looked at every time.
func TestResyncLeavesWatchedToTheWatcher(t *testing.T) {
	ex := newExits()
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/a")
	f.a = agent.New(f.cg, f.l, agent.WithExitWatcher(ex), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = f.a.Close(context.Background()) })
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m"}, nil)), intent.Completed, "")
	// The outcome is published before the worker lets go of the
	// container, and a resync passes over a container still held.
	for deadline := time.Now().Add(5 * time.Second); !f.a.Idle(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the container's worker never let go")
		}
	}
	if !ex.isWatched("/a") {
		t.Fatal("/a is not watched")
	}
	if err := os.RemoveAll(filepath.Join(f.root, "a")); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < agent.FullResync; i++ {
		f.a.Resync()
		if f.a.ManagedContainers() != 1 {
			t.Fatalf("resync %d looked at a watched container", i)
		}
	}
	f.a.Resync()
	if n := f.a.ManagedContainers(); n != 0 {
		t.Errorf("resync %d left %d managed containers, want 0 (its cgroup is gone)", agent.FullResync, n)
	}
}

// TestWatcherErrorLooksAtAll: when the exit watcher says it may have
// missed events (an inotify queue overflow), Run looks at every container
// at once, and forgets one whose cgroup went unreported, rather than at the
// next full round minutes later.
func TestWatcherErrorLooksAtAll(t *testing.T) {
	ex := newExits()
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/a")
	f.a = agent.New(f.cg, f.l, agent.WithExitWatcher(ex), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = f.a.Close(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.a.Run(ctx, time.Hour) }() // no periodic resync in the test's time
	t.Cleanup(func() { cancel(); <-done })
	want(t, submit(t, f.a, spec("a", "/a", map[string]string{"cpu": "500m"}, nil)), intent.Completed, "")
	for deadline := time.Now().Add(5 * time.Second); !f.a.Idle() || !ex.isWatched("/a"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the container's worker never let go, or /a is not watched")
		}
	}
	if err := os.RemoveAll(filepath.Join(f.root, "a")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if f.a.ManagedContainers() != 1 {
		t.Fatal("the container was forgotten before the watcher said anything")
	}
	ex.errs <- errors.New("fsnotify: queue or buffer overflow")
	for deadline := time.Now().Add(5 * time.Second); f.a.ManagedContainers() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("after the watcher's error the container whose cgroup is gone is still managed")
		}
	}
}

// BenchmarkHeldMemory reports the heap the agent holds with 1,000 managed
// containers after b.N resizes of each (the history keeps 10,000 intents).
func BenchmarkHeldMemory(b *testing.B) {
	paths := benchPaths(1000)
	root := cgrouptest.FakeTree(b, paths...)
	a := agent.New(cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()),
		admission.NewLedger(admission.Capacity{MilliCPU: 1 << 30, Memory: 1 << 50}), daemonOpts(b)...)
	b.Cleanup(func() { a.Close(context.Background()) })
	for n := 0; b.Loop(); n++ {
		var last string
		for i, p := range paths {
			it, _, err := a.Submit(cpuSpec(i, p, 100+int64(n%2)*100))
			if err != nil {
				b.Fatal(err)
			}
			last = it.ID
		}
		settleB(b, a, last)
	}
	for _, p := range paths {
		for _, it := range a.List(agent.Filter{Container: p}, "") {
			if !it.Status.State.Terminal() {
				settleB(b, a, it.ID)
			}
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	if p := os.Getenv("HELD_HEAP_PROFILE"); p != "" {
		f, _ := os.Create(p)
		pprof.WriteHeapProfile(f)
		f.Close()
	}
	b.ReportMetric(float64(len(a.List(agent.Filter{}, ""))), "intents-held")
}

// TestSharedSpecs: intents that ask for the same resources share one copy
// of them, which shares nothing with the caller's, and each shows what it
// was asked with.
func TestSharedSpecs(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}, "/a", "/b")
	s1 := spec("a", "/a", map[string]string{"cpu": "1"}, map[string]string{"cpu": "1"})
	it1, _, err := f.a.Submit(s1)
	if err != nil {
		t.Fatal(err)
	}
	s1.Resources.Limits[corev1.ResourceCPU] = q("3") // the caller's map, after the fact
	s2 := spec("b", "/b", map[string]string{"cpu": "1000m"}, map[string]string{"cpu": "1000m"})
	it2, _, err := f.a.Submit(s2)
	if err != nil {
		t.Fatal(err)
	}
	settle(t, f.a, it1.ID)
	settle(t, f.a, it2.ID)
	g1, _ := f.a.Get(it1.ID)
	g2, _ := f.a.Get(it2.ID)
	if got := g1.Spec.Resources.Limits.Cpu().String(); got != "1" {
		t.Errorf("intent 1's limit = %s, want 1 (the caller's later change must not reach it)", got)
	}
	js, _ := json.Marshal(g2.Spec.Resources)
	asked, _ := json.Marshal(s2.Resources)
	if string(js) != string(asked) {
		t.Errorf("intent 2's resources = %s, want %s as it was asked", js, asked)
	}
}

// TestSharedSpecsForgotten: the table of shared copies holds no more than
// the intents in the history use. It kept every spec it had seen, up to
// 4,096: the soak's random specs grew the heap by 4 MiB in a minute, long
// after the history had let their intents go.
func TestSharedSpecsForgotten(t *testing.T) {
	const history, n = 8, 300
	root := cgrouptest.FakeTree(t, "/a")
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	a := agent.New(cg, admission.NewLedger(admission.Capacity{MilliCPU: 8000, Memory: 8 * gi}),
		agent.WithHistory(history), agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	for i := range n {
		lim := fmt.Sprintf("%dm", 200+i)
		it, _, err := a.Submit(spec("a", "/a", map[string]string{"cpu": "100m"}, map[string]string{"cpu": lim}))
		if err != nil {
			t.Fatal(err)
		}
		settle(t, a, it.ID)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Cleanups run after a collection, on their own goroutine.
		runtime.GC()
		got := a.SharedSpecs()
		if got <= history+1 {
			t.Logf("%d specs submitted, history %d: %d shared copies held", n, history, got)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d specs submitted, history %d: the table still holds %d copies", n, history, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
