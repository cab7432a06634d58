package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/cgroup"
)

// The daemon's load (issue 15's target): a 100 MB-equivalent history, then
// 10,000 idle keep-alive connections and 1,000 watch streams at once, with
// intents flowing. The load comes from a child process (this test binary
// again), so that only the daemon's memory is in this process's RSS.
const (
	loadEnv      = "RESIZE_AGENT_LOAD"      // 1: run TestDaemonUnderLoad
	loadRoleEnv  = "RESIZE_AGENT_LOAD_ROLE" // seed or flood: TestLoadChild's job
	loadArgEnv   = "RESIZE_AGENT_LOAD_ARG"  // the child's argument
	loadIdleEnv  = "RESIZE_AGENT_LOAD_IDLE" // --idle-timeout (default the DaemonSet's, 60s)
	loadMBEnv    = "RESIZE_AGENT_LOAD_MB"   // history size (default 100)
	loadLimitMiB = 256                      // deploy/base/daemonset.yaml: limits.memory
	loadCtrs     = 1000                     // containers of the history, all in the tree
	loadIdle     = 10000                    // idle connections, half on each listener
	loadWatches  = 1000                     // watch streams on the socket
	loadAllSee   = 100                      // streams that see every event; the rest filter on a container
	loadProfile  = "RESIZE_AGENT_LOAD_HEAP" // where to write the heap profile (default a temp file)
)

func loadPath(i int) string { return fmt.Sprintf("/kubepods/pod%d/c", i) }

