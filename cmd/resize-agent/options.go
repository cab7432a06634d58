package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/kube"
	"github.com/resizer/resize-agent/agent/kube/allocdrift"
	"github.com/resizer/resize-agent/agent/kube/kubeletconfig"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// Options configure the daemon. Flags override the config file.
type Options struct {
	ConfigFile string `json:"-"`

	CgroupRoot string `json:"cgroupRoot"`
	// CgroupDriver is auto, cgroupfs or systemd (see cgroup.Driver).
	CgroupDriver string `json:"cgroupDriver"`
	// CapacityCgroup is the cgroup the managed containers live under
	// (e.g. /kubepods); its cpu.max and memory.max bound allocatable.
	CapacityCgroup string `json:"capacityCgroup"`
	// TargetRoot is the cgroup intents' targets must be below (default:
	// CapacityCgroup when set, else the kubepods slice or cgroup);
	// AllowTargetCgroups names cgroups outside it, or host services below
	// it, that may be targets too.
	TargetRoot         string   `json:"targetRoot"`
	AllowTargetCgroups []string `json:"allowTargetCgroups"`
	Socket             string   `json:"socket"`
	ListenTCP          string   `json:"listenTCP"`
	TCPTokenFile       string   `json:"tcpTokenFile"`
	// TLSCertFile and TLSKeyFile serve the TCP API over TLS; without them
	// it listens on loopback addresses only.
	TLSCertFile string `json:"tlsCertFile"`
	TLSKeyFile  string `json:"tlsKeyFile"`
	// APIGroup (a name or ID) may use the unix socket too: it is then 0660
	// with that group, and its members pass the peer check.
	APIGroup       string `json:"apiGroup"`
	MetricsAddress string `json:"metricsAddress"`
	// Metrics over TLS; with a client CA, /metrics only to clients with a
	// certificate it signed (/healthz and /readyz stay open to probes).
	MetricsTLSCertFile  string `json:"metricsTLSCertFile"`
	MetricsTLSKeyFile   string `json:"metricsTLSKeyFile"`
	MetricsClientCAFile string `json:"metricsClientCAFile"`
	// MaxConnections caps the connections each listener holds at a time;
	// IdleTimeout closes keep-alive connections with no request.
	MaxConnections int    `json:"maxConnections"`
	IdleTimeout    string `json:"idleTimeout"`
	// MaxWatches caps the API's watch streams in all, MaxWatchesPerPeer
	// those of one client (a local user, a TCP address).
	MaxWatches        int    `json:"maxWatches"`
	MaxWatchesPerPeer int    `json:"maxWatchesPerPeer"`
	CRIEndpoint       string `json:"criEndpoint"`
	BPF               string `json:"bpf"`

	CPUAllocatable    string `json:"cpuAllocatable"`
	MemoryAllocatable string `json:"memoryAllocatable"`
	CPUReserved       string `json:"cpuReserved"`
	MemoryReserved    string `json:"memoryReserved"`

	CPUPeriod       uint64 `json:"cpuPeriod"`
	ResyncInterval  string `json:"resyncInterval"`
	Drift           string `json:"drift"`         // drift policy: report, restore, adopt or off
	DriftInterval   string `json:"driftInterval"` // how often to compare the cgroup files with the intents
	ShutdownTimeout string `json:"shutdownTimeout"`
	// MemoryShrinkTimeout bounds bringing usage under a lower memory limit
	// (memory.high, memory.reclaim); "off" refuses such decreases.
	MemoryShrinkTimeout string `json:"memoryShrinkTimeout"`
	// ReleaseMemoryAfter: once the intents have stood still this long, the
	// agent returns the heap's free pages, unmaps its binary's start-up
	// pages and lowers GOGC until they change (release.go); "off": never.
	ReleaseMemoryAfter string `json:"releaseMemoryAfter"`
	// StateDir holds the intent journal (agent/journal); empty: none.
	StateDir string `json:"stateDir"`

	LogLevel  string `json:"logLevel"`
	LogFormat string `json:"logFormat"`

	// Kubernetes intake (agent/kube): off without a node name.
	Kubeconfig string `json:"kubeconfig"`
	NodeName   string `json:"nodeName"`
	KubeIntake string `json:"kubeIntake"`
	// KubeMemoryReclaim: reclaim ahead of the kubelet's memory limit
	// decreases below usage (agent/kube/reclaim).
	KubeMemoryReclaim bool `json:"kubeMemoryReclaim"`
	// KubeDrift is the drift policy for Kubernetes pods' containers in
	// Kubernetes mode, against the kubelet's allocation.
	KubeDrift string `json:"kubeDrift"`
	// KubeletConfig is the kubelet's configuration file, read in
	// Kubernetes mode (agent/kube/kubeletconfig); empty: the kubelet's
	// defaults.
	KubeletConfig string `json:"kubeletConfig"`

	// For tests: where /proc is, and whether the cgroup root may be a plain
	// directory.
	procRoot    string
	skipFSCheck bool
	onReady     func(metricsAddr string)
	onListen    func(listener, addr string) // each listener, as it starts serving
	// dropCaps is set by main: tests run the daemon in their own process,
	// which must keep its capabilities for the tests that follow.
	dropCaps bool
	// The servers' read and write timeouts, shortened by tests.
	readTimeout, writeTimeout time.Duration
}

