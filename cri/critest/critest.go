// Package critest is a CRI runtime service over a real unix socket whose
// behaviour is given by func fields, for unit tests of CRI clients. It is
// not the proof that anything works with a runtime: the VM tests use a real
// containerd for that.
package critest

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime implements the calls the agent makes; a nil func answers
// Unimplemented. Calls records the method names in order.
type Runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	ListContainersFn           func(*runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error)
	ContainerStatusFn          func(*runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error)
	UpdateContainerResourcesFn func(*runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error)
	PodSandboxStatusFn         func(*runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error)
	StopContainerFn            func(*runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error)
	CreateContainerFn          func(*runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error)
	StartContainerFn           func(*runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error)
	RemoveContainerFn          func(*runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error)

	mu    sync.Mutex
	calls []string
}

// Serve serves r on a unix socket in a temporary directory and returns the
// socket's path; the server stops when the test ends.
func Serve(t testing.TB, r *Runtime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, r)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return sock
}

// Calls returns the methods called so far.
func (r *Runtime) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func call[Req, Resp any](r *Runtime, name string, fn func(Req) (Resp, error), req Req) (Resp, error) {
	r.mu.Lock()
	r.calls = append(r.calls, name)
	r.mu.Unlock()
	if fn == nil {
		var zero Resp
		return zero, status.Error(codes.Unimplemented, name)
	}
	return fn(req)
}

func (r *Runtime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "critest", RuntimeVersion: "0"}, nil
}

func (r *Runtime) ListContainers(_ context.Context, q *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return call(r, "ListContainers", r.ListContainersFn, q)
}

func (r *Runtime) ContainerStatus(_ context.Context, q *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	return call(r, "ContainerStatus", r.ContainerStatusFn, q)
}

func (r *Runtime) UpdateContainerResources(_ context.Context, q *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return call(r, "UpdateContainerResources", r.UpdateContainerResourcesFn, q)
}

func (r *Runtime) PodSandboxStatus(_ context.Context, q *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return call(r, "PodSandboxStatus", r.PodSandboxStatusFn, q)
}

func (r *Runtime) StopContainer(_ context.Context, q *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	return call(r, "StopContainer", r.StopContainerFn, q)
}

func (r *Runtime) CreateContainer(_ context.Context, q *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	return call(r, "CreateContainer", r.CreateContainerFn, q)
}

func (r *Runtime) StartContainer(_ context.Context, q *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	return call(r, "StartContainer", r.StartContainerFn, q)
}

func (r *Runtime) RemoveContainer(_ context.Context, q *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	return call(r, "RemoveContainer", r.RemoveContainerFn, q)
}
