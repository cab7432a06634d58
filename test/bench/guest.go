package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cri"
)

// config is what a guest run measures.
type config struct {
	out      string
	n        int // resizes per method (latency), and the scale of the others
	nRuntime int // resizes per method that goes through containerd
	workers  int
	rest     time.Duration
	bpf      string
}

type guest struct {
	cfg     config
	res     Results
	started time.Time
}

func (g *guest) phase(name string, start time.Time) {
	s := time.Since(start).Seconds()
	g.res.Phases = append(g.res.Phases, Phase{Name: name, Seconds: s})
	fmt.Printf("bench: %s done in %.1fs\n", name, s)
}

func runGuest(cfg config) error {
	g := &guest{cfg: cfg, started: time.Now()}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	g.res.Meta = Meta{N: cfg.n, NRuntime: cfg.nRuntime, CPUs: runtime.NumCPU(), BPF: cfg.bpf, Start: g.started}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		g.res.Meta.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("runc", "--version").Output(); err == nil {
		g.res.Meta.Runc = strings.Fields(string(out))[2]
	}
	if fs, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers")); err != nil || !strings.Contains(string(fs), "cpu") {
		return fmt.Errorf("needs cgroup v2 with the cpu controller at %s (run make bench, which boots the VM): %v", cgroupRoot, err)
	}
	if _, err := os.Stat(containerdSocket); err != nil {
		return fmt.Errorf("needs containerd at %s: %w", containerdSocket, err)
	}
	for _, p := range []string{"/bench", "/bench/t"} {
		if err := mkCgroup(p, true); err != nil {
			return err
		}
	}
	defer os.WriteFile(filepath.Join(cfg.out, "done"), nil, 0o644)

	for _, mode := range []string{"off", "on"} {
		if err := g.cost(mode); err != nil {
			return err
		}
	}
	d, err := startDaemon(cfg.bpf, "/run/bench/agent.sock", filepath.Join(cfg.out, "agent-main.log"), "/var/lib/resize-agent-bench/main")
	if err != nil {
		return err
	}
	defer d.stop()
	if err := g.latency(d); err != nil {
		return err
	}
	if err := g.scale(d); err != nil {
		return err
	}
	d.stop()
	if err := g.profile(); err != nil {
		return err
	}
	g.res.Meta.End = time.Now()
	return g.write()
}

func (g *guest) write() error {
	b, err := json.MarshalIndent(g.res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(g.cfg.out, "results.json"), b, 0o644)
}

// mkCgroup creates a cgroup below the root; parents get cpu and memory
// for their children.
func mkCgroup(p string, parent bool) error {
	d := filepath.Join(cgroupRoot, p)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	if parent {
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu +memory"), 0); err != nil {
			return fmt.Errorf("%s: enabling cpu and memory: %w", p, err)
		}
	}
	return nil
}

