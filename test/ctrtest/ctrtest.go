// Package ctrtest starts pods and containers in the VM harness's real
// containerd through CRI, the way the kubelet does (its labels, its cgroup
// layout), for the tests that need a real runtime. Outside the VM a test
// that asks for containerd skips with the reason, or fails where
// RESIZE_AGENT_REQUIRE_CGROUP2=1 says the runtime must be there.
package ctrtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

const (
	// Socket is the guest's containerd.
	Socket = "/run/containerd/containerd.sock"
	// BusyboxImage is imported by the harness (test/vm/ociimage).
	BusyboxImage = "localhost/resize-agent/busybox:latest"
)

// Need skips (or fails, where required) the test when containerd is not
// there.
func Need(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(Socket); err != nil {
		if os.Getenv(cgrouptest.RequireEnv) == "1" {
			t.Fatalf("containerd's socket is required here: %v", err)
		}
		t.Skipf("needs containerd at %s (run make test-vm): %v", Socket, err)
	}
}

// CallTimeout bounds the CRI calls of RunPod and RunContainer and the
// sandbox's removal. A suite that starts many pods on a slow node (TCG, a
// loaded host) raises it before its first pod: the kubelet itself allows
// 4 minutes for RunPodSandbox and 2 for other calls (k8s.io/cri-client
// pkg/remote_runtime.go: "2 times longer timeout for sandbox operation").
var CallTimeout = 60 * time.Second

// Runtime is containerd through CRI: the raw service for creating pods and
// containers, and the project's client for reading them back.
type Runtime struct {
	RT  runtimeapi.RuntimeServiceClient
	CRI *cri.Client
}

// Dial connects to containerd (after Need), closed when the test ends;
// opts configure the project's client.
func Dial(t testing.TB, opts ...cri.Option) *Runtime {
	t.Helper()
	Need(t)
	conn, err := grpc.NewClient("unix://"+Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cc, err := cri.Dial(Socket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &Runtime{RT: runtimeapi.NewRuntimeServiceClient(conn), CRI: cc}
}

// Pod is a running pod sandbox.
type Pod struct {
	UID, Sandbox string
	Config       *runtimeapi.PodSandboxConfig
}

// NewUID returns a random pod UID in the API server's format.
func NewUID() string {
	h := func(n int) string {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	return h(4) + "-" + h(2) + "-" + h(2) + "-" + h(2) + "-" + h(6)
}

// KubepodsParent is the kubelet's pod cgroup with the cgroupfs driver,
// Burstable class.
func KubepodsParent(uid string) string { return "/kubepods/burstable/pod" + uid }

// RunPod starts a host-network pod sandbox (the guest has no CNI) whose
// cgroup parent is parent(uid), removed when the test ends.
func (r *Runtime) RunPod(t testing.TB, parent func(uid string) string) Pod {
	t.Helper()
	uid := NewUID()
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "p-" + uid[:8], Namespace: "default", Uid: uid},
		Labels:   map[string]string{cri.LabelPodUID: uid},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: parent(uid),
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	resp, err := r.RT.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), max(CallTimeout/2, 30*time.Second))
		defer cancel()
		_, _ = r.RT.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId})
		_, _ = r.RT.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId})
	})
	return Pod{UID: uid, Sandbox: resp.PodSandboxId, Config: cfg}
}

// RunContainer starts a busybox container running cmd in p, with the
// kubelet's labels and the given resources, and returns it as the runtime
// reports it.
func (r *Runtime) RunContainer(t testing.TB, p Pod, name string, res *runtimeapi.LinuxContainerResources, cmd ...string) cri.Container {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	cfg := &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name},
		Image:       &runtimeapi.ImageSpec{Image: BusyboxImage},
		Command:     cmd,
		Labels:      map[string]string{cri.LabelPodUID: p.UID, cri.LabelContainerName: name},
		Annotations: map[string]string{cri.AnnotationRestartCount: "0"},
		Linux:       &runtimeapi.LinuxContainerConfig{Resources: res},
	}
	created, err := r.RT.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.Sandbox, Config: cfg, SandboxConfig: p.Config})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := r.RT.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	ct, err := r.CRI.Get(ctx, created.ContainerId)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("container %s %s pid %d cgroupsPath %s", name, ct.ID[:12], ct.PID, ct.CgroupsPath)
	return ct
}
