package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/agent/kube"
	"github.com/resizer/resize-agent/agent/kube/kubeletconfig"
	"github.com/resizer/resize-agent/agent/kube/latency"
	"github.com/resizer/resize-agent/agent/kube/reclaim"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// driftSweeps: where the eBPF hook times limit writes, every driftSweeps-th
// drift check reads every container's files (5 minutes at the default
// --drift-interval). The hook sees every write to cpu.max, cpu.weight,
// cpu.weight.nice and memory.max; the sweep is for a cgroup whose map
// entry was evicted before it was ever seen (4,096 cgroups written within
// one interval). At every sixth check, as before, it was most of the
// agent's CPU at rest with 1,000 containers (issue 16).
const driftSweeps = 30

// run is the daemon: it returns when ctx ends (nil after a clean shutdown)
// or when it cannot start.
func run(ctx context.Context, o *Options, log *slog.Logger) error {
	s, err := o.validate()
	if err != nil {
		return fmt.Errorf("invalid options: %w", err)
	}
	cgOpts := []cgroup.Option{cgroup.WithMountpoint(o.CgroupRoot), cgroup.WithDriver(cgroup.Driver(o.CgroupDriver))}
	if o.skipFSCheck {
		cgOpts = append(cgOpts, cgroup.WithoutFilesystemCheck())
	}
	cg := cgroup.New(cgOpts...)
	if err := cg.Check(); err != nil {
		return fmt.Errorf("refusing to start: %w", err)
	}
	alloc, err := allocatable(o, s, cg)
	if err != nil {
		return err
	}
	log.Info("node capacity", "allocatable.cpu", alloc.MilliCPU, "allocatable.memory", alloc.Memory, "cgroupRoot", o.CgroupRoot)

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	agentOpts := []agent.Option{agent.WithLogger(log.With("component", "agent")), agent.WithMetrics(m), agent.WithCPUPeriod(o.CPUPeriod)}
	agentOpts = append(agentOpts, agent.WithDriftPolicy(s.drift), agent.WithTargetScope(s.scope.Check))
	log.Info("intent targets", "below", s.scope.Roots, "allowed", s.scope.Allowed)
	agentOpts = append(agentOpts, agent.WithShrinkTimeout(s.shrink))
	kc := o.kubeConfig(log.With("component", "kube"))
	// The kubelet's capacity view, its verdicts counted, and drift of
	// Kubernetes pods judged against its allocation (agent/kube/companion.go).
	capCfg := kube.CapacityConfig{NodeName: kc.NodeName, Logger: log.With("component", "kube"),
		Drift: kube.DriftConfig{Policy: s.kubeDrift, Interval: s.driftEvery, Cgroups: cg, Period: o.CPUPeriod,
			Count:   func(res, action string) { m.Drift.WithLabelValues(res, action).Inc() },
			Checked: func() { m.DriftChecks.WithLabelValues("allocation").Inc() }}}
	if kc.Enabled() {
		kf, err := kubeletFile(o, log)
		if err != nil {
			return err
		}
		capCfg.Kubelet = kf
		if kf.CPUCFSQuotaPeriod != nil {
			// The drift check expects the kubelet's period.
			capCfg.Drift.Period = uint64(*kf.CPUCFSQuotaPeriod / time.Microsecond)
		}
		if kf.MemoryThrottlingFactor != nil {
			agentOpts = append(agentOpts, agent.WithMemoryThrottlingFactor(*kf.MemoryThrottlingFactor))
		}
		agentOpts = append(agentOpts, agent.WithDriftLeavePods())
		capCfg.Predictions = metrics.NewVerdictPredictions(reg)
		// The intake asks the view before each pods/resize patch.
		capCfg.Predictor = &kube.LivePredictor{}
		kc.Predictor = capCfg.Predictor
	}
	if o.CRIEndpoint != "" {
		rt, err := cri.Dial(o.CRIEndpoint)
		if err != nil {
			return err
		}
		capCfg.Drift.Runtime = rt
		defer rt.Close()
		vctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if v, err := rt.Version(vctx); err != nil {
			// The connection is retried on every call: the runtime may come up later.
			log.Warn("container runtime not reachable now; runtime targets fail until it is", "endpoint", o.CRIEndpoint, "err", err)
		} else {
			log.Info("container runtime", "endpoint", o.CRIEndpoint, "version", v)
		}
		cancel()
		agentOpts = append(agentOpts, agent.WithRuntime(rt))
	}
	sources, closeSources, err := pressureSources(o, cg, log)
	if err != nil {
		return err
	}
	defer closeSources()
	agentOpts = append(agentOpts, agent.WithPressure(sources...))
	for _, src := range sources {
		if b, ok := src.(pressure.BPF); ok && b.TimesLimitWrites() {
			// Drift checks read only what was written since; a full read
			// every driftSweeps intervals catches what the hook cannot see.
			sweep := driftSweeps * s.driftEvery
			agentOpts = append(agentOpts, agent.WithDriftWrites(b, sweep))
			capCfg.Drift.Writes, capCfg.Drift.Sweep = b, sweep
			log.Info("drift checks follow the kernel's limit writes", "sweep", sweep)
		}
	}
	// Exits free capacity for Deferred intents the moment they happen.
	if w, err := cg.NewWatcher(); err != nil {
		log.Warn("cannot watch cgroups for exits; capacity frees at the next resync instead", "err", err)
	} else {
		defer w.Close()
		agentOpts = append(agentOpts, agent.WithExitWatcher(w))
	}
	var broken func() error // a journal that cannot write makes the agent not ready
	if o.StateDir != "" {
		syncs := metrics.NewJournalSync(reg)
		j, err := journal.Open(o.StateDir, journal.WithSyncObserver(func(d time.Duration) { syncs.Observe(d.Seconds()) }))
		if err != nil {
			return fmt.Errorf("state-dir: %w", err)
		}
		if q := j.Quarantine(); len(q.Lines) > 0 {
			for _, b := range q.Lines {
				log.Error("journal: bad line set aside; its record is lost", "offset", b.Offset, "line", b.Line, "why", b.Why)
			}
			log.Error("journal: started without its bad lines; the file as it was is kept aside", "lines", len(q.Lines), "copy", q.Copy)
		}
		metrics.RegisterJournal(reg, func() metrics.JournalStats {
			st := j.Stats()
			return metrics.JournalStats{SizeBytes: st.Size, Intents: st.Intents, Compactions: st.Compactions,
				CompactionFailed: st.CompactErr != nil, Broken: st.Err != nil, Syncs: st.Syncs, Records: st.Records,
				Quarantined: st.Quarantined}
		})
		// After a.Close below, so that the agent's last records are written.
		defer func() {
			if err := j.Close(); err != nil {
				log.Error("closing the journal", "err", err)
			}
		}()
		agentOpts = append(agentOpts, agent.WithJournal(j))
		broken = j.Err
	} else {
		log.Warn("no state-dir: intents are not journaled, and those not done are lost when the agent stops")
	}
	if o.NodeName != "" {
		// Kubernetes mode (a node name: a Kubernetes node, whether the
		// intake runs or not): the kubelet owns the pods' resources; the
		// local API does not change them (docs/kubernetes.md).
		agentOpts = append(agentOpts, agent.WithKubeletOwnsPods())
		log.Info("kubernetes mode: the local API refuses intents for Kubernetes pods; annotations become pods/resize patches")
	}
	a := agent.New(cg, admission.NewLedger(alloc), agentOpts...)
	// Before the API serves: intents accepted before a crash come first.
	if _, err := a.Recover(); err != nil {
		return err
	}
	metrics.RegisterNode(reg, a)
	metrics.RegisterIntents(reg, func(s intent.State) []intent.Intent { return a.List(agent.Filter{}, s) }, time.Now)
	// The containers the agent manages, and in Kubernetes mode every
	// container of the node's pods (the latency tracker locates them).
	var kubeTargets func() []pressure.Target
	reg.MustRegister(pressure.NewCollector(func() []pressure.Target {
		ts := a.Targets()
		if kubeTargets == nil {
			return ts
		}
		seen := make(map[string]bool, len(ts))
		for _, x := range ts {
			seen[x.Cgroup] = true
		}
		for _, x := range kubeTargets() {
			if !seen[x.Cgroup] {
				ts = append(ts, x)
			}
		}
		return ts
	}, sources...))

	var ready atomic.Bool
	mux := apiserver.NewHandler(a, apiserver.WithWatchLimits(o.MaxWatches, o.MaxWatchesPerPeer))
	kubeResizes := metrics.NewKubeResize(reg)
	if kc.Enabled() {
		kc.Companions = append(kc.Companions, kube.Capacity(capCfg))
		// Every resize on the node, whoever asked: its phases and pressure.
		lopts := latency.Options{NodeName: kc.NodeName, Cgroups: cg, Sources: sources,
			Metrics: kubeResizes, Logger: log.With("component", "latency")}
		for _, src := range sources {
			if b, ok := src.(pressure.BPF); ok && b.TimesLimitWrites() {
				lopts.Writes = b
			}
		}
		lat, err := latency.New(lopts)
		if err != nil {
			return errors.Join(err, a.Close(context.Background()))
		}
		mux.Handle("GET /v1/kube/resizes", lat)
		kubeTargets = lat.Targets
		kc.Companions = append(kc.Companions, lat.Run)
		if o.KubeMemoryReclaim {
			// The kubelet's memory decreases below usage: reclaim first.
			kc.Companions = append(kc.Companions, reclaim.Companion(a, reclaim.Options{NodeName: kc.NodeName,
				Logger: log.With("component", "reclaim"), Registerer: reg}))
		}
	}
	addOps(mux, reg, &ready, broken)

	var servers []*http.Server
	errc := make(chan error, 3)
	evicted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resize_agent_connections_evicted_total",
		Help: "Connections a listener closed while they waited without a request, to make room at --max-connections."}, []string{"listener"})
	reg.MustRegister(evicted)
	serve := func(name string, l net.Listener, h http.Handler, connCtx func(context.Context, net.Conn) context.Context, tlsConf *tls.Config) {
		// Idle keep-alive connections were held forever: 12,000 of them
		// took the daemon past its memory limit (issue 15).
		ll := newLimitListener(l, o.MaxConnections, evicted.WithLabelValues(name).Inc)
		l = ll
		if tlsConf != nil {
			l = tls.NewListener(l, tlsConf)
		}
		srv := &http.Server{Handler: h, ConnContext: connCtx, ConnState: ll.track,
			ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: o.readTimeout, WriteTimeout: o.writeTimeout, IdleTimeout: s.idle,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		servers = append(servers, srv)
		log.Info("serving", "listener", name, "address", l.Addr().String())
		if o.onListen != nil {
			o.onListen(name, l.Addr().String())
		}
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	if o.Socket != "" {
		l, err := listenUnix(o.Socket, s.apiGIDs)
		if err != nil {
			return err
		}
		defer os.Remove(o.Socket)
		pp, err := socketPolicy(o.Socket, s.apiGIDs)
		if err != nil {
			return err
		}
		serve("api-unix", l, apiserver.RequirePeer(pp, mux), apiserver.PeerConnContext, nil)
	}
	if o.ListenTCP != "" {
		l, err := net.Listen("tcp", o.ListenTCP)
		if err != nil {
			return fmt.Errorf("listen-tcp: %w", err)
		}
		serve("api-tcp", l, requireToken(s.token, mux), nil, s.apiTLS)
	}
	metricsAddr := ""
	if o.MetricsAddress != "" {
		l, err := net.Listen("tcp", o.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics-address: %w", err)
		}
		ops := http.NewServeMux()
		addOps(ops, reg, &ready, broken)
		var h http.Handler = ops
		if s.metricsTLS != nil && s.metricsTLS.ClientCAs != nil {
			h = requireClientCert(ops)
		}
		metricsAddr = l.Addr().String()
		serve("metrics", l, h, nil, s.metricsTLS)
	}

	// The privileged part of start-up is done: listeners bound, the socket
	// given to its group, the eBPF programs loaded, the journal open.
	if o.dropCaps {
		if err := dropCapabilities(keptCapabilities(len(sources) > 1), log); err != nil {
			return errors.Join(err, a.Close(context.Background()))
		}
	}

	stopKube, err := kube.Start(ctx, kc, a)
	if err != nil {
		return errors.Join(err, a.Close(context.Background()))
	}

	resyncCtx, stopResync := context.WithCancel(context.Background())
	resyncDone := make(chan struct{})
	go func() { a.Run(resyncCtx, s.resync); close(resyncDone) }()
	driftDone := make(chan struct{})
	go func() { a.RunDrift(resyncCtx, s.driftEvery); close(driftDone) }()

	if s.release > 0 {
		releases := prometheus.NewCounter(prometheus.CounterOpts{Name: "resize_agent_memory_releases_total",
			Help: "Times the agent, at rest, returned its heap's free pages and unmapped its binary's start-up pages (--release-memory-after)."})
		reg.MustRegister(releases)
		rel := &releaser{every: s.release, activity: a.Activity, release: releaseMemory, log: log, done: releases.Inc}
		releaseDone := make(chan struct{})
		go func() { rel.run(resyncCtx); close(releaseDone) }()
		defer func() { <-releaseDone }()
	}

	ready.Store(true)
	if o.onReady != nil {
		o.onReady(metricsAddr)
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-errc:
		log.Error("server failed, shutting down", "err", runErr)
	}
	ready.Store(false)
	stopResync()
	<-resyncDone
	<-driftDone
	stopKube() // no new intents from Kubernetes while the agent closes

	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.shutdown)
	defer cancel()
	// The agent first: it refuses new intents, finishes the writes in flight
	// and fails what is queued; watch streams end, so the servers can stop.
	if err := a.Close(shutdownCtx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	for _, srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return runErr
}

func allocatable(o *Options, s settings, cg *cgroup.Manager) (admission.Capacity, error) {
	if s.allocatable != nil {
		return *s.allocatable, nil
	}
	m, err := admission.ReadMachine(o.procRoot)
	if err != nil {
		return admission.Capacity{}, fmt.Errorf("detecting capacity (set cpu-allocatable and memory-allocatable instead): %w", err)
	}
	lim, err := cg.LimitsOf(o.CapacityCgroup)
	if err != nil {
		return admission.Capacity{}, fmt.Errorf("capacity-cgroup %s: %w", o.CapacityCgroup, err)
	}
	return admission.Allocatable(m, lim.MilliCPU, lim.Memory, s.reserved), nil
}

// listenUnix listens on path with mode 0600 (0660 with the api-group),
// replacing a stale socket but refusing to take over one that still answers.
func listenUnix(path string, gids []uint32) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another agent", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	// The umask makes the socket 0600 from the start, with no window in
	// which another user could connect.
	l, err := listenWithUmask(path)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := setSocketAccess(path, gids); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// requireToken compares digests, so that the time taken does not depend on
// the token's length either (ConstantTimeCompare returns at once on a
// length mismatch).
func requireToken(token string, h http.Handler) http.Handler {
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			// An unauthenticated peer keeps no connection open.
			w.Header().Set("Connection", "close")
			http.Error(w, `{"error":"a valid bearer token is required","reason":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// requireClientCert serves /metrics only to clients whose certificate the
// client CA verified; the probes' /healthz and /readyz stay open, as the
// kubelet's probes present no certificate. The metrics name every managed
// container, its pod UID and cgroup (issue 15).
func requireClientCert(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			w.Header().Set("Connection", "close")
			http.Error(w, "a client certificate signed by the metrics client CA is required", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// addOps adds the metrics, liveness and readiness endpoints; broken, when
// not nil, reports what makes the agent unable to accept intents (a failed
// journal). A failed journal stays failed until the agent restarts (its
// file holds nothing of the failed batch, the agent's memory may), so it
// fails liveness too: the restart replays what is on disk and tries again.
func addOps(mux *http.ServeMux, reg *prometheus.Registry, ready *atomic.Bool, broken func() error) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if broken != nil {
			if err := broken(); err != nil {
				http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if broken != nil {
			if err := broken(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
}

// kubeletFile reads the kubelet's configuration file (--kubelet-config). A
// missing file leaves the kubelet's defaults, with a warning; one the agent
// cannot read stops it: its predictions and drift reports would follow
// settings the kubelet does not have.
func kubeletFile(o *Options, log *slog.Logger) (kubeletconfig.File, error) {
	if o.KubeletConfig == "" {
		log.Info("kubelet configuration not read (--kubelet-config is empty): the kubelet's defaults for its release apply")
		return kubeletconfig.File{}, nil
	}
	f, err := kubeletconfig.Load(o.KubeletConfig)
	switch {
	case errors.Is(err, kubeletconfig.ErrNotFound):
		log.Warn("kubelet configuration not found: the kubelet's defaults for its release apply; mount the kubelet's file or set --kubelet-config", "path", o.KubeletConfig)
		return kubeletconfig.File{}, nil
	case err != nil:
		return kubeletconfig.File{}, fmt.Errorf("kubelet-config: %w", err)
	}
	attrs := []any{"path", f.Path, "cpuManagerPolicy", f.CPUManagerPolicy, "memoryManagerPolicy", f.MemoryManagerPolicy,
		"memoryReservationPolicy", f.MemoryReservationPolicy, "featureGates", f.FeatureGates}
	if f.CPUCFSQuota != nil {
		attrs = append(attrs, "cpuCFSQuota", *f.CPUCFSQuota)
	}
	if f.CPUCFSQuotaPeriod != nil {
		attrs = append(attrs, "cpuCFSQuotaPeriod", f.CPUCFSQuotaPeriod.String())
		if p := uint64(*f.CPUCFSQuotaPeriod / time.Microsecond); p != o.CPUPeriod {
			log.Info("the drift check takes the kubelet's CFS period, not --cpu-period", "kubelet", p, "cpuPeriod", o.CPUPeriod)
		}
	}
	if f.MemoryThrottlingFactor != nil {
		attrs = append(attrs, "memoryThrottlingFactor", *f.MemoryThrottlingFactor)
	}
	log.Info("kubelet configuration", attrs...)
	return f, nil
}