// latency runs every method side by side: round after round, each method
// does one resize, in an order that rotates, so that whatever else the
// machine does falls on all of them alike.
func (g *guest) latency(d *daemon) error {
	start := time.Now()
	ctx := context.Background()
	cfg := g.cfg
	cc, err := cri.Dial(containerdSocket)
	if err != nil {
		return err
	}
	defer cc.Close()
	if v, err := cc.Version(ctx); err == nil {
		g.res.Meta.Containerd = v
	}
	tc, err := dialTasks(containerdSocket, "k8s.io")
	if err != nil {
		return err
	}
	defer tc.close()
	// The agent's container has a pod of its own, with a sidecar it does
	// not manage, as a standalone node's pods have: the peers resize
	// their containers every round, and a resize's pod cgroup must leave
	// the siblings room, so with them in its pod each of the agent's
	// resizes would list the pod again (it would be right to: their
	// values change).
	agentPod, err := newPod(ctx, "bench-agent")
	if err != nil {
		return err
	}
	defer agentPod.remove()
	pod, err := newPod(ctx, "bench")
	if err != nil {
		return err
	}
	defer pod.remove()
	cts := map[string]benchContainer{}
	for _, n := range []string{"agent", "sidecar"} {
		ct, err := agentPod.run(ctx, cc, n)
		if err != nil {
			return err
		}
		cts[n] = ct
	}
	names := []string{"runc", "tasks", "cri"}
	hasCtr := ctrHasTaskUpdate()
	if hasCtr {
		names = append(names, "ctr")
	} else {
		g.res.Meta.Notes = append(g.res.Meta.Notes, "`ctr task update` does not exist in this ctr (containerd 2.x's ctr has no `task update`); containerd's Tasks.Update, the API call behind it, is measured instead")
	}
	for _, n := range names {
		ct, err := pod.run(ctx, cc, n)
		if err != nil {
			return err
		}
		cts[n] = ct
	}
	for _, p := range []string{"/bench/floor", "/bench/direct", "/bench/direct-watch", "/bench/roundtrip"} {
		if err := mkCgroup(p, false); err != nil {
			return err
		}
	}
	var lastDirect string // the direct method's last intent, for the round trip's GET
	methods := []*method{
		floorMethod("/bench/floor", cfg.n),
		agentDirectMethod(d.client, &lastDirect, "/bench/direct", cfg.n),
		agentWatchMethod(d.client, "/bench/direct-watch", cfg.n),
		roundTripMethod(d.client, &lastDirect, "/bench/roundtrip", cfg.n),
		agentCRIMethod(d.client, agentPod.uid, cts["agent"], cfg.nRuntime),
		criMethod(cc, cts["cri"], cfg.nRuntime),
		taskAPIMethod(tc, cts["tasks"], cfg.nRuntime),
		runcMethod(cts["runc"], cfg.nRuntime),
	}
	if hasCtr {
		methods = append(methods, ctrMethod(cts["ctr"], cfg.nRuntime, cfg.out))
	}
	// Warm-up: the agent registers its containers, caches fill.
	for _, m := range methods {
		for range 4 {
			if _, _, err := m.once(ctx); err != nil {
				return fmt.Errorf("%s warm-up: %w", m.name, err)
			}
		}
	}
	s0, _ := sample(d.pid())
	rounds := 0
	for i := range cfg.n {
		for j := range methods {
			m := methods[(i+j)%len(methods)]
			if i >= m.n {
				continue
			}
			if err := m.record(ctx); err != nil {
				return err
			}
		}
		rounds++
		if (i+1)%100 == 0 {
			fmt.Printf("bench: latency round %d/%d (%.0fs)\n", i+1, cfg.n, time.Since(start).Seconds())
		}
	}
	s1, _ := sample(d.pid())
	for _, m := range methods {
		row := LatencyRow{Method: m.name, What: m.what, Client: summarize(m.client), Errors: m.errs}
		if len(m.server) > 0 {
			s := summarize(m.server)
			row.Server = &s
		}
		g.res.Latency = append(g.res.Latency, row)
	}
	resizes := 0
	for _, m := range []*method{methods[1], methods[2], methods[4]} { // the agent's three
		resizes += len(m.client)
	}
	managed, err := d.client.Containers(ctx)
	if err != nil {
		return fmt.Errorf("listing the managed containers: %w", err)
	}
	g.res.Cost = append(g.res.Cost, costRow(d.bpf, "latency run (agent's resizes interleaved with the peers')", len(managed), s0, s1, resizes))
	g.phase(fmt.Sprintf("latency (%d rounds)", rounds), start)
	return g.write()
}

// agentMethods are one resize method per bare cgroup, through the agent.
func agentMethods(d *daemon, paths []string) []*method {
	var out []*method
	for _, p := range paths {
		t := intent.Target{Name: "c" + strings.ReplaceAll(strings.Trim(p, "/"), "/", "-"), CgroupPath: p}
		out = append(out, &method{cgroup: p, resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			return agentResize(ctx, d.client, t, milli, nil)
		}})
	}
	return out
}

