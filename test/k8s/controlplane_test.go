package k8s_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// RequireEnv, when set to 1, turns the skip of a test that needs the
// control plane's binaries into a failure: test/k8s/run.sh and CI set it.
const RequireEnv = "RESIZE_AGENT_REQUIRE_APISERVER"

// BinEnv names the directory holding kube-apiserver and etcd (default
// /var/cache/resize-agent-k8s/bin, where test/k8s/build.sh puts them).
const BinEnv = "RESIZE_AGENT_K8S_BIN"

// The identities of the static token file: an administrator for the test's
// own set-up, and the agent, under the user name Kubernetes gives the
// DaemonSet's service account, so that deploy's ClusterRoleBinding (subject
// ServiceAccount resize-agent/resize-agent) applies to it unchanged.
const (
	AdminUser = "e2e-admin"
	AgentUser = "system:serviceaccount:resize-agent:resize-agent"
)

// ControlPlane is a real etcd and kube-apiserver on loopback, with
// generated certificates, a static token file and RBAC on.
type ControlPlane struct {
	t                       testing.TB
	dir                     string
	etcdBin, apiBin         string
	etcdClient, etcdPeer    int
	apiPort                 int
	etcd, api               *exec.Cmd
	apiLog                  *os.File
	ca                      []byte
	adminToken, agentToken  string
	etcdExited, apiExited   chan error
	apiStarts               int
	startTimeout, stopGrace time.Duration
}

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (%s=1: this test must run here; build them with test/k8s/build.sh)", msg, RequireEnv)
	}
	t.Skipf("%s; run test/k8s/run.sh to build them and run this test", msg)
}

// binaries finds kube-apiserver and etcd, skipping (or failing, with
// RequireEnv) without them.
func binaries(t testing.TB) (etcd, apiserver string) {
	t.Helper()
	dir := os.Getenv(BinEnv)
	if dir == "" {
		dir = "/var/cache/resize-agent-k8s/bin"
	}
	etcd, apiserver = filepath.Join(dir, "etcd"), filepath.Join(dir, "kube-apiserver")
	for _, b := range []string{etcd, apiserver} {
		if fi, err := os.Stat(b); err != nil || fi.Mode()&0o111 == 0 {
			skipOrFail(t, "no %s", b)
		}
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		skipOrFail(t, "openssl is needed to make the control plane's certificates")
	}
	return etcd, apiserver
}

// StartControlPlane starts etcd and kube-apiserver, stopped when the test
// ends.
func StartControlPlane(t testing.TB) *ControlPlane {
	t.Helper()
	etcdBin, apiBin := binaries(t)
	cp := &ControlPlane{t: t, dir: t.TempDir(), etcdBin: etcdBin, apiBin: apiBin,
		startTimeout: 90 * time.Second, stopGrace: 15 * time.Second}
	cp.etcdClient, cp.etcdPeer, cp.apiPort = freePort(t), freePort(t), freePort(t)
	cp.certs()
	t.Cleanup(cp.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			cp.dumpLogs()
		}
	})
	cp.startEtcd()
	cp.StartAPIServer()
	return cp
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.dir, name) }

func (cp *ControlPlane) openssl(args ...string) {
	cp.t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = cp.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		cp.t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// certs makes a CA, the API server's serving certificate (127.0.0.1,
// localhost), the service-account signing key and the static token file.
func (cp *ControlPlane) certs() {
	cp.openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=resize-agent-e2e-ca",
		"-keyout", "ca.key", "-out", "ca.crt")
	if err := os.WriteFile(cp.path("san.ext"), []byte("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"), 0o600); err != nil {
		cp.t.Fatal(err)
	}
	cp.openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver", "-keyout", "apiserver.key", "-out", "apiserver.csr")
	cp.openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
		"-extfile", "san.ext", "-out", "apiserver.crt")
	cp.openssl("genrsa", "-out", "sa.key", "2048")
	cp.openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
	var err error
	if cp.ca, err = os.ReadFile(cp.path("ca.crt")); err != nil {
		cp.t.Fatal(err)
	}
	cp.adminToken, cp.agentToken = randomToken(cp.t), randomToken(cp.t)
	tokens := fmt.Sprintf("%s,%s,e2e-admin-uid,\"system:masters\"\n%s,%s,resize-agent-uid,\"system:serviceaccounts,system:serviceaccounts:resize-agent\"\n",
		cp.adminToken, AdminUser, cp.agentToken, AgentUser)
	if err := os.WriteFile(cp.path("tokens.csv"), []byte(tokens), 0o600); err != nil {
		cp.t.Fatal(err)
	}
}