// DefaultOptions are the daemon's defaults.
func DefaultOptions() *Options {
	return &Options{
		CgroupRoot:          cgroup.DefaultMountpoint,
		CgroupDriver:        string(cgroup.DriverAuto),
		CapacityCgroup:      "/",
		Socket:              "/run/resize-agent/agent.sock",
		MetricsAddress:      ":9847",
		MaxConnections:      1000,
		IdleTimeout:         "60s",
		MaxWatches:          apiserver.DefaultMaxWatches,
		MaxWatchesPerPeer:   apiserver.DefaultMaxWatchesPerPeer,
		CRIEndpoint:         cri.DefaultEndpoint,
		BPF:                 "auto",
		CPUPeriod:           cgroup.DefaultPeriod,
		ResyncInterval:      "10s",
		Drift:               string(agent.DriftRestore),
		DriftInterval:       "10s",
		ShutdownTimeout:     "10s",
		MemoryShrinkTimeout: "30s",
		ReleaseMemoryAfter:  "30s",
		StateDir:            "/var/lib/resize-agent",
		LogLevel:            "info",
		LogFormat:           "text",
		NodeName:            os.Getenv("NODE_NAME"),
		KubeIntake:          string(kube.ModeAnnotation),
		KubeMemoryReclaim:   true,
		KubeDrift:           string(allocdrift.PolicyReport),
		KubeletConfig:       kubeletconfig.DefaultPath,
		procRoot:            "/proc",
		readTimeout:         readTimeout,
		writeTimeout:        writeTimeout,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ConfigFile, "config", "", "YAML config file; flags given on the command line override it")
	fs.StringVar(&o.CgroupRoot, "cgroup-root", o.CgroupRoot, "cgroup v2 mountpoint")
	fs.StringVar(&o.CgroupDriver, "cgroup-driver", o.CgroupDriver, "cgroup driver of the kubelet and runtime: systemd (limits of .scope/.slice cgroups set as unit properties over D-Bus, so a daemon-reload keeps them), cgroupfs (the files), or auto (systemd where /run/systemd/system exists and the cgroup is a unit)")
	fs.StringVar(&o.CapacityCgroup, "capacity-cgroup", o.CapacityCgroup, "cgroup (relative to the root) whose cpu.max and memory.max bound allocatable, e.g. /kubepods")
	fs.StringVar(&o.TargetRoot, "target-root", o.TargetRoot, "cgroup (relative to the root) that intents' targets must be below, never the root itself (default: --capacity-cgroup when set, else /kubepods.slice or /kubepods, or either below kind's /kubelet); host services (system.slice, user.slice, init.scope, *.service) are refused even below it")
	fs.Func("allow-target-cgroup", "a cgroup outside --target-root, or a host service's below it, that intents may target too (repeat for more)", func(v string) error {
		o.AllowTargetCgroups = append(o.AllowTargetCgroups, v)
		return nil
	})
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "certificate for the TCP API (with --tls-key-file); without TLS, --listen-tcp must be a loopback address")
	fs.StringVar(&o.TLSKeyFile, "tls-key-file", o.TLSKeyFile, "private key for the TCP API's certificate")
	fs.StringVar(&o.MetricsTLSCertFile, "metrics-tls-cert-file", o.MetricsTLSCertFile, "serve metrics and health over TLS with this certificate (with --metrics-tls-key-file)")
	fs.StringVar(&o.MetricsTLSKeyFile, "metrics-tls-key-file", o.MetricsTLSKeyFile, "private key for the metrics certificate")
	fs.StringVar(&o.MetricsClientCAFile, "metrics-client-ca-file", o.MetricsClientCAFile, "serve /metrics only to clients with a certificate this CA signed (needs the metrics TLS files); /healthz and /readyz stay open for probes")
	fs.StringVar(&o.Socket, "socket", o.Socket, "unix socket for the API (mode 0600; 0660 with --api-group)")
	fs.StringVar(&o.ListenTCP, "listen-tcp", o.ListenTCP, "also serve the API on this TCP address (needs --tcp-token-file)")
	fs.StringVar(&o.TCPTokenFile, "tcp-token-file", o.TCPTokenFile, "file holding the bearer token TCP clients must send")
	fs.StringVar(&o.APIGroup, "api-group", o.APIGroup, "group (name or ID) whose members may also use the unix socket; the socket is then 0660 with that group (default: root and the socket's owner only, mode 0600)")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "address for /metrics, /healthz and /readyz (empty: none)")
	fs.IntVar(&o.MaxConnections, "max-connections", o.MaxConnections, "connections each listener (unix socket, TCP API, metrics) holds at a time; at the cap the one idle longest is closed to make room, and with all busy (watch streams) more wait until one ends")
	fs.StringVar(&o.IdleTimeout, "idle-timeout", o.IdleTimeout, "how long a keep-alive connection may stay open without a request")
	fs.IntVar(&o.MaxWatches, "max-watches", o.MaxWatches, "watch streams the API serves at once; more are refused with 429")
	fs.IntVar(&o.MaxWatchesPerPeer, "max-watches-per-peer", o.MaxWatchesPerPeer, "watch streams one client (a local user on the socket, an address on TCP) may hold at once")
	fs.StringVar(&o.CRIEndpoint, "cri-endpoint", o.CRIEndpoint, "CRI runtime socket for containers named by pod UID or ID (empty: bare cgroups only)")
	fs.StringVar(&o.BPF, "bpf", o.BPF, "eBPF pressure tracking: auto (PSI files only where BPF cannot load), on (refuse to start without it) or off")
	fs.StringVar(&o.CPUAllocatable, "cpu-allocatable", o.CPUAllocatable, "allocatable CPU as a quantity (default: detected minus --cpu-reserved)")
	fs.StringVar(&o.MemoryAllocatable, "memory-allocatable", o.MemoryAllocatable, "allocatable memory as a quantity (default: detected minus --memory-reserved)")
	fs.StringVar(&o.CPUReserved, "cpu-reserved", o.CPUReserved, "CPU held back from detected capacity, e.g. 500m")
	fs.StringVar(&o.MemoryReserved, "memory-reserved", o.MemoryReserved, "memory held back from detected capacity, e.g. 1Gi")
	fs.Uint64Var(&o.CPUPeriod, "cpu-period", o.CPUPeriod, "cpu.max period in microseconds")
	fs.StringVar(&o.ResyncInterval, "resync-interval", o.ResyncInterval, "how often to look for containers whose cgroup is gone")
	fs.StringVar(&o.Drift, "drift", o.Drift, "when a managed cgroup's values change behind the agent's back: report, restore (write the agent's values back through an intent), adopt (take the new limits when QoS and capacity allow) or off")
	fs.StringVar(&o.DriftInterval, "drift-interval", o.DriftInterval, "how often to compare managed cgroup files with the last completed intents")
	fs.StringVar(&o.MemoryShrinkTimeout, "memory-shrink-timeout", o.MemoryShrinkTimeout, "how long a memory limit decrease below usage may spend reclaiming (memory.high, memory.reclaim) before it fails with the old values restored; off refuses such decreases")
	fs.StringVar(&o.ReleaseMemoryAfter, "release-memory-after", o.ReleaseMemoryAfter, "once no intent has changed for this long, return the heap's free pages to the kernel, unmap the binary's pages start-up touched (they stay in the page cache), and run the collector at GOGC=25 until an intent changes; off: never")
	fs.StringVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long in-flight writes may take at shutdown")
	fs.StringVar(&o.StateDir, "state-dir", o.StateDir, "directory for the intent journal: accepted intents are on disk before they are acknowledged and are recovered after a crash (empty: no journal, intents are lost when the agent stops)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", o.LogFormat, "text or json")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file for the Kubernetes intake (empty: in-cluster service account)")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "this node's name, from $NODE_NAME unless given; the Kubernetes intake watches only its pods, and is off without it")
	fs.BoolVar(&o.KubeMemoryReclaim, "kube-memory-reclaim", o.KubeMemoryReclaim, "when the kubelet is asked to lower a memory limit below usage, bring usage under it (memory.high, memory.reclaim; never memory.max) so that the kubelet can apply it")
	fs.StringVar(&o.KubeletConfig, "kubelet-config", o.KubeletConfig, "in Kubernetes mode, the kubelet's KubeletConfiguration file (read only, at start): its CPU and memory manager policies, cpuCFSQuota, cpuCFSQuotaPeriod, MemoryQoS and memoryThrottlingFactor decide the predictions and what the drift check expects; missing: the kubelet's defaults for its release; empty: not read")
	fs.StringVar(&o.KubeDrift, "kube-drift", o.KubeDrift, "in Kubernetes mode, when a pod's container cgroup no longer holds what the kubelet allocated and actuated (its status resources): report (metric, Event CgroupDrift, log), restore (also write the kubelet's values back through CRI) or off; --drift then applies to bare cgroups only")
	fs.StringVar(&o.KubeIntake, "kube-intake", o.KubeIntake, "Kubernetes intake: annotation (resize.resizer.io/resources becomes a pods/resize patch, once deploy/'s annotation policy is in force) or off")
}

