// Package agenttest serves a real agent, on a fake cgroup tree, behind the
// real API handler on a unix socket, for tests of API clients.
package agenttest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// Server is a running agent.
type Server struct {
	Socket string
	Agent  *agent.Agent
	Root   string // the fake cgroup root
}

// Serve starts an agent with the given allocatable capacity and cgroups,
// stopped when the test ends.
func Serve(t testing.TB, alloc admission.Capacity, paths ...string) *Server {
	t.Helper()
	root := cgrouptest.FakeTree(t, paths...)
	s := ServeWith(t, cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()), alloc)
	s.Root = root
	return s
}

// ServeWith is Serve on the given cgroups, such as the real hierarchy.
func ServeWith(t testing.TB, cg agent.Cgroups, alloc admission.Capacity, opts ...agent.Option) *Server {
	t.Helper()
	opts = append([]agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	a := agent.New(cg, admission.NewLedger(alloc), opts...)
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: apiserver.NewHandler(a)}
	go srv.Serve(l)
	t.Cleanup(func() {
		a.Close(context.Background())
		srv.Close()
	})
	return &Server{Socket: sock, Agent: a}
}
