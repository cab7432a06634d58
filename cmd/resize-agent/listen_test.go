package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// daemon is run() on a fake cgroup tree, with the addresses it listens on.
type daemon struct {
	addrs map[string]string // listener name -> address
	stop  func()
}

func startDaemon(t *testing.T, o *Options, paths ...string) *daemon {
	t.Helper()
	o.CgroupRoot, o.skipFSCheck = cgrouptest.FakeTree(t, paths...), true
	if o.CPUAllocatable == "" {
		o.CPUAllocatable, o.MemoryAllocatable = "4", "8Gi"
	}
	d := &daemon{addrs: map[string]string{}}
	var mu sync.Mutex
	o.onListen = func(name, addr string) { mu.Lock(); d.addrs[name] = addr; mu.Unlock() }
	ready := make(chan struct{})
	o.onReady = func(string) { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, quiet) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(d.stop)
	return d
}

// serving counts the connections the daemon's HTTP servers hold: one
// goroutine each.
func serving() int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	n := 0
	for _, block := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(block, "net/http.(*conn).serve") {
			var c int
			fmt.Sscanf(block, "%d @", &c)
			n += c
		}
	}
	return n
}

func rss(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	return "?"
}

// keepAlive sends one keep-alive request on a new connection, reads the
// answer and then waits, idle, for the server to close the connection. It
// returns the status and how long the connection stayed open after the
// answer.
func keepAlive(network, addr, path, auth string, limit time.Duration) (int, time.Duration, error) {
	c, err := net.DialTimeout(network, addr, limit)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(limit))
	req := "GET " + path + " HTTP/1.1\r\nHost: agent\r\n"
	if auth != "" {
		req += "Authorization: " + auth + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return 0, 0, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	answered := time.Now()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		return resp.StatusCode, 0, fmt.Errorf("connection not closed by the server: %v", err)
	}
	return resp.StatusCode, time.Since(answered), nil
}