// TestDaemonUnderLoad measures the daemon's own memory (VmRSS sampled, and
// VmHWM, of this process, which runs the daemon in-process) under the
// whole load, fails past the DaemonSet's 256Mi limit, and times answers on
// new connections (readyz, a submit to Completed, a list page) under it.
//
// Besides the daemon this process holds the Go test harness and its own
// sampling (a few MiB); the seeding and the load's client ends are in
// child processes.
func TestDaemonUnderLoad(t *testing.T) {
	if os.Getenv(loadEnv) != "1" {
		t.Skipf("set %s=1 to run (make bench): it seeds a 100 MB journal and opens 11,000 connections, minutes of work", loadEnv)
	}
	idle := 60 * time.Second
	if v := os.Getenv(loadIdleEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", loadIdleEnv, err)
		}
		idle = d
	}
	mb := 100
	if v := os.Getenv(loadMBEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of MiB", loadMBEnv, v)
		}
		mb = n
	}
	// The daemon holds at most 2,000 connections per listener (more wait in
	// the kernel) and needs one file per connection, besides the tree's.
	if got := raiseFileLimit(t, 8000); got < 8000 {
		t.Fatalf("RLIMIT_NOFILE %d is below the 8,000 the daemon needs here", got)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	t.Logf("this process before the daemon: VmRSS %d MiB", procStatus(t, "VmRSS")>>10)

	t0 := time.Now()
	out := child(t, "seed", state+","+strconv.Itoa(mb))
	t.Logf("seeded (child process) in %v: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(out))

	var paths []string
	for i := range loadCtrs {
		paths = append(paths, loadPath(i))
	}
	o := DefaultOptions()
	o.StateDir = state
	o.Socket = filepath.Join(dir, "agent.sock")
	o.MetricsAddress = "127.0.0.1:0"
	o.CPUAllocatable, o.MemoryAllocatable = "64", "64Gi"
	o.IdleTimeout = idle.String()
	// Above the defaults (1,000 connections per listener, 500 watches, 100
	// a peer) so that the 1,000 streams are served beside 1,000 idle
	// connections on the socket, with room for the watches that wait for
	// intents to settle: more than the DaemonSet's flags allow, not less.
	o.MaxConnections, o.MaxWatches, o.MaxWatchesPerPeer = 2*loadWatches, loadWatches+20, loadWatches+20
	// As deployed: the DaemonSet gives the daemon its container's limit,
	// from which it sets the runtime's soft limit (memlimit.go);
	// GOMEMLIMIT in the environment overrides it, as it would there. The
	// children run without either.
	if os.Getenv(memoryLimitEnv) == "" {
		t.Setenv(memoryLimitEnv, fmt.Sprintf("%dMi", loadLimitMiB))
	}
	if err := setMemoryLimit(quiet); err != nil {
		t.Fatal(err)
	}
	t.Logf("GOMEMLIMIT %q: the runtime's memory limit is %d MiB", os.Getenv("GOMEMLIMIT"), debug.SetMemoryLimit(-1)>>20)
	t0 = time.Now()
	d := startDaemon(t, o, paths...)
	startTook := time.Since(t0)
	rssStart, hwmStart := procStatus(t, "VmRSS"), procStatus(t, "VmHWM")
	t.Logf("daemon ready in %v after replaying the history: VmRSS %d MiB, VmHWM %d MiB", startTook.Round(time.Millisecond), rssStart>>10, hwmStart>>10)

	// Sample RSS and the Go heap throughout.
	var rssPeak, heapPeak atomic.Uint64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if r := procStatus(t, "VmRSS"); r > rssPeak.Load() {
				rssPeak.Store(r)
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > heapPeak.Load() {
				heapPeak.Store(m.HeapInuse)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()

	// The load: the child says "ready" once the streams are open and the
	// idle connections dialled, then keeps them until its stdin closes.
	cmd, stdin, lines := startChild(t, "flood", o.Socket+","+d.addrs["metrics"])
	t0 = time.Now()
	var ready string
	for l := range lines {
		t.Logf("load: %s", l)
		if strings.HasPrefix(l, "ready") {
			ready = l
			break
		}
	}
	if ready == "" {
		stdin.Close()
		t.Fatalf("the load child ended before it was ready: %v", cmd.Wait())
	}
	loadUp := time.Since(t0)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for l := range lines {
			t.Logf("load: %s", l)
		}
	}()
	// Let the flood settle: the daemon holds its cap on each listener.
	time.Sleep(3 * time.Second)
	held := runtime.NumGoroutine()
	rssLoaded := procStatus(t, "VmRSS")

	// Answers on new connections, each queued behind the flood on its
	// listener: a new connection waits for those queued before it, about
	// one idle timeout per cap's worth. The context bounds a hang; an
	// answer must come within what the DaemonSet's liveness probe
	// tolerates before the kubelet kills the agent (3 failures, 20 s
	// apart), the socket's as the probe's.
	const answerBound = 60 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 4*idle+2*time.Minute)
	defer cancel()
	answer := map[string]time.Duration{}
	var amu sync.Mutex
	var wg sync.WaitGroup
	check := func(name string, f func() error) {
		defer wg.Done()
		t0 := time.Now()
		if err := f(); err != nil {
			t.Errorf("%s under load: %v", name, err)
			return
		}
		amu.Lock()
		answer[name] = time.Since(t0)
		amu.Unlock()
	}
	wg.Add(3)
	go check("readyz", func() error {
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addrs["metrics"]+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	go check("submit to Completed", func() error {
		c := api.NewClient(o.Socket)
		defer c.CloseIdleConnections()
		s := intent.Spec{Target: intent.Target{Name: "c7", CgroupPath: loadPath(7)}}
		s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("777m")}
		it, _, err := c.Submit(ctx, s)
		if err != nil {
			return err
		}
		it, err = c.WaitSettled(ctx, it.ID)
		if err != nil {
			return err
		}
		if it.Status.State != intent.Completed {
			return fmt.Errorf("intent %s: %s %s", it.ID, it.Status.State, it.Status.Message)
		}
		return nil
	})
	go check("list page", func() error {
		c := api.NewClient(o.Socket)
		defer c.CloseIdleConnections()
		items, _, err := c.ListPage(ctx, "", "", 500, "")
		if err != nil {
			return err
		}
		if len(items) == 0 {
			return fmt.Errorf("an empty page of a %d MiB history", mb)
		}
		return nil
	})
	wg.Wait()
	cancel()
	rssEnd, anon, file := procStatus(t, "VmRSS"), procStatus(t, "RssAnon"), procStatus(t, "RssFile")
	// Where the memory is, with the load still on: the heap profile, and
	// the runtime's account before and after a collection (the heap the
	// collector had not yet freed, stacks, what it keeps from the OS).
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	profile := heapProfile(t)
	runtime.ReadMemStats(&after)
	t.Logf("VmRSS under load %d MiB: %d anonymous, %d mapped files (the test binary's text and data)", rssEnd>>10, anon>>10, file>>10)
	t.Logf("Go runtime under load (MiB): heap in use %d (%d live after a GC), stacks %d, heap kept but idle %d, returned to the OS %d, from the OS in all %d; %d goroutines; heap profile %s",
		before.HeapInuse>>20, after.HeapInuse>>20, before.StackInuse>>20, (before.HeapIdle-before.HeapReleased)>>20, before.HeapReleased>>20, before.Sys>>20, runtime.NumGoroutine(), profile)
	stdin.Close()
	<-drained
	if err := cmd.Wait(); err != nil {
		t.Errorf("load child: %v", err)
	}
	close(stopSampling)
	<-sampled
	hwm := procStatus(t, "VmHWM")

	t.Logf("load up in %v (%s); %d goroutines in the daemon's process", loadUp.Round(time.Millisecond), ready, held)
	t.Logf("answers under load (idle timeout %v): readyz %v, submit to Completed %v, list page %v",
		idle, answer["readyz"].Round(time.Millisecond), answer["submit to Completed"].Round(time.Millisecond), answer["list page"].Round(time.Millisecond))
	t.Logf("daemon memory (KiB): VmRSS %d after start, %d loaded, %d at the end, %d peak sampled; VmHWM %d after start, %d at the end; Go heap in use peak %d",
		rssStart, rssLoaded, rssEnd, rssPeak.Load(), hwmStart, hwm, heapPeak.Load()>>10)
	for name, took := range answer {
		if took > answerBound {
			t.Errorf("%s took %v under load, more than the %v the liveness probe tolerates", name, took.Round(time.Millisecond), answerBound)
		}
	}
	if lim := uint64(loadLimitMiB) << 10; rssPeak.Load() >= lim || hwm >= lim {
		t.Errorf("the daemon's memory passed the DaemonSet's %d MiB limit: VmRSS peak %d MiB, VmHWM %d MiB; heap profile under load: %s",
			loadLimitMiB, rssPeak.Load()>>10, hwm>>10, profile)
	}
}

// procStatus returns a field of /proc/self/status in KiB.
func procStatus(t *testing.T, field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// heapProfile writes the heap profile (after a collection) where
// loadProfile says, or to a temporary file kept after the test, and returns
// its path.
func heapProfile(t *testing.T) string {
	p := os.Getenv(loadProfile)
	if p == "" {
		f, err := os.CreateTemp("", "resize-agent-load-heap-*.pprof")
		if err != nil {
			return err.Error()
		}
		f.Close()
		p = f.Name()
	}
	f, err := os.Create(p)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		return err.Error()
	}
	return p + " (go tool pprof -sample_index=inuse_space)"
}

// child runs TestLoadChild in a new process for role and returns its
// output.
func child(t *testing.T, role, arg string) string {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadChild$", "-test.v")
	cmd.Env = append(os.Environ(), loadRoleEnv+"="+role, loadArgEnv+"="+arg, loadEnv+"=", "GOMEMLIMIT=", memoryLimitEnv+"=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s child: %v\n%s", role, err, out)
	}
	return string(out)
}

// startChild starts TestLoadChild for role, and returns its stdin (closing
// it ends the child) and its output's lines.
func startChild(t *testing.T, role, arg string) (*exec.Cmd, io.WriteCloser, <-chan string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadChild$", "-test.v", "-test.timeout=0")
	cmd.Env = append(os.Environ(), loadRoleEnv+"="+role, loadArgEnv+"="+arg, loadEnv+"=", "GOMEMLIMIT=", memoryLimitEnv+"=")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "load_test.go")); strings.Contains(sc.Text(), "load_test.go:") {
				// t.Logf's "    load_test.go:123: text"
				if i := strings.Index(l, ": "); i >= 0 {
					l = l[i+2:]
				}
				lines <- l
			}
		}
	}()
	return cmd, stdin, lines
}