// Load parses args: the config file first, then the flags set on the
// command line on top of it.
func Load(args []string) (*Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("resize-agent", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.ConfigFile != "" {
		b, err := os.ReadFile(o.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		file := DefaultOptions()
		if err := yaml.UnmarshalStrict(b, file); err != nil {
			return nil, fmt.Errorf("config %s: %w", o.ConfigFile, err)
		}
		file.ConfigFile = o.ConfigFile
		// Flags given explicitly win over the file.
		cmdline := flag.NewFlagSet("", flag.ContinueOnError)
		file.AddFlags(cmdline)
		fs.Visit(func(f *flag.Flag) { _ = cmdline.Set(f.Name, f.Value.String()) })
		o = file
	}
	return o, nil
}

// settings are Options parsed and checked.
type settings struct {
	allocatable *admission.Capacity // nil: detect
	reserved    admission.Capacity
	resync      time.Duration
	drift       agent.DriftPolicy
	kubeDrift   allocdrift.Policy
	driftEvery  time.Duration
	shutdown    time.Duration
	idle        time.Duration
	shrink      time.Duration // < 0: off
	release     time.Duration // 0: off
	token       string
	scope       intent.Scope
	apiTLS      *tls.Config // nil: plain HTTP, loopback only
	metricsTLS  *tls.Config // nil: plain HTTP
	apiGIDs     []uint32    // --api-group
}

func (o *Options) validate() (settings, error) {
	var s settings
	var errs []error
	qty := func(name, v string, milli bool) int64 {
		if v == "" {
			return 0
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a non-negative quantity", name, v))
			return 0
		}
		if milli {
			return q.MilliValue()
		}
		return q.Value()
	}
	if o.CPUAllocatable != "" || o.MemoryAllocatable != "" {
		if o.CPUAllocatable == "" || o.MemoryAllocatable == "" {
			errs = append(errs, errors.New("give both cpu-allocatable and memory-allocatable, or neither"))
		}
		s.allocatable = &admission.Capacity{MilliCPU: qty("cpu-allocatable", o.CPUAllocatable, true), Memory: qty("memory-allocatable", o.MemoryAllocatable, false)}
	}
	s.reserved = admission.Capacity{MilliCPU: qty("cpu-reserved", o.CPUReserved, true), Memory: qty("memory-reserved", o.MemoryReserved, false)}
	dur := func(name, v string) time.Duration {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a positive duration", name, v))
		}
		return d
	}
	s.resync = dur("resync-interval", o.ResyncInterval)
	s.driftEvery = dur("drift-interval", o.DriftInterval)
	if p, err := allocdrift.ParsePolicy(o.KubeDrift); err != nil {
		errs = append(errs, fmt.Errorf("kube-drift: %w", err))
	} else {
		s.kubeDrift = p
	}
	if p, err := agent.ParseDriftPolicy(o.Drift); err != nil {
		errs = append(errs, fmt.Errorf("drift: %w", err))
	} else {
		s.drift = p
	}
	s.shutdown = dur("shutdown-timeout", o.ShutdownTimeout)
	s.idle = dur("idle-timeout", o.IdleTimeout)
	if o.MaxWatches < 1 || o.MaxWatchesPerPeer < 1 {
		errs = append(errs, fmt.Errorf("max-watches %d, max-watches-per-peer %d: both must be positive", o.MaxWatches, o.MaxWatchesPerPeer))
	}
	if o.MaxConnections < 1 {
		errs = append(errs, fmt.Errorf("max-connections: %d is not positive", o.MaxConnections))
	}
	if o.MemoryShrinkTimeout == "off" {
		s.shrink = -1
	} else {
		s.shrink = dur("memory-shrink-timeout", o.MemoryShrinkTimeout)
	}
	if o.ReleaseMemoryAfter != "off" {
		s.release = dur("release-memory-after", o.ReleaseMemoryAfter)
	}
	if o.CPUPeriod < cgroup.MinPeriod || o.CPUPeriod > cgroup.MaxPeriod {
		errs = append(errs, fmt.Errorf("cpu-period: %d is outside [%d, %d] microseconds", o.CPUPeriod, cgroup.MinPeriod, cgroup.MaxPeriod))
	}
	if o.Socket == "" && o.ListenTCP == "" {
		errs = append(errs, errors.New("socket and listen-tcp are both empty: the API would not be served"))
	}
	if o.ListenTCP != "" {
		if o.TCPTokenFile == "" {
			errs = append(errs, errors.New("listen-tcp needs tcp-token-file: the TCP API is not served without a token"))
		} else if b, err := os.ReadFile(o.TCPTokenFile); err != nil {
			errs = append(errs, fmt.Errorf("tcp-token-file: %w", err))
		} else if s.token = string(trimSpace(b)); len(s.token) < 16 {
			errs = append(errs, errors.New("tcp-token-file: the token must be at least 16 characters"))
		}
	}
	s.scope, errs = o.targetScope(errs)
	if o.ListenTCP != "" {
		if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
			errs = append(errs, errors.New("give both tls-cert-file and tls-key-file, or neither"))
		} else if o.TLSCertFile != "" {
			if c, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile); err != nil {
				errs = append(errs, fmt.Errorf("tls-cert-file: %w", err))
			} else {
				s.apiTLS = &tls.Config{Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}
			}
		} else if !loopback(o.ListenTCP) {
			errs = append(errs, fmt.Errorf("listen-tcp %s is not a loopback address: the bearer token would cross the network in clear; serve the TCP API over TLS (tls-cert-file, tls-key-file) or listen on 127.0.0.1 or [::1]", o.ListenTCP))
		}
	}
	if o.MetricsTLSCertFile != "" || o.MetricsTLSKeyFile != "" || o.MetricsClientCAFile != "" {
		if o.MetricsTLSCertFile == "" || o.MetricsTLSKeyFile == "" {
			errs = append(errs, errors.New("metrics TLS needs both metrics-tls-cert-file and metrics-tls-key-file"))
		} else if c, err := tls.LoadX509KeyPair(o.MetricsTLSCertFile, o.MetricsTLSKeyFile); err != nil {
			errs = append(errs, fmt.Errorf("metrics-tls-cert-file: %w", err))
		} else {
			s.metricsTLS = &tls.Config{Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}
			if o.MetricsClientCAFile != "" {
				pool := x509.NewCertPool()
				if b, err := os.ReadFile(o.MetricsClientCAFile); err != nil {
					errs = append(errs, fmt.Errorf("metrics-client-ca-file: %w", err))
				} else if !pool.AppendCertsFromPEM(b) {
					errs = append(errs, fmt.Errorf("metrics-client-ca-file %s: no PEM certificate", o.MetricsClientCAFile))
				}
				// Verified when given; /metrics then insists on one
				// (requireClientCert), the probes' endpoints do not.
				s.metricsTLS.ClientCAs, s.metricsTLS.ClientAuth = pool, tls.VerifyClientCertIfGiven
			}
		}
	}
	if o.APIGroup != "" {
		if gid, err := lookupGroup(o.APIGroup); err != nil {
			errs = append(errs, fmt.Errorf("api-group: %w", err))
		} else {
			s.apiGIDs = []uint32{gid}
		}
	}
	if o.CapacityCgroup != "/" {
		if _, err := cgroup.CleanPath(o.CapacityCgroup); err != nil {
			errs = append(errs, fmt.Errorf("capacity-cgroup: %w", err))
		}
	}
	if _, err := cgroup.ParseDriver(o.CgroupDriver); err != nil {
		errs = append(errs, fmt.Errorf("cgroup-driver: %w", err))
	}
	switch o.BPF {
	case "auto", "on", "off":
	default:
		errs = append(errs, fmt.Errorf("bpf: %q is not auto, on or off", o.BPF))
	}
	kc := o.kubeConfig(nil)
	if err := kc.Validate(); err != nil {
		errs = append(errs, err)
	} else if kc.Enabled() && o.CRIEndpoint == "" {
		errs = append(errs, errors.New("the Kubernetes intake needs cri-endpoint: it finds containers by pod UID through the runtime"))
	}
	switch o.LogFormat {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("log-format: %q is not text or json", o.LogFormat))
	}
	return s, errors.Join(errs...)
}

