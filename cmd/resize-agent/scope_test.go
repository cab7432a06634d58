package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestTargetsConfinedToTargetRoot: through the API, the host's services
// and the pods' root cgroup were throttled to 10m (issue 15). They are
// refused with 400 OutsideTargetRoot and nothing changes; a pod's container
// is resized; a host service is a target only when allowed by name.
func TestTargetsConfinedToTargetRoot(t *testing.T) {
	paths := []string{"/kubepods", "/kubepods/pod1", "/kubepods/pod1/web", "/system.slice/kubelet.service", "/system.slice/containerd.service", "/init.scope", "/other/app"}
	for _, tc := range []struct {
		name    string
		mut     func(*Options)
		allowed map[string]bool
	}{
		{"default", func(*Options) {}, map[string]bool{"/kubepods/pod1/web": true, "/kubepods/pod1": true}},
		{"capacity cgroup", func(o *Options) { o.CapacityCgroup = "/kubepods/pod1" }, map[string]bool{"/kubepods/pod1/web": true}},
		{"target root", func(o *Options) { o.TargetRoot = "/other" }, map[string]bool{"/other/app": true}},
		{"whole tree with one service", func(o *Options) {
			o.TargetRoot, o.AllowTargetCgroups = "/", []string{"/system.slice/containerd.service"}
		}, map[string]bool{"/kubepods/pod1/web": true, "/system.slice/containerd.service": true, "/other/app": true, "/kubepods": true, "/kubepods/pod1": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.StateDir, o.MetricsAddress = "", ""
			o.Socket = filepath.Join(t.TempDir(), "agent.sock")
			tc.mut(o)
			startDaemon(t, o, paths...)
			root := o.CgroupRoot
			c := api.NewClient(o.Socket)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, p := range paths {
				before := cgrouptest.ReadFile(t, root, p, "cpu.max")
				s := intent.Spec{Target: intent.Target{Name: "x" + strings.ReplaceAll(p, "/", "-"), CgroupPath: p}}
				s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
				_, _, err := c.Submit(ctx, s)
				var se *api.StatusError
				switch {
				case tc.allowed[p] && err != nil:
					t.Errorf("%s: %v", p, err)
				case !tc.allowed[p] && (!errors.As(err, &se) || se.Code != 400 || se.Body.Reason != "OutsideTargetRoot"):
					t.Errorf("%s: %v, want 400 OutsideTargetRoot", p, err)
				case !tc.allowed[p]:
					if got := cgrouptest.ReadFile(t, root, p, "cpu.max"); got != before {
						t.Errorf("%s: refused, but cpu.max changed to %s", p, got)
					}
				}
			}
			if cs, _ := c.Containers(ctx); len(cs) != len(tc.allowed) {
				t.Errorf("%d containers managed, want %d", len(cs), len(tc.allowed))
			}
		})
	}
}

func TestTargetAndTLSOptions(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600)
	cert, key, _ := writeCert(t, dir, "agent", nil)
	for name, tc := range map[string]struct {
		mut func(*Options)
		msg string // "" valid
	}{
		"loopback plain":        {func(o *Options) { o.ListenTCP = "127.0.0.1:8443" }, ""},
		"ipv6 loopback plain":   {func(o *Options) { o.ListenTCP = "[::1]:8443" }, ""},
		"all interfaces plain":  {func(o *Options) { o.ListenTCP = ":8443" }, "not a loopback address"},
		"node address plain":    {func(o *Options) { o.ListenTCP = "10.0.0.5:8443" }, "not a loopback address"},
		"all interfaces TLS":    {func(o *Options) { o.ListenTCP, o.TLSCertFile, o.TLSKeyFile = ":8443", cert, key }, ""},
		"cert without key":      {func(o *Options) { o.ListenTCP, o.TLSCertFile = ":8443", cert }, "both tls-cert-file"},
		"bad target root":       {func(o *Options) { o.TargetRoot = "../x" }, "target-root"},
		"allow the root":        {func(o *Options) { o.AllowTargetCgroups = []string{"/"} }, "allow-target-cgroup"},
		"metrics CA no cert":    {func(o *Options) { o.MetricsClientCAFile = cert }, "metrics TLS needs"},
		"metrics CA not PEM":    {func(o *Options) { o.MetricsTLSCertFile, o.MetricsTLSKeyFile, o.MetricsClientCAFile = cert, key, tok }, "no PEM"},
		"metrics TLS and a CA":  {func(o *Options) { o.MetricsTLSCertFile, o.MetricsTLSKeyFile, o.MetricsClientCAFile = cert, key, cert }, ""},
		"metrics key not found": {func(o *Options) { o.MetricsTLSCertFile, o.MetricsTLSKeyFile = cert, "/nope" }, "metrics-tls-cert-file"},
	} {
		o := DefaultOptions()
		o.TCPTokenFile = tok
		tc.mut(o)
		_, err := o.validate()
		if (tc.msg == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.msg)) {
			t.Errorf("%s: %v, want %q", name, err, tc.msg)
		}
	}
}

