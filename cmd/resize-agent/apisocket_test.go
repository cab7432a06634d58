package main

import (
	"context"
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

	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

const (
	childSocketEnv = "RESIZE_AGENT_TEST_PEER_SOCKET"
	nobody         = 65534
	testGID        = 4242
)

// peerChild is the child of the peer tests, dispatched by TestMain when
// the test binary runs as another user: it asks the API on the socket in
// childSocketEnv for /v1/node and prints the status and body, or the error.
func peerChild(sock string) {
	code, body, err := getUnix(sock, "/v1/node")
	if err != nil {
		fmt.Printf("error=%v\n", err)
		return
	}
	fmt.Printf("status=%d body=%s\n", code, strings.ReplaceAll(body, "\n", " "))
}

func getUnix(sock, path string) (int, string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
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

// TestAPISocketPeers runs the daemon as root and connects as nobody
// (uid 65534, a child process of this test binary): with the default 0600
// socket nobody cannot connect, and with the mode loosened to 0666 it is
// refused by its credentials (403); root is served. With --api-group the
// socket is 0660 with that group and nobody, a member, is served.
func TestAPISocketPeers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs a child process as uid 65534")
	}
	dir, err := os.MkdirTemp("", "api-socket-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
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
	bin := filepath.Join(dir, "resize-agent.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	child := func(sock string, gid uint32) string {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), childSocketEnv+"="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: gid, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return string(out)
	}
	start := func(name, group string) (string, func()) {
		t.Helper()
		o := DefaultOptions()
		o.CgroupRoot, o.skipFSCheck = cgrouptest.FakeTree(t), true
		o.Socket, o.MetricsAddress, o.StateDir = filepath.Join(dir, name), "", ""
		o.CPUAllocatable, o.MemoryAllocatable = "1", "1Gi"
		o.APIGroup = group
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan string, 1)
		o.onReady = func(a string) { ready <- a }
		done := make(chan error, 1)
		go func() { done <- run(ctx, o, quiet) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatal(err)
		}
		return o.Socket, func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}

	sock, stop := start("default.sock", "")
	if out := child(sock, nobody); !strings.Contains(out, "permission denied") {
		t.Errorf("nobody on the 0600 socket: %s", out)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if out := child(sock, nobody); !strings.Contains(out, "status=403") || !strings.Contains(out, `"reason": "Forbidden"`) {
		t.Errorf("nobody on the socket loosened to 0666: %s", out)
	}
	if code, body, err := getUnix(sock, "/v1/node"); err != nil || code != 200 {
		t.Errorf("root: %d %s %v", code, body, err)
	}
	stop()

	sock, stop = start("group.sock", fmt.Sprint(testGID))
	defer stop()
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != testGID {
		t.Errorf("socket with --api-group: mode %v gid %d", fi.Mode().Perm(), st.Gid)
	}
	if out := child(sock, testGID); !strings.Contains(out, "status=200") {
		t.Errorf("nobody in the api-group: %s", out)
	}
	if out := child(sock, nobody); !strings.Contains(out, "permission denied") {
		t.Errorf("nobody outside the api-group: %s", out)
	}
	if code, body, err := getUnix(sock, "/v1/node"); err != nil || code != 200 {
		t.Errorf("root: %d %s %v", code, body, err)
	}
}

func TestAPIGroupOption(t *testing.T) {
	for group, ok := range map[string]bool{"4242": true, "root": true, "no-such-group-here": false, "-1": false} {
		o := DefaultOptions()
		o.APIGroup = group
		s, err := o.validate()
		if ok != (err == nil || !strings.Contains(err.Error(), "api-group")) {
			t.Errorf("api-group %q: %v", group, err)
		}
		if ok && len(s.apiGIDs) != 1 {
			t.Errorf("api-group %q: gids %v", group, s.apiGIDs)
		}
	}
}