func (o *Options) kubeConfig(log *slog.Logger) kube.Config {
	return kube.Config{Kubeconfig: o.Kubeconfig, NodeName: o.NodeName, Intake: o.KubeIntake, Logger: log}
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// targetScope is the part of the cgroup tree intents may target.
func (o *Options) targetScope(errs []error) (intent.Scope, []error) {
	var sc intent.Scope
	switch {
	case o.TargetRoot != "":
		if o.TargetRoot == "/" {
			sc.Roots = []string{"/"} // asked for by name: the host's services stay out
		} else if p, err := cgroup.CleanPath(o.TargetRoot); err != nil {
			errs = append(errs, fmt.Errorf("target-root: %w", err))
		} else {
			sc.Roots = []string{p}
		}
	case o.CapacityCgroup != "/" && o.CapacityCgroup != "":
		p, _ := cgroup.CleanPath(o.CapacityCgroup) // checked with capacity-cgroup
		sc.Roots = []string{p}
	default:
		sc.Roots = intent.DefaultTargetRoots
	}
	for _, a := range o.AllowTargetCgroups {
		p, err := cgroup.CleanPath(a)
		if err != nil || p == "/" {
			errs = append(errs, fmt.Errorf("allow-target-cgroup %q: not a cgroup below the root: %v", a, err))
			continue
		}
		sc.Allowed = append(sc.Allowed, p)
	}
	return sc, errs
}

// loopback reports whether addr (host:port) listens on loopback only: an
// empty host listens on every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