// TestLoadChild is TestDaemonUnderLoad's other process.
func TestLoadChild(t *testing.T) {
	arg := os.Getenv(loadArgEnv)
	switch os.Getenv(loadRoleEnv) {
	case "seed":
		dir, mb, _ := strings.Cut(arg, ",")
		n, _ := strconv.Atoi(mb)
		seedHistory(t, dir, int64(n)<<20)
	case "flood":
		sock, metrics, _ := strings.Cut(arg, ",")
		flood(t, sock, metrics)
	default:
		t.Skipf("run by TestDaemonUnderLoad in a process of its own (%s unset)", loadRoleEnv)
	}
}

// seedHistory writes a journal of size bytes or more through the journal's
// own writer, as the agent writes it (uncompacted, as a journal written
// before the file was bounded, or a compaction threshold set high): 1,000
// containers' intents, each Proposed, InProgress and Completed with what it
// wrote, and the last 100 left Proposed, which the daemon takes up again.
func seedHistory(t *testing.T, dir string, size int64) {
	j, err := journal.Open(dir, journal.WithCompactAt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := func(seq uint64, s intent.State) journal.Record {
		k := int(seq % loadCtrs)
		p := loadPath(k)
		id := fmt.Sprintf("seed-%08d", seq)
		cpu := 100 + int64(seq%400)
		sp := intent.Spec{ID: id, Target: intent.Target{Name: fmt.Sprintf("c%d", k), CgroupPath: p}}
		sp.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(cpu/10, resource.DecimalSI), corev1.ResourceMemory: resource.MustParse("16Mi")}
		sp.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(cpu, resource.DecimalSI), corev1.ResourceMemory: resource.MustParse("512Mi")}
		r := journal.Record{Seq: seq, Container: p, Intent: intent.Intent{ID: id, Spec: sp,
			Status: intent.Status{State: s, AcceptedAt: now, UpdatedAt: now, Message: "seeded history for the load test"}}}
		if s == intent.Completed {
			r.Intent.Status.CompletedAt = &now
			r.Intent.Status.Via = "cgroupfs"
			r.Intent.Status.Applied = intent.Applied{{Cgroup: p, Values: []cgroup.Value{
				{File: "cpu.max", Data: fmt.Sprintf("%d 100000", cpu*100)}, {File: "cpu.weight", Data: "1"}, {File: "memory.max", Data: "536870912"}}}}
			r.Resources = &journal.Resources{Resources: intent.Resources{CPULimit: cpu, CPURequest: cpu / 10, MemoryLimit: 512 << 20, MemoryRequest: 16 << 20}, CPU: true, Memory: true}
		}
		return r
	}
	var seq uint64
	var last journal.Ticket
	for {
		seq++
		for _, s := range []intent.State{intent.Proposed, intent.InProgress, intent.Completed} {
			last = j.Append(rec(seq, s))
		}
		if seq%1000 == 0 {
			if err := j.Wait(last); err != nil {
				t.Fatal(err)
			}
			if j.Stats().Size >= size {
				break
			}
		}
	}
	for range 100 {
		seq++
		last = j.Append(rec(seq, intent.Proposed))
	}
	if err := j.Wait(last); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d MiB, %d intents", j.Stats().Size>>20, seq)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

