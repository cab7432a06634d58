package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/apiserver"
)

const (
	childSocketEnv = "RESIZE_AGENT_TEST_PEER_SOCKET"
	nobody         = 65534
	testGID        = 4242
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(childSocketEnv); sock != "" {
		peerChild(sock)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// peerChild is the child of the peer tests, dispatched by TestMain when
// the test binary runs as another user: it asks the API on the socket in
// childSocketEnv for /v1/node and prints the status and body, or the error.
func peerChild(sock string) {
	code, body, err := getOverUnix(sock, "/v1/node")
	if err != nil {
		fmt.Printf("error=%v\n", err)
		return
	}
	fmt.Printf("status=%d body=%s\n", code, strings.ReplaceAll(body, "\n", " "))
}

func getOverUnix(sock, path string) (int, string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Get("http://agent" + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// asUser runs this test binary (as peerChild, see TestMain) as uid, gid and groups
// against sock, and returns what it printed. The binary is copied where
// that user can run it.
func asUser(t *testing.T, bin, sock string, uid, gid uint32, groups ...uint32) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = filepath.Dir(bin)
	cmd.Env = append(os.Environ(), childSocketEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as %d:%d: %v\n%s", uid, gid, err, out)
	}
	return string(out)
}

// worldDir is a directory another user can enter, holding a copy of the
// test binary; removed when the test ends.
func worldDir(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "peer-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "api.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// TestPeerCredentials: on a real unix socket whose mode was loosened to
// 0666, a peer running as nobody is refused with 403 by its credentials
// (SO_PEERCRED); root is served; and with the group allowed, nobody is
// served when the group is its primary group or a supplementary one.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs a child process as uid 65534")
	}
	dir, bin := worldDir(t)
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 1000, Memory: 1 << 30})
	h := apiserver.NewHandler(s.Agent)
	start := func(name string, pp apiserver.PeerPolicy) string {
		sock := filepath.Join(dir, name)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: apiserver.RequirePeer(pp, h), ConnContext: apiserver.PeerConnContext}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		if err := os.Chmod(sock, 0o666); err != nil {
			t.Fatal(err)
		}
		return sock
	}
	owner := start("owner.sock", apiserver.PeerPolicy{UIDs: []uint32{0}})
	group := start("group.sock", apiserver.PeerPolicy{UIDs: []uint32{0}, GIDs: []uint32{testGID}})

	out := asUser(t, bin, owner, nobody, nobody)
	if !strings.Contains(out, "status=403") {
		t.Fatalf("nobody on a 0666 socket: %s", out)
	}
	var e api.Error
	body := out[strings.Index(out, "body=")+len("body="):]
	if err := json.NewDecoder(strings.NewReader(body)).Decode(&e); err != nil || e.Reason != "Forbidden" || !strings.Contains(e.Error, "uid 65534") {
		t.Errorf("403 body %q: %+v, %v", body, e, err)
	}
	if code, b, err := getOverUnix(owner, "/v1/node"); err != nil || code != 200 {
		t.Errorf("root: %d %s %v", code, b, err)
	}
	if out := asUser(t, bin, group, nobody, nobody); !strings.Contains(out, "status=403") {
		t.Errorf("nobody outside the group: %s", out)
	}
	if out := asUser(t, bin, group, nobody, testGID); !strings.Contains(out, "status=200") {
		t.Errorf("nobody with primary group %d: %s", testGID, out)
	}
	if out := asUser(t, bin, group, nobody, nobody, 100, testGID); !strings.Contains(out, "status=200") {
		t.Errorf("nobody with supplementary group %d: %s", testGID, out)
	}
}

// TestRequirePeerWithoutCredentials: a server that does not record
// credentials (no PeerConnContext, or TCP) is refused, not let through.
func TestRequirePeerWithoutCredentials(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: apiserver.RequirePeer(apiserver.PeerPolicy{}, http.NotFoundHandler())}
	go srv.Serve(l)
	defer srv.Close()
	if code, body, err := getOverUnix(sock, "/v1/node"); err != nil || code != 403 || !strings.Contains(body, `"Forbidden"`) {
		t.Errorf("no credentials: %d %s %v", code, body, err)
	}
}

func TestPeerPolicyAllows(t *testing.T) {
	pp := apiserver.PeerPolicy{UIDs: []uint32{1000}, GIDs: []uint32{50}}
	for _, tc := range []struct {
		p    apiserver.Peer
		want bool
	}{
		{apiserver.Peer{UID: 0, GID: 0}, true},
		{apiserver.Peer{UID: 1000, GID: 1000}, true},
		{apiserver.Peer{UID: 1001, GID: 50}, true},
		{apiserver.Peer{UID: 1001, GID: 1001, Groups: []uint32{7, 50}}, true},
		{apiserver.Peer{UID: 1001, GID: 1001, Groups: []uint32{7}}, false},
		{apiserver.Peer{UID: 65534, GID: 65534}, false},
	} {
		if got := pp.Allows(tc.p); got != tc.want {
			t.Errorf("Allows(%+v) = %v", tc.p, got)
		}
	}
}