func randomToken(t testing.TB) string {
	b := make([]byte, 16)
	f, err := os.Open("/dev/urandom")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

func (cp *ControlPlane) logFile(name string) *os.File {
	f, err := os.OpenFile(cp.path(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		cp.t.Fatal(err)
	}
	return f
}

func start(t testing.TB, cmd *exec.Cmd) chan error {
	t.Helper()
	// Its own process group, so that stopping it stops anything it forked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return ch
}

func (cp *ControlPlane) startEtcd() {
	client := fmt.Sprintf("http://127.0.0.1:%d", cp.etcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", cp.etcdPeer)
	cmd := exec.Command(cp.etcdBin,
		"--name=e2e", "--data-dir="+cp.path("etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=e2e="+peer,
		"--unsafe-no-fsync", "--log-level=warn")
	log := cp.logFile("etcd.log")
	cmd.Stdout, cmd.Stderr = log, log
	cp.etcd, cp.etcdExited = cmd, start(cp.t, cmd)
	cp.waitHTTP("etcd", client+"/health", nil, cp.etcdExited)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the
// same port and waits until it is ready.
func (cp *ControlPlane) StartAPIServer() {
	cp.t.Helper()
	cp.apiStarts++
	cmd := exec.Command(cp.apiBin,
		"--etcd-servers="+fmt.Sprintf("http://127.0.0.1:%d", cp.etcdClient),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", cp.apiPort),
		"--tls-cert-file="+cp.path("apiserver.crt"), "--tls-private-key-file="+cp.path("apiserver.key"),
		"--client-ca-file="+cp.path("ca.crt"),
		"--token-auth-file="+cp.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+cp.path("sa.pub"), "--service-account-signing-key-file="+cp.path("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none",
		"--cert-dir="+cp.path("apiserver-certs"),
		"--profiling=false",
		"--v=1")
	cp.apiLog = cp.logFile("apiserver.log")
	fmt.Fprintf(cp.apiLog, "\n===== kube-apiserver start %d =====\n", cp.apiStarts)
	cmd.Stdout, cmd.Stderr = cp.apiLog, cp.apiLog
	cp.api, cp.apiExited = cmd, start(cp.t, cmd)
	cp.waitHTTP("kube-apiserver", cp.Host()+"/readyz", cp.httpClient(), cp.apiExited)
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after the
// grace period).
func (cp *ControlPlane) StopAPIServer() {
	if cp.api == nil {
		return
	}
	t0 := time.Now()
	// kube-apiserver drains its watches on SIGTERM for a long while; a
	// few seconds, then SIGKILL, which a restart must survive as well.
	killed := stop(cp.api, cp.apiExited, 5*time.Second)
	cp.t.Logf("kube-apiserver stopped in %s (killed after the grace period: %v)", time.Since(t0).Round(time.Millisecond), killed)
	cp.api = nil
	if cp.apiLog != nil {
		cp.apiLog.Close()
	}
}

func stop(cmd *exec.Cmd, exited chan error, grace time.Duration) (killed bool) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
		return false
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return true
	}
}

// Stop stops kube-apiserver and etcd.
func (cp *ControlPlane) Stop() {
	cp.StopAPIServer()
	if cp.etcd != nil {
		stop(cp.etcd, cp.etcdExited, cp.stopGrace)
		cp.etcd = nil
	}
}

func (cp *ControlPlane) waitHTTP(name, url string, c *http.Client, exited chan error) {
	cp.t.Helper()
	if c == nil {
		c = &http.Client{Timeout: 2 * time.Second}
	}
	deadline := time.Now().Add(cp.startTimeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			cp.t.Fatalf("%s exited while starting: %v (logs in %s)", name, err, cp.dir)
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if strings.HasPrefix(url, "https:") {
			req.Header.Set("Authorization", "Bearer "+cp.adminToken)
		}
		resp, err := c.Do(req)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(b.String()))
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	cp.t.Fatalf("%s not ready after %s: %s", name, cp.startTimeout, last)
}

func (cp *ControlPlane) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.ca)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// Host is the API server's URL.
func (cp *ControlPlane) Host() string { return fmt.Sprintf("https://127.0.0.1:%d", cp.apiPort) }

// Config is a client configuration for the given token.
func (cp *ControlPlane) Config(token string) *rest.Config {
	return &rest.Config{Host: cp.Host(), BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca},
		QPS: 50, Burst: 100, UserAgent: "resize-agent-e2e"}
}

// Kubeconfig is a kubeconfig file's content for the given token.
func (cp *ControlPlane) Kubeconfig(token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
  - name: e2e
    cluster:
      server: %s
      certificate-authority-data: %s
users:
  - name: e2e
    user:
      token: %s
contexts:
  - name: e2e
    context: {cluster: e2e, user: e2e}
current-context: e2e
`, cp.Host(), base64.StdEncoding.EncodeToString(cp.ca), token)
}

// Admin is a client as the administrator; Agent one as the agent's
// service account.
func (cp *ControlPlane) Admin() kubernetes.Interface { return cp.client(cp.adminToken) }
func (cp *ControlPlane) Agent() kubernetes.Interface { return cp.client(cp.agentToken) }

func (cp *ControlPlane) client(token string) kubernetes.Interface {
	c, err := kubernetes.NewForConfig(cp.Config(token))
	if err != nil {
		cp.t.Fatal(err)
	}
	return c
}

func (cp *ControlPlane) dumpLogs() {
	for _, name := range []string{"etcd.log", "apiserver.log"} {
		b, err := os.ReadFile(cp.path(name))
		if err != nil {
			continue
		}
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		cp.t.Logf("--- tail of %s ---\n%s", name, b)
	}
}
