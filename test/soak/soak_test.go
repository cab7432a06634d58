package soak_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// Knobs, from the environment.
func duration(t *testing.T) time.Duration {
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		return d
	}
	if os.Getenv("VMHARNESS") == "1" {
		return 60 * time.Second
	}
	return 10 * time.Second
}

func count(t *testing.T, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", name, v)
		}
		return n
	}
	return def
}

const (
	history = 128 // terminal intents the agent keeps: bounded, so the heap can be flat
	// heapBound is how much the live heap may grow from the idle pause
	// after warm-up (history full) to the idle end of the run; the
	// clients' own books (a few map entries per intent) are in it.
	heapBound = 4 << 20
)

// files is what a cgroup's cpu.weight, cpu.max and memory.max should hold.
type files struct{ weight, max, mem string }

func expected(s intent.Spec) files {
	req, lim := s.Resources.Requests, s.Resources.Limits
	return files{
		weight: strconv.FormatUint(cgroup.MilliCPUToWeight(req.Cpu().MilliValue()), 10),
		max:    fmt.Sprintf("%d %d", cgroup.MilliCPUToQuota(lim.Cpu().MilliValue(), cgroup.DefaultPeriod), cgroup.DefaultPeriod),
		mem:    strconv.FormatInt(lim.Memory().Value(), 10),
	}
}

// randomSpec is a full Burstable spec (every request below its limit, so
// that no resize changes the QoS class) for the cgroup.
func randomSpec(r *rand.Rand, name, path string) intent.Spec {
	cpuReq := 50 + 10*r.Int64N(36)
	cpuLim := cpuReq + 100 + 10*r.Int64N(50)
	memReq := int64(16+r.IntN(48)) << 20
	memLim := memReq + int64(16+r.IntN(112))<<20
	s := intent.Spec{Target: intent.Target{Name: name, CgroupPath: path}}
	s.Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU: *resource.NewMilliQuantity(cpuReq, resource.DecimalSI), corev1.ResourceMemory: *resource.NewQuantity(memReq, resource.BinarySI)}
	s.Resources.Limits = corev1.ResourceList{
		corev1.ResourceCPU: *resource.NewMilliQuantity(cpuLim, resource.DecimalSI), corev1.ResourceMemory: *resource.NewQuantity(memLim, resource.BinarySI)}
	return s
}

// books is the clients' record of the run.
type books struct {
	mu        sync.Mutex
	acked     map[string]int          // intent ID -> cgroup index
	terminal  map[string]intent.State // as the main watch stream saw it
	last      map[int]files           // per cgroup: its last Completed intent, in stream order
	completed map[int]int
	states    map[intent.State]int
}

// heap returns the live heap after a GC, and the goroutines other than
// those of idle keep-alive HTTP connections (client and server side), whose
// number depends on how many requests last ran at once.
func heap() (live uint64, goroutines int) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	buf := make([]byte, 16<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "net/http.(*persistConn)") && !strings.Contains(g, "net/http.(*conn).serve") {
			goroutines++
		}
	}
	return m.HeapAlloc, goroutines
}

