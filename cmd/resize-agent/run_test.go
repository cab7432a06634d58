package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(childSocketEnv); sock != "" {
		peerChild(sock) // the child of TestAPISocketPeers, as another user
		os.Exit(0)
	}
	if root := os.Getenv(capsChildEnv); root != "" {
		capsChild(root) // the child of TestDropsCapabilities
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRefusesHostWithoutCgroup2 runs the daemon against this machine's own
// /sys/fs/cgroup. On a v1 or hybrid host it must refuse with the reason;
// on a cgroup v2 host it must start (and is stopped at once).
func TestRefusesHostWithoutCgroup2(t *testing.T) {
	o := DefaultOptions()
	o.StateDir = t.TempDir()
	o.Socket = filepath.Join(t.TempDir(), "a.sock")
	o.MetricsAddress = ""
	hostErr := cgroup.New().Check()
	ctx, cancel := context.WithCancel(context.Background())
	o.onReady = func(string) { cancel() }
	err := run(ctx, o, quiet)
	t.Logf("host check: %v; run: %v", hostErr, err)
	if hostErr != nil {
		if !errors.Is(err, cgroup.ErrNotCgroup2) && !errors.Is(err, cgroup.ErrMissingController) {
			t.Fatalf("run on a host without usable cgroup v2 = %v", err)
		}
		if !strings.Contains(err.Error(), "refusing to start") {
			t.Errorf("unclear message: %v", err)
		}
	} else if err != nil {
		t.Fatalf("run on a cgroup v2 host: %v", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	for name, mut := range map[string]func(*Options){
		"period":       func(o *Options) { o.CPUPeriod = 10 },
		"alloc half":   func(o *Options) { o.CPUAllocatable = "2" },
		"alloc bad":    func(o *Options) { o.CPUAllocatable, o.MemoryAllocatable = "two", "1Gi" },
		"resync":       func(o *Options) { o.ResyncInterval = "-1s" },
		"tcp no token": func(o *Options) { o.ListenTCP = "127.0.0.1:0" },
		"no api":       func(o *Options) { o.Socket = "" },
		"log":          func(o *Options) { o.LogFormat = "xml" },
		"capacity":     func(o *Options) { o.CapacityCgroup = "../x" },
		"shrink":       func(o *Options) { o.MemoryShrinkTimeout = "soon" },
		"release":      func(o *Options) { o.ReleaseMemoryAfter = "0s" },
		"release bad":  func(o *Options) { o.ReleaseMemoryAfter = "never" },
	} {
		o := DefaultOptions()
		mut(o)
		if err := run(context.Background(), o, quiet); err == nil || !strings.Contains(err.Error(), "invalid options") {
			t.Errorf("%s: run = %v", name, err)
		}
	}
}

func TestLoadConfigFileAndFlags(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("socket: /tmp/from-file.sock\ncpuAllocatable: \"3\"\nmemoryAllocatable: 2Gi\n"), 0o644)
	o, err := Load([]string{"-config", f, "-cpu-allocatable", "5"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Socket != "/tmp/from-file.sock" || o.CPUAllocatable != "5" || o.MemoryAllocatable != "2Gi" {
		t.Errorf("options %+v", o)
	}
	os.WriteFile(f, []byte("sockit: /x\n"), 0o644)
	if _, err := Load([]string{"-config", f}); err == nil {
		t.Error("unknown config key accepted")
	}
}

// TestRunServesAPI starts the daemon on a fake cgroup tree and drives it
// through its socket: a resize, the socket's mode, metrics, health, and a
// clean shutdown that removes the socket.
func TestRunServesAPI(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/kubepods/pod1/web")
	dir := t.TempDir()
	o := DefaultOptions()
	o.StateDir = t.TempDir()
	o.CgroupRoot, o.skipFSCheck = root, true
	o.Socket = filepath.Join(dir, "run", "agent.sock")
	o.MetricsAddress = "127.0.0.1:0"
	o.CPUAllocatable, o.MemoryAllocatable = "2", "4Gi"
	addr := make(chan string, 1)
	o.onReady = func(a string) { addr <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, quiet) }()
	var metricsAddr string
	select {
	case metricsAddr = <-addr:
	case err := <-done:
		t.Fatal(err)
	}
	fi, err := os.Stat(o.Socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, %v", fi.Mode(), err)
	}
	c := api.NewClient(o.Socket)
	s := intent.Spec{Target: intent.Target{Name: "web", CgroupPath: "/kubepods/pod1/web"}}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}
	it, created, err := c.Submit(ctx, s)
	if err != nil || !created {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	it, err = c.WaitSettled(wctx, it.ID)
	wcancel()
	if err != nil || it.Status.State != intent.Completed {
		t.Fatalf("%+v %v", it.Status, err)
	}
	if got := cgrouptest.ReadFile(t, root, "/kubepods/pod1/web", "cpu.max"); got != "50000 100000" {
		t.Errorf("cpu.max = %s", got)
	}
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
		if path == "/metrics" {
			for _, m := range []string{`resize_agent_resizes_total{outcome="completed"} 1`, `resize_agent_resize_duration_seconds_count{outcome="completed",resource="cpu"} 1`,
				"resize_agent_node_allocatable_cpu_cores 2", "resize_agent_node_allocated_cpu_cores 0.5", "go_goroutines", "process_cpu_seconds_total",
				"resize_agent_journal_broken 0", "resize_agent_journal_intents 1", "resize_agent_journal_sync_duration_seconds_count"} {
				if !strings.Contains(string(b), m) {
					t.Errorf("metrics lack %q", m)
				}
			}
			// The intent was journaled before it was acknowledged.
			if !regexp.MustCompile(`(?m)^resize_agent_journal_syncs_total [1-9]`).Match(b) ||
				!regexp.MustCompile(`(?m)^resize_agent_journal_sync_duration_seconds_count [1-9]`).Match(b) {
				t.Errorf("no journal sync in the metrics:\n%s", b)
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if _, err := os.Stat(o.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestTCPNeedsToken(t *testing.T) {
	root := cgrouptest.FakeTree(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600)
	o := DefaultOptions()
	o.StateDir = t.TempDir()
	o.CgroupRoot, o.skipFSCheck = root, true
	o.Socket, o.MetricsAddress = "", ""
	o.ListenTCP, o.TCPTokenFile = "127.0.0.1:0", tok
	o.CPUAllocatable, o.MemoryAllocatable = "1", "1Gi"
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	o.onReady = func(a string) { ready <- a }
	tcpAddr := make(chan string, 1)
	o.onListen = func(name, addr string) {
		if name == "api-tcp" {
			tcpAddr <- addr
		}
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, quiet) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	base := "http://" + <-tcpAddr
	for name, auth := range map[string]string{
		"no token":     "",
		"wrong token":  "Bearer 0123456789abcdef0124",
		"wrong length": "Bearer 0123456789abcdef01234",
		"short":        "Bearer 0",
		"not bearer":   "Basic 0123456789abcdef0123",
		"bare token":   "0123456789abcdef0123",
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/node", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 401 || err != nil || e.Reason != "Unauthorized" || resp.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%s: %d %+v %v", name, resp.StatusCode, e, err)
		}
	}
	n, err := api.NewClient(base).WithToken("0123456789abcdef0123").Node(ctx)
	if err != nil || n.Allocatable.MilliCPU != 1000 {
		t.Errorf("with token: %+v %v", n, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSetMemoryLimit: the container's limit from the downward API sets the
// runtime's soft limit to its share; GOMEMLIMIT wins; nonsense is refused.
func TestSetMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	for _, c := range []struct {
		env, gomem string
		want       int64
		err        bool
	}{
		{env: "268435456", want: 201326592},
		{env: "256Mi", want: 201326592},
		{env: "1Gi", gomem: "100MiB", want: old}, // the runtime read GOMEMLIMIT at start; it is left alone
		{env: "-1", err: true},
		{env: "lots", err: true},
	} {
		debug.SetMemoryLimit(old)
		t.Setenv(memoryLimitEnv, c.env)
		t.Setenv("GOMEMLIMIT", c.gomem)
		err := setMemoryLimit(quiet)
		if got := debug.SetMemoryLimit(-1); (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("%s=%q GOMEMLIMIT=%q: limit %d, %v; want %d, error %v", memoryLimitEnv, c.env, c.gomem, got, err, c.want, c.err)
		}
	}
}
