package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup"
)

// profile runs the agent's packages in this process, wired as the daemon
// wires them (agent, metrics, the API on a unix socket, logging at info),
// and takes a CPU profile of a concurrent run over 100 bare cgroups. The
// agent's goroutines carry the label side=agent (labels are inherited by
// the goroutines they start), so the profile can be cut to the agent's part.
func (g *guest) profile() error {
	start := time.Now()
	lf, err := os.Create(filepath.Join(g.cfg.out, "agent-profile.log"))
	if err != nil {
		return err
	}
	defer lf.Close()
	reg := prometheus.NewRegistry()
	a := agent.New(cgroup.New(), admission.NewLedger(admission.Capacity{MilliCPU: 100000, Memory: 1 << 40}),
		agent.WithLogger(slog.New(slog.NewTextHandler(lf, nil)).With("component", "agent")), agent.WithMetrics(metrics.New(reg)))
	socket := "/run/bench/profile.sock"
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: apiserver.NewHandler(a), ReadHeaderTimeout: 10 * time.Second}
	pprof.Do(context.Background(), pprof.Labels("side", "agent"), func(context.Context) {
		go func() { _ = srv.Serve(l) }()
	})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Close(ctx)
		_ = srv.Shutdown(ctx)
	}()
	parent := "/bench/profile"
	if err := mkCgroup(parent, true); err != nil {
		return err
	}
	paths, err := benchPaths(parent, 100)
	if err != nil {
		return err
	}
	d := &daemon{client: api.NewClient(socket)}
	ms := agentMethods(d, paths)
	_ = concurrent(d, ms, g.cfg.workers, 100) // register, warm up
	f, err := os.Create(filepath.Join(g.cfg.out, "cpu.pprof"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	row := concurrent(d, ms, g.cfg.workers, max(100, g.cfg.n/2))
	pprof.StopCPUProfile()
	if row.Errors > 0 {
		return fmt.Errorf("profile run: %d resizes failed", row.Errors)
	}
	g.res.Meta.Notes = append(g.res.Meta.Notes, fmt.Sprintf("profile: %d resizes over 100 cgroups at %.0f/s with the agent in the bench process", row.Resizes, row.PerSec))
	g.phase("profile", start)
	return nil
}