// flood opens 1,000 watch streams on the socket, then 10,000 keep-alive
// connections that go idle after one request, half on the socket and half
// on the metrics listener, and submits an intent every 100 ms on one
// keep-alive connection opened before the flood (a client that was there
// first), until stdin closes.
func flood(t *testing.T, sock, metrics string) {
	if got := raiseFileLimit(t, loadIdle+loadWatches+1000); got < loadIdle+loadWatches+1000 {
		t.Fatalf("RLIMIT_NOFILE %d is below the %d the load needs", got, loadIdle+loadWatches+1000)
	}
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { io.Copy(io.Discard, os.Stdin); close(done); cancel() }()

	var events atomic.Int64
	for i := range loadWatches {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		q := "container=none"
		if i < loadAllSee {
			q = ""
		}
		io.WriteString(c, "GET /v1/watch?"+q+" HTTP/1.1\r\nHost: agent\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %v %v", i, resp, err)
		}
		go func() {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				events.Add(1)
			}
		}()
	}
	t.Logf("%d watch streams open", loadWatches)

	// The intents flow, on a connection made before the flood.
	c := api.NewClient(sock)
	if _, err := c.Node(context.Background()); err != nil {
		t.Fatal(err)
	}
	var submitted, completed, failed atomic.Int64
	flowing := make(chan struct{})
	go func() {
		defer close(flowing)
		defer c.CloseIdleConnections()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			k := i % loadCtrs
			s := intent.Spec{Target: intent.Target{Name: fmt.Sprintf("c%d", k), CgroupPath: loadPath(k)}}
			s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(200+i%300), resource.DecimalSI)}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			it, _, err := c.Submit(ctx, s)
			if err == nil {
				submitted.Add(1)
				// Polled on this connection: a watch would need a new one.
				for err == nil && !it.Status.State.Terminal() {
					time.Sleep(20 * time.Millisecond)
					it, err = c.Get(ctx, it.ID)
				}
			}
			cancel()
			if err == nil && it.Status.State == intent.Completed {
				completed.Add(1)
			} else if failed.Add(1) <= 3 {
				t.Logf("intent not Completed: %v %s %s %s", err, it.Status.State, it.Status.Reason, it.Status.Message)
			}
		}
	}()

	// The idle flood. Each connection sends one request, reads its answer
	// and stays open, idle, until the daemon closes it (its idle timeout)
	// or the load ends; those the daemon has not accepted yet wait in the
	// kernel's accept queue or in SYN retries, as they would from a pod.
	var dialled, answered, closed, dialErr atomic.Int64
	var wg sync.WaitGroup
	for i := range loadIdle {
		network, addr, path := "unix", sock, "/v1/node"
		if i%2 == 0 {
			network, addr, path = "tcp", metrics, "/healthz"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				dialErr.Add(1)
				return
			}
			defer conn.Close()
			dialled.Add(1)
			go func() { <-done; conn.Close() }()
			io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: agent\r\n\r\n")
			br := bufio.NewReaderSize(conn, 512)
			if resp, err := http.ReadResponse(br, nil); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered.Add(1)
			}
			if _, err := br.ReadByte(); err != nil {
				closed.Add(1)
			}
		}()
	}
	// Ready once every connection is dialled (the kernel's queues are
	// full) or the dials stop progressing.
	for prev, still := int64(-1), 0; ; {
		time.Sleep(500 * time.Millisecond)
		n := dialled.Load() + dialErr.Load()
		if n >= loadIdle || still >= 10 {
			break
		}
		if n == prev {
			still++
		} else {
			still = 0
		}
		prev = n
	}
	t.Logf("ready: %d idle connections dialled (%d failed), %d answered", dialled.Load(), dialErr.Load(), answered.Load())
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			wg.Wait()
			<-flowing
			t.Logf("end: %d dialled, %d answered, %d closed by the daemon or the end; intents %d submitted, %d Completed, %d not; %d watch events read",
				dialled.Load(), answered.Load(), closed.Load(), submitted.Load(), completed.Load(), failed.Load(), events.Load())
			return
		case <-tick.C:
			t.Logf("dialled %d, answered %d, closed %d; intents %d submitted, %d Completed, %d not; %d watch events",
				dialled.Load(), answered.Load(), closed.Load(), submitted.Load(), completed.Load(), failed.Load(), events.Load())
		}
	}
}