// writeCert writes a certificate for 127.0.0.1 and its key, signed by
// parent (nil: self-signed, and a CA).
func writeCert(t *testing.T, dir, name string, parent *tls.Certificate) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: parent == nil}
	signer, signerKey := tmpl, any(k)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &k.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	os.WriteFile(certFile, certPEM, 0o600)
	os.WriteFile(keyFile, keyPEM, 0o600)
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

// TestTLSListeners: the TCP API over TLS answers a client that trusts its
// CA and refuses plain HTTP; /metrics with a client CA refuses a client
// without a certificate (issue 15: it named every container to the pod
// network) and serves one with, while the probes' endpoints stay open.
func TestTLSListeners(t *testing.T) {
	dir := t.TempDir()
	caCert, _, ca := writeCert(t, dir, "ca", nil)
	srvCert, srvKey, _ := writeCert(t, dir, "agent", &ca)
	_, _, client := writeCert(t, dir, "prometheus", &ca)
	_, _, stranger := writeCert(t, dir, "stranger", nil)
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600)
	o := DefaultOptions()
	o.StateDir, o.Socket = "", filepath.Join(dir, "agent.sock")
	o.ListenTCP, o.TCPTokenFile, o.TLSCertFile, o.TLSKeyFile = "127.0.0.1:0", tok, srvCert, srvKey
	o.MetricsAddress = "127.0.0.1:0"
	o.MetricsTLSCertFile, o.MetricsTLSKeyFile, o.MetricsClientCAFile = srvCert, srvKey, caCert
	d := startDaemon(t, o)
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(caCert)
	pool.AppendCertsFromPEM(pem)
	ctx := context.Background()

	tc := api.NewClient("https://" + d.addrs["api-tcp"]).WithTLS(&tls.Config{RootCAs: pool}).WithToken("0123456789abcdef0123")
	defer tc.CloseIdleConnections()
	n, err := tc.Node(ctx)
	if err != nil || n.Allocatable.MilliCPU != 4000 {
		t.Errorf("TCP API over TLS: %+v %v", n, err)
	}
	plain := api.NewClient("http://" + d.addrs["api-tcp"]).WithTLS(nil).WithToken("0123456789abcdef0123")
	defer plain.CloseIdleConnections()
	if _, err := plain.Node(ctx); err == nil {
		t.Error("the TLS listener answered plain HTTP")
	}

	get := func(path string, certs ...tls.Certificate) (int, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}}
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + d.addrs["metrics"] + path)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, tc := range []struct {
		path  string
		certs []tls.Certificate
		code  int
	}{
		{"/metrics", nil, 403},
		{"/metrics", []tls.Certificate{client}, 200},
		// Go's client sends no certificate the server's CAs did not sign.
		{"/metrics", []tls.Certificate{stranger}, 403},
		{"/healthz", nil, 200},
		{"/readyz", nil, 200},
	} {
		code, err := get(tc.path, tc.certs...)
		if code != tc.code || err != nil {
			t.Errorf("%s with %d certificates: %d %v, want %d", tc.path, len(tc.certs), code, err, tc.code)
		}
	}
	plainM := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := plainM.Get("http://" + d.addrs["metrics"] + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("metrics served over plain HTTP")
		}
	}
	http.DefaultClient.CloseIdleConnections()
	d.stop()
}