// raiseFileLimit raises the soft limit on open files towards n, as far as
// the hard limit allows, and returns the limit now in force.
func raiseFileLimit(t *testing.T, n uint64) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return lim.Cur
	}
	old := lim
	// Root may raise the hard limit too (the VM's is 4096).
	want := syscall.Rlimit{Cur: n, Max: max(n, lim.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		lim = want
	} else {
		lim.Cur = min(n, lim.Max)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	return lim.Cur
}

// TestIdleConnectionsBounded floods every listener with keep-alive
// connections that go idle after one request (issue 15: 12,000 of them took
// the daemon to 267 MiB, all still open after 120 s). The daemon holds at
// most --max-connections per listener, closes each idle one after
// --idle-timeout, closes an unauthenticated TCP connection at once after its
// 401, and keeps answering.
func TestIdleConnectionsBounded(t *testing.T) {
	const (
		others = 300 // on the TCP API (no token) and on the socket
		idle   = time.Second
	)
	// 5,000 on the metrics listener, fewer where the hard limit on open
	// files is lower (both ends are in this process), with a cap that
	// keeps the ratio.
	flood := min(5000, (int(raiseFileLimit(t, 2*(5000+2*others)+1000))-1000)/2-2*others)
	maxConn := flood / 10
	if flood < 500 {
		t.Fatalf("RLIMIT_NOFILE allows only %d connections", flood)
	}
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600)
	o := DefaultOptions()
	o.StateDir = ""
	o.Socket = filepath.Join(dir, "agent.sock")
	o.MetricsAddress = "127.0.0.1:0"
	o.ListenTCP, o.TCPTokenFile = "127.0.0.1:0", tok
	o.MaxConnections, o.IdleTimeout = maxConn, idle.String()
	d := startDaemon(t, o)

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0, rss0 := ms.HeapInuse, rss(t)

	// The peak number of connections the servers hold, sampled throughout.
	var peak atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	var heapPeak uint64
	go func() {
		defer close(sampled)
		for {
			if n := int64(serving()); n > peak.Load() {
				peak.Store(n)
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			heapPeak = max(heapPeak, m.HeapInuse)
			select {
			case <-stopSampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	type result struct {
		listener string
		code     int
		open     time.Duration
		err      error
	}
	t.Logf("%d connections on the metrics listener, %d on each other, at most %d held per listener", flood, others, maxConn)
	results := make(chan result, flood+2*others)
	var wg sync.WaitGroup
	// Enough for every round of the flood: flood/maxConn rounds of about one
	// idle timeout each.
	limit := 60 * time.Second
	dial := func(listener, network, addr, path, auth string) {
		defer wg.Done()
		code, open, err := keepAlive(network, addr, path, auth, limit)
		results <- result{listener, code, open, err}
	}
	for i := 0; i < flood; i++ {
		wg.Add(1)
		go dial("metrics", "tcp", d.addrs["metrics"], "/healthz", "")
	}
	for i := 0; i < others; i++ {
		wg.Add(2)
		go dial("api-tcp", "tcp", d.addrs["api-tcp"], "/v1/node", "")
		go dial("api-unix", "unix", o.Socket, "/v1/node", "")
	}

	// The API answers while the metrics listener is flooded: each listener
	// has its own cap. (A new connection to the flooded listener waits
	// behind those queued before it, each round about one idle timeout.)
	time.Sleep(200 * time.Millisecond)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if n, err := api.NewClient("http://" + d.addrs["api-tcp"]).WithToken("0123456789abcdef0123").Node(context.Background()); err != nil || n.Allocatable.MilliCPU != 4000 {
		t.Errorf("the TCP API during the flood: %+v %v", n, err)
	}
	var runtimeRSS = rss(t)

	wg.Wait()
	close(results)
	close(stopSampling)
	<-sampled
	byListener := map[string][]time.Duration{}
	failed := 0
	for r := range results {
		want := http.StatusOK
		if r.listener == "api-tcp" {
			want = http.StatusUnauthorized
		}
		if r.err != nil || r.code != want {
			if failed++; failed <= 5 {
				t.Errorf("%s: status %d, %v", r.listener, r.code, r.err)
			}
			continue
		}
		byListener[r.listener] = append(byListener[r.listener], r.open)
	}
	if failed > 0 {
		t.Errorf("%d connections failed", failed)
	}
	for name, opens := range byListener {
		longest := time.Duration(0)
		for _, d := range opens {
			longest = max(longest, d)
		}
		t.Logf("%s: %d connections answered; the longest stayed open %v after its answer", name, len(opens), longest)
		// Loose, for a loaded machine (7.6 s seen for a 1 s idle timeout in
		// a TCG guest sharing two host cores with another VM and builds);
		// without the timeouts they stayed open until the client gave up
		// (the test's limit, 60 s).
		bound := idle + 15*time.Second
		if name == "api-tcp" {
			bound = 3 * time.Second // closed with the 401, not after the idle timeout
		}
		if longest > bound {
			t.Errorf("%s: a connection stayed open %v after its answer (bound %v)", name, longest, bound)
		}
	}
	t.Logf("heap in use: %d KiB before, %d KiB at the peak; RSS %s before, %s during the flood; peak connections served: %d",
		heap0>>10, heapPeak>>10, rss0, runtimeRSS, peak.Load())
	if p := peak.Load(); p > int64(3*maxConn) {
		t.Errorf("the servers held %d connections at once; the cap is %d per listener", p, maxConn)
	}
	// Client and server are both in this process: the client's 5,600
	// connections are counted too (the served count above is the server's
	// alone). Bounded: about 70 MiB (90 under -race); unbounded, 5,300
	// connections held at once took 159 MiB without -race.
	if grown := int64(heapPeak) - int64(heap0); grown > 128<<20 {
		t.Errorf("heap grew by %d MiB", grown>>20)
	}
	if resp, err := hc.Get("http://" + d.addrs["metrics"] + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("readyz after the flood: %v", err)
	} else {
		resp.Body.Close()
	}
	d.stop()
}

// TestWatchOutlivesServerTimeouts: the servers' read and write timeouts cut
// slow requests, but not a watch that waits longer than both for its event.
func TestWatchOutlivesServerTimeouts(t *testing.T) {
	o := DefaultOptions()
	o.StateDir = ""
	o.Socket = filepath.Join(t.TempDir(), "agent.sock")
	o.MetricsAddress = ""
	o.readTimeout, o.writeTimeout = 500*time.Millisecond, 500*time.Millisecond
	startDaemon(t, o, "/kubepods/pod1/web")
	c := api.NewClient(o.Socket)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := make(chan api.Event, 8)
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- c.Watch(ctx, api.Filter{}, func(e api.Event) bool { events <- e; return e.Intent.Status.State != intent.Completed })
	}()
	time.Sleep(1500 * time.Millisecond) // three times both timeouts
	s := intent.Spec{ID: "late", Target: intent.Target{Name: "web", CgroupPath: "/kubepods/pod1/web"}}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}
	if _, _, err := c.Submit(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := <-watchErr; err != nil {
		t.Fatalf("watch: %v", err)
	}
	var last api.Event
	for len(events) > 0 {
		last = <-events
	}
	if last.Intent.ID != "late" || last.Intent.Status.State != intent.Completed {
		t.Errorf("last event %+v", last)
	}
}

// TestWatchStreamsMemory: 1,000 watch streams and 300 intents (issue 15:
// 452 MB RSS, each stream preallocating about 188 KiB) stay within a few
// tens of MiB of heap, client ends included.
func TestWatchStreamsMemory(t *testing.T) {
	const (
		streams  = 1000
		all      = 100 // streams that see every event; the rest filter on a container with none
		ctrs     = 30
		resizes  = 300
		heapStop = 48 << 20
	)
	if got := raiseFileLimit(t, 2*streams+1000); got < 2*streams+1000 {
		t.Fatalf("RLIMIT_NOFILE %d is below the %d this test needs", got, 2*streams+1000)
	}
	var paths []string
	for i := range ctrs {
		paths = append(paths, fmt.Sprintf("/kubepods/pod%d/c", i))
	}
	o := DefaultOptions()
	o.StateDir = ""
	o.Socket = filepath.Join(t.TempDir(), "agent.sock")
	o.MetricsAddress = ""
	o.MaxConnections, o.MaxWatches, o.MaxWatchesPerPeer = 2*streams, streams+10, streams+10
	o.CPUAllocatable, o.MemoryAllocatable = "64", "64Gi"
	startDaemon(t, o, paths...)

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	heap0 := heap()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var readers sync.WaitGroup
	for i := range streams {
		c, err := net.Dial("unix", o.Socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		q := "container=none"
		if i < all {
			q = ""
		}
		io.WriteString(c, "GET /v1/watch?"+q+" HTTP/1.1\r\nHost: agent\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream %d: %v %v", i, resp, err)
		}
		if i < all {
			readers.Add(1)
			go func() { defer readers.Done(); io.Copy(io.Discard, resp.Body) }()
		}
	}
	heap1 := heap()
	c := api.NewClient(o.Socket)
	// A bound on a hung daemon, not a speed target: 300 intents to 1,000
	// streams took 46 s in a quiet TCG guest and over 60 s in a loaded one.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var ids []string
	for i := range resizes {
		p := paths[i%ctrs]
		s := intent.Spec{Target: intent.Target{Name: fmt.Sprintf("c%d", i%ctrs), CgroupPath: p}}
		s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(100+i), resource.DecimalSI)}
		it, _, err := c.Submit(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, it.ID)
	}
	for _, id := range ids {
		if _, err := c.WaitSettled(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	heap2 := heap()
	t.Logf("heap in use: %d KiB idle, %d KiB with %d streams (%d B a stream, both ends), %d KiB after %d intents",
		heap0>>10, heap1>>10, streams, (int64(heap1)-int64(heap0))/streams, heap2>>10, resizes)
	if grown := int64(max(heap1, heap2)) - int64(heap0); grown > heapStop {
		t.Errorf("heap grew by %d MiB with %d streams", grown>>20, streams)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	readers.Wait()
}

// TestFullListenerMakesRoom: a listener at --max-connections closes the
// connection that has waited longest without a request to serve a new
// one, rather than leaving the new one in the kernel's queue for an idle
// timeout (issue 15: a probe waited 116 s under a flood of idle
// connections); it never closes one with a request in flight.
func TestFullListenerMakesRoom(t *testing.T) {
	const held = 8
	dir := t.TempDir()
	o := DefaultOptions()
	o.StateDir = ""
	o.Socket = filepath.Join(dir, "agent.sock")
	o.MetricsAddress = "127.0.0.1:0"
	o.MaxConnections, o.IdleTimeout = held, "60s"
	d := startDaemon(t, o, "/kubepods/a")
	metrics := d.addrs["metrics"]
	// get asks on a new connection and says how long the answer took.
	get := func(network, addr, path string, timeout time.Duration) (time.Duration, error) {
		hc := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}}
		t0 := time.Now()
		resp, err := hc.Get("http://agent" + path)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		return time.Since(t0), nil
	}
	// open holds a connection: after one request (idle), or silent.
	open := func(network, addr, request string) net.Conn {
		c, err := net.Dial(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if request == "" {
			return c
		}
		if _, err := io.WriteString(c, "GET "+request+" HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(request, "/v1/watch") {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return c
	}
	closed := func(c net.Conn, within time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(within))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	}

	// Idle after a request: the oldest goes at once.
	var idle []net.Conn
	for range held {
		idle = append(idle, open("tcp", metrics, "/healthz"))
		time.Sleep(10 * time.Millisecond)
	}
	took, err := get("tcp", metrics, "/readyz", 10*time.Second)
	if err != nil {
		t.Fatalf("a new connection to a listener holding %d idle ones: %v", held, err)
	}
	t.Logf("answered beside %d idle connections in %v", held, took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("answered after %v: it waited for room", took)
	}
	if !closed(idle[0], 2*time.Second) {
		t.Errorf("the longest idle connection is still open")
	}
	if closed(idle[held-1], 100*time.Millisecond) {
		t.Errorf("the newest idle connection was closed, not the oldest")
	}

	// Silent since they opened: they go after newSilence, before the
	// server's 10 s header timeout would free them.
	for _, c := range idle {
		c.Close()
	}
	for range held {
		open("tcp", metrics, "")
	}
	took, err = get("tcp", metrics, "/readyz", 8*time.Second)
	if err != nil {
		t.Fatalf("a new connection to a listener holding %d silent ones: %v", held, err)
	}
	t.Logf("answered beside %d silent connections in %v", held, took.Round(time.Millisecond))

	// Busy: watch streams are never closed for room; a new connection
	// waits until one ends.
	var streams []net.Conn
	for range held {
		streams = append(streams, open("unix", o.Socket, "/v1/watch"))
	}
	time.Sleep(200 * time.Millisecond) // every stream's request read
	if _, err := get("unix", o.Socket, "/v1/node", 1500*time.Millisecond); err == nil {
		t.Errorf("a new connection was served while %d watch streams held the listener", held)
	}
	for _, c := range streams[1:] {
		if closed(c, 10*time.Millisecond) {
			t.Fatalf("a watch stream was closed to make room")
		}
	}
	streams[0].Close()
	if _, err := get("unix", o.Socket, "/v1/node", 10*time.Second); err != nil {
		t.Errorf("after a watch stream ended: %v", err)
	}

	// Counted, by listener.
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `resize_agent_connections_evicted_total{listener="metrics"}`) {
		t.Errorf("no resize_agent_connections_evicted_total for the metrics listener in /metrics")
	}
}

// TestUnreadRequestNotSilent: a new connection whose request waits unread
// in its socket (its server goroutine has not run yet: a flood on one
// CPU) is not closed as silent to make room; one that has sent nothing
// is. CI saw 38 of 5,000 requests cut off so in TestIdleConnectionsBounded
// in a TCG guest.
func TestUnreadRequestNotSilent(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = filepath.Join(t.TempDir(), "l.sock")
			}
			inner, err := net.Listen(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			evicted := 0
			l := newLimitListener(inner, 1, func() { evicted++ })
			defer l.Close()
			dial := func(request bool) net.Conn {
				c, err := net.Dial(network, inner.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				if request {
					io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
				}
				return c
			}
			accept := func() <-chan net.Conn {
				ch := make(chan net.Conn, 1)
				go func() {
					c, err := l.Accept()
					if err == nil {
						ch <- c
					}
				}()
				return ch
			}
			// The one place is held by a connection that has sent its
			// request, unread (no server here reads it), past newSilence.
			dial(true)
			held := <-accept()
			time.Sleep(newSilence + 200*time.Millisecond)
			dial(false)
			next := accept()
			select {
			case <-next:
				t.Fatalf("a connection with its request unread was closed for room (evicted %d)", evicted)
			case <-time.After(newSilence + 500*time.Millisecond):
			}
			// Once it is gone, the next is accepted; that one sends nothing
			// and goes for room after newSilence.
			held.Close()
			var silent net.Conn
			select {
			case silent = <-next:
			case <-time.After(5 * time.Second):
				t.Fatal("not accepted after the held connection closed")
			}
			dial(true)
			select {
			case <-accept():
			case <-time.After(newSilence + 3*time.Second):
				t.Fatal("a silent connection was not closed for room")
			}
			if _, err := silent.Read(make([]byte, 1)); err == nil {
				t.Error("the silent connection is still open")
			}
			if evicted != 1 {
				t.Errorf("%d evictions, want 1", evicted)
			}
		})
	}
}