// concurrent resizes through the agent with workers clients, each owning
// every workers-th cgroup, total resizes in all.
func concurrent(d *daemon, ms []*method, workers, total int) ThroughputRow {
	workers = min(workers, len(ms))
	var mu sync.Mutex
	var client, server []time.Duration
	errs := 0
	s0, _ := sample(d.pid())
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		var mine []*method
		for i := w; i < len(ms); i += workers {
			mine = append(mine, ms[i])
		}
		n := total / workers
		if w < total%workers {
			n++
		}
		wg.Go(func() {
			ctx := context.Background()
			for k := range n {
				cl, srv, err := mine[k%len(mine)].once(ctx)
				mu.Lock()
				if err != nil {
					if errs < 3 {
						fmt.Fprintln(os.Stderr, "bench: concurrent resize:", err)
					}
					errs++
				} else {
					client = append(client, cl)
					if srv >= 0 {
						server = append(server, srv)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	s1, _ := sample(d.pid())
	return ThroughputRow{Managed: len(ms), Workers: workers, Resizes: len(client), Seconds: secs,
		PerSec: float64(len(client)) / secs, Client: summarize(client), Server: summarize(server), Errors: errs,
		AgentCPU: cpuPercent(s0, s1)}
}

// settle is how long the agent is left after a load before its cost at
// rest is sampled.
const settle = 10 * time.Second

// driftSweep is the daemon's drift sweep at the default --drift-interval
// with the eBPF hook (driftSweeps in cmd/resize-agent/run.go).
const driftSweep = 5 * time.Minute

func benchPaths(parent string, n int) ([]string, error) {
	var out []string
	for i := range n {
		p := fmt.Sprintf("%s/%04d", parent, i)
		if err := mkCgroup(p, false); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// scale measures throughput across 10, 100 and 1000 cgroups, and the
// latency of one cgroup's resizes with that many managed.
func (g *guest) scale(d *daemon) error {
	start := time.Now()
	paths, err := benchPaths("/bench/t", 1000)
	if err != nil {
		return err
	}
	ms := agentMethods(d, paths)
	for _, k := range []int{10, 100, 1000} {
		total := max(g.cfg.n, 2*k)
		row := concurrent(d, ms[:k], g.cfg.workers, total)
		fmt.Printf("bench: throughput over %d cgroups: %d resizes in %.1fs, %.0f/s\n", k, row.Resizes, row.Seconds, row.PerSec)
		g.res.Throughput = append(g.res.Throughput, row)
		if row.Errors > 0 {
			return fmt.Errorf("throughput over %d cgroups: %d resizes failed", k, row.Errors)
		}
		ctx := context.Background()
		managed, err := d.client.Containers(ctx)
		if err != nil {
			return err
		}
		m := ms[0]
		m.client, m.server = nil, nil
		for range max(100, g.cfg.n/4) {
			if err := m.record(ctx); err != nil {
				return err
			}
		}
		g.res.Scaling = append(g.res.Scaling, ScalingRow{Managed: len(managed), Client: summarize(m.client), Server: summarize(m.server)})
		if err := g.write(); err != nil {
			return err
		}
	}
	// The throughput rows' peer: as many clients, each making the API's
	// round trip and a bare write of a cgroup of its own (roundTripMethod),
	// with nothing asked of the agent.
	page, _, err := d.client.ListPage(context.Background(), "", intent.Completed, 1, "")
	if err != nil || len(page) == 0 {
		return fmt.Errorf("a settled intent for the round trip's GET: %v (%d)", err, len(page))
	}
	if err := mkCgroup("/bench/rt", true); err != nil {
		return err
	}
	rtPaths, err := benchPaths("/bench/rt", g.cfg.workers)
	if err != nil {
		return err
	}
	var rt []*method
	for _, p := range rtPaths {
		rt = append(rt, roundTripMethod(d.client, &page[0].ID, p, 0))
	}
	row := concurrent(d, rt, g.cfg.workers, max(g.cfg.n, 2000))
	row.Peer = roundTripRow
	fmt.Printf("bench: throughput of the round trip peer: %d in %.1fs, %.0f/s\n", row.Resizes, row.Seconds, row.PerSec)
	g.res.Throughput = append(g.res.Throughput, row)
	if row.Errors > 0 {
		return fmt.Errorf("the round trip peer: %d failed", row.Errors)
	}
	// At rest with everything managed: the periodic work (resync, drift),
	// once the load's tail (the collector returning its heap) is over.
	managed, err := d.client.Containers(context.Background())
	if err != nil {
		return err
	}
	time.Sleep(settle)
	a, _ := sample(d.pid())
	// Over the drift sweep's period at least, so that one sweep (every
	// container's files read) falls in it.
	time.Sleep(max(g.cfg.rest, driftSweep))
	b, _ := sample(d.pid())
	g.res.Cost = append(g.res.Cost, costRow(d.bpf, "at rest, after the throughput runs", len(managed), a, b, 0))
	g.phase("throughput and scaling", start)
	return g.write()
}

func costRow(bpf, phase string, managed int, a, b procSample, resizes int) CostRow {
	r := CostRow{BPF: bpf, Phase: phase, Managed: managed, Seconds: b.at.Sub(a.at).Seconds(),
		CPUPercent: cpuPercent(a, b), RSSKiB: b.rssKiB, HWMKiB: b.hwmKiB, AnonKiB: b.anonKiB, FileKiB: b.fileKiB, ShmemKiB: b.shmemKiB, Resizes: resizes}
	if resizes > 0 {
		r.CPUPerOpMs = float64(b.cpuTicks-a.cpuTicks) / clockTicks * 1000 / float64(resizes)
	}
	return r
}

// cost runs a fresh daemon with eBPF on or off: at rest, under a load of
// concurrent resizes across 100 cgroups, and at rest again with them managed.
func (g *guest) cost(mode string) error {
	start := time.Now()
	d, err := startDaemon(mode, "/run/bench/cost-"+mode+".sock", filepath.Join(g.cfg.out, "agent-cost-bpf-"+mode+".log"), "/var/lib/resize-agent-bench/cost-"+mode)
	if err != nil {
		return err
	}
	defer d.stop()
	time.Sleep(time.Second)
	rest := func(phase string, managed int) error {
		a, err := sample(d.pid())
		if err != nil {
			return err
		}
		time.Sleep(g.cfg.rest)
		b, err := sample(d.pid())
		if err != nil {
			return err
		}
		g.res.Cost = append(g.res.Cost, costRow(mode, phase, managed, a, b, 0))
		return nil
	}
	if err := rest("at rest", 0); err != nil {
		return err
	}
	parent := "/bench/cost-" + mode
	if err := mkCgroup(parent, true); err != nil {
		return err
	}
	paths, err := benchPaths(parent, 100)
	if err != nil {
		return err
	}
	ms := agentMethods(d, paths)
	if row := concurrent(d, ms, g.cfg.workers, len(ms)); row.Errors > 0 { // register them
		return fmt.Errorf("cost (bpf %s): registering: %d resizes failed", mode, row.Errors)
	}
	a, _ := sample(d.pid())
	row := concurrent(d, ms, g.cfg.workers, g.cfg.n)
	b, _ := sample(d.pid())
	if row.Errors > 0 {
		return fmt.Errorf("cost load (bpf %s): %d resizes failed", mode, row.Errors)
	}
	g.res.Cost = append(g.res.Cost, costRow(mode, fmt.Sprintf("load: %d workers resizing 100 cgroups (%.0f/s)", row.Workers, row.PerSec), 100, a, b, row.Resizes))
	if err := rest("at rest", 100); err != nil {
		return err
	}
	g.phase("agent cost, bpf "+mode, start)
	return g.write()
}