// Many concurrent API clients on the unix socket, for a bounded time, on
// real cgroups: submitters (some racing three intents for the same
// container), per-intent watchers, watch streams opened and closed,
// listers. At the end every intent is terminal, the main watch stream saw
// each acknowledged intent's terminal event, each cgroup holds its last
// Completed intent, and the heap did not grow.
func TestSoak(t *testing.T) {
	d := duration(t)
	mnt, base := cgrouptest.Real(t)
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := cg.Check(); err != nil {
		t.Fatal(err)
	}
	n := count(t, "SOAK_CGROUPS", 32)
	names, paths, index := make([]string, n), make([]string, n), map[string]int{}
	for i := range n {
		names[i] = fmt.Sprintf("c%02d", i)
		paths[i] = cgrouptest.Child(t, mnt, base, names[i])
		cgrouptest.StartIn(t, mnt, paths[i], exec.Command("sleep", "3600"))
		index[paths[i]] = i
	}
	srv := agenttest.ServeWith(t, cg, admission.Capacity{MilliCPU: 1000 * 1000, Memory: 1 << 50}, agent.WithHistory(history))
	b := &books{acked: map[string]int{}, terminal: map[string]intent.State{}, last: map[int]files{}, completed: map[int]int{}, states: map[intent.State]int{}}

	// The main watch stream: every event, for the whole run.
	mainCtx, stopMain := context.WithCancel(context.Background())
	defer stopMain()
	var cutoffs atomic.Int64
	mainDone := make(chan struct{})
	go func() {
		defer close(mainDone)
		c := api.NewClient(srv.Socket)
		for mainCtx.Err() == nil {
			_ = c.Watch(mainCtx, agent.Filter{}, func(e agent.Event) bool {
				if s := e.Intent.Status.State; s.Terminal() {
					b.mu.Lock()
					if _, seen := b.terminal[e.Intent.ID]; !seen {
						b.terminal[e.Intent.ID] = s
						b.states[s]++
						if s == intent.Completed {
							i := index[e.Intent.Spec.Target.CgroupPath]
							b.last[i] = expected(e.Intent.Spec)
							b.completed[i]++
						}
					}
					b.mu.Unlock()
				}
				return true
			})
			if mainCtx.Err() == nil {
				cutoffs.Add(1) // cut off for falling behind: watch again
			}
		}
	}()
	// Wait until the main stream is subscribed: it sees an intent end (one
	// that ended before it subscribed, it never sees).
	client := api.NewClient(srv.Socket)
	for k := 0; ; k++ {
		if k == 30 {
			t.Fatal("the main watch stream saw nothing")
		}
		first, _, err := client.Submit(context.Background(), randomSpec(rand.New(rand.NewPCG(0, uint64(k))), names[0], paths[0]))
		if err != nil {
			t.Fatal(err)
		}
		seen := false
		for deadline := time.Now().Add(time.Second); !seen && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			b.mu.Lock()
			_, seen = b.terminal[first.ID]
			b.mu.Unlock()
		}
		if seen {
			b.mu.Lock()
			b.acked[first.ID] = 0
			b.mu.Unlock()
			break
		}
	}

	var (
		stop                             atomic.Bool
		submits, races, waits, lists     atomic.Int64
		streams, streamEvents, apiErrors atomic.Int64
		errMu                            sync.Mutex
		errs                             []error
	)
	fail := func(err error) {
		apiErrors.Add(1)
		errMu.Lock()
		if len(errs) < 20 {
			errs = append(errs, err)
		}
		errMu.Unlock()
	}
	submit := func(c *api.Client, r *rand.Rand, i int) (string, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		it, _, err := c.Submit(ctx, randomSpec(r, names[i], paths[i]))
		if err != nil {
			fail(fmt.Errorf("submit %s: %w", names[i], err))
			return "", false
		}
		submits.Add(1)
		b.mu.Lock()
		b.acked[it.ID] = i
		b.mu.Unlock()
		return it.ID, true
	}

	// Each client is kept for the whole run, as its idle connections are.
	nSub, nWatch, nList := count(t, "SOAK_SUBMITTERS", 8), count(t, "SOAK_WATCHERS", 4), count(t, "SOAK_LISTERS", 3)
	clients := make([]*api.Client, nSub+nWatch+nList)
	for i := range clients {
		clients[i] = api.NewClient(srv.Socket)
	}
	phase := uint64(0)
	// load runs the clients for d and waits for them to stop.
	load := func(d time.Duration) {
		phase++
		var wg sync.WaitGroup
		stop.Store(false)
		// Submitters.
		for w := range nSub {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, r := clients[w], rand.New(rand.NewPCG(uint64(w), phase<<8|1))
				for !stop.Load() {
					i := r.IntN(n)
					if r.IntN(10) < 3 { // three intents racing for one container
						races.Add(1)
						var rw sync.WaitGroup
						for k := range 3 {
							rw.Add(1)
							go func() {
								defer rw.Done()
								submit(c, rand.New(rand.NewPCG(uint64(w), r.Uint64()+uint64(k))), i)
							}()
						}
						rw.Wait()
						continue
					}
					id, ok := submit(c, r, i)
					if ok && r.IntN(10) < 3 { // and watch it to its end
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						it, err := c.WaitSettled(ctx, id)
						cancel()
						switch {
						case err != nil:
							fail(fmt.Errorf("watch intent %s: %w", id, err))
						case !it.Status.State.Terminal():
							fail(fmt.Errorf("intent %s settled %s", id, it.Status.State))
						default:
							waits.Add(1)
						}
					}
				}
			}()
		}
		// Watch streams opened and closed, all or one container's; the states
		// of an intent on one stream never go back.
		for w := range nWatch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, r := clients[nSub+w], rand.New(rand.NewPCG(uint64(w), phase<<8|2))
				for !stop.Load() {
					f := agent.Filter{}
					if r.IntN(2) == 0 {
						f.Container = names[r.IntN(n)]
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+r.IntN(1000))*time.Millisecond)
					seen := map[string]intent.State{}
					err := c.Watch(ctx, f, func(e agent.Event) bool {
						streamEvents.Add(1)
						if prev, ok := seen[e.Intent.ID]; ok && prev.Terminal() {
							fail(fmt.Errorf("intent %s: %s after %s on one stream", e.Intent.ID, e.Intent.Status.State, prev))
						}
						seen[e.Intent.ID] = e.Intent.Status.State
						return true
					})
					cancel()
					streams.Add(1)
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						fail(fmt.Errorf("watch: %w", err))
					}
				}
			}()
		}
		// Listers and readers.
		for w := range nList {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, r := clients[nSub+nWatch+w], rand.New(rand.NewPCG(uint64(w), phase<<8|3))
				for !stop.Load() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					var err error
					switch r.IntN(5) {
					case 0:
						_, err = c.List(ctx, "", "")
					case 1:
						_, err = c.List(ctx, names[r.IntN(n)], "")
					case 2:
						_, err = c.Containers(ctx)
					case 3:
						_, err = c.Node(ctx)
					case 4:
						b.mu.Lock()
						var id string
						for id = range b.acked {
							break
						}
						b.mu.Unlock()
						_, err = c.Get(ctx, id)
						var se *api.StatusError
						if errors.As(err, &se) && se.Code == http.StatusNotFound {
							err = nil // evicted from the history
						}
					}
					cancel()
					if err != nil {
						fail(fmt.Errorf("read: %w", err))
					}
					lists.Add(1)
				}
			}()
		}

		time.Sleep(d)
		stop.Store(true)
		wg.Wait()
	}

	// settle waits, bounded, until every intent is terminal and the main
	// stream saw it.
	settle := func() {
		deadline := time.Now().Add(60 * time.Second)
		var open []string
		for {
			open = open[:0]
			all, err := client.List(context.Background(), "", "")
			if err != nil {
				t.Fatalf("API does not answer after the run: %v", err)
			}
			for _, it := range all {
				if !it.Status.State.Terminal() {
					open = append(open, it.ID+" "+string(it.Status.State))
				}
			}
			b.mu.Lock()
			missing := 0
			for id := range b.acked {
				if _, ok := b.terminal[id]; !ok {
					missing++
				}
			}
			b.mu.Unlock()
			if len(open) == 0 && missing == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not settled 60s after the run: %d intents non-terminal (%v), %d acknowledged intents without a terminal event on the watch stream",
					len(open), open[:min(len(open), 10)], missing)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Warm up until the history is full, pause, and take the heap; run
	// the rest of the time, settle, and take it again in the same state.
	warm := max(d/4, time.Second)
	t0 := time.Now()
	load(warm)
	elapsed := time.Since(t0)
	settle()
	heapWarm, grWarm := heap()
	submitsWarm := submits.Load()
	if submitsWarm < 2*history {
		t.Logf("warm-up: only %d intents, fewer than twice the history (%d)", submitsWarm, history)
	}
	t1 := time.Now()
	load(d - warm)
	elapsed += time.Since(t1)
	settle()
	heapEnd, grEnd := heap()
	stopMain()
	<-mainDone

	errMu.Lock()
	for _, err := range errs {
		t.Error(err)
	}
	errMu.Unlock()
	if k := apiErrors.Load(); k > 0 {
		t.Errorf("%d API errors", k)
	}
	if k := cutoffs.Load(); k > 0 {
		t.Errorf("the main watch stream was cut off %d times", k)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s, k := range b.states {
		if s != intent.Completed && s != intent.Superseded {
			t.Errorf("%d intents ended %s", k, s)
		}
	}
	for i, p := range paths {
		want, ok := b.last[i]
		if !ok {
			t.Errorf("%s: no intent Completed", p)
			continue
		}
		got := files{cgrouptest.ReadFile(t, mnt, p, "cpu.weight"), cgrouptest.ReadFile(t, mnt, p, "cpu.max"), cgrouptest.ReadFile(t, mnt, p, "memory.max")}
		if got != want {
			t.Errorf("%s holds %+v, its last Completed intent %+v", p, got, want)
		}
	}
	node, err := client.Node(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctrs, err := client.Containers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var sum admission.Capacity
	for _, c := range ctrs {
		sum.MilliCPU += c.Allocated.MilliCPU
		sum.Memory += c.Allocated.Memory
	}
	if sum != node.Allocated {
		t.Errorf("ledger: node allocated %+v, containers hold %+v", node.Allocated, sum)
	}

	rate := float64(submits.Load()) / elapsed.Seconds()
	t.Logf("soak %v on %d cgroups: %d intents acknowledged (%.1f/s; %d in races of three), %s; %d per-intent watches, %d watch streams (%d events), %d reads",
		elapsed.Round(time.Millisecond), n, submits.Load(), rate, 3*races.Load(), fmtStates(b.states), waits.Load(), streams.Load(), streamEvents.Load(), lists.Load())
	t.Logf("live heap after GC, idle: after warm-up (%d intents) %.2f MiB, %d goroutines besides idle HTTP connections; at the end (%d intents) %.2f MiB, %d goroutines; growth %+.2f MiB (bound %d MiB)",
		submitsWarm, mib(heapWarm), grWarm, submits.Load(), mib(heapEnd), grEnd, mib(heapEnd)-mib(heapWarm), heapBound>>20)
	if heapEnd > heapWarm+heapBound {
		t.Errorf("heap grew from %.2f MiB to %.2f MiB", mib(heapWarm), mib(heapEnd))
	}
	if grEnd > grWarm+2 {
		t.Errorf("goroutines grew from %d to %d", grWarm, grEnd)
	}
	if rate < 1 {
		t.Errorf("only %.2f intents/s", rate)
	}
}

func mib(v uint64) float64 { return float64(v) / (1 << 20) }

func fmtStates(m map[intent.State]int) string {
	return fmt.Sprintf("%d Completed, %d Superseded, %d other", m[intent.Completed], m[intent.Superseded],
		func() int {
			k := 0
			for s, v := range m {
				if s != intent.Completed && s != intent.Superseded {
					k += v
				}
			}
			return k
		}())
}
