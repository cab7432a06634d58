package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

const (
	containerdSocket = "/run/containerd/containerd.sock"
	busyboxImage     = "localhost/resize-agent/busybox:latest"
)

// benchPod is a host-network pod under the kubelet's cgroupfs layout with
// sleeping busybox containers: one per method that resizes through the
// runtime, so that no two methods change the same cgroup.
type benchPod struct {
	rt      runtimeapi.RuntimeServiceClient
	conn    *grpc.ClientConn
	uid     string
	sandbox string
	sbCfg   *runtimeapi.PodSandboxConfig
}

type benchContainer struct {
	name, id, cgroup string
	pid              int
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newPod(ctx context.Context, name string) (*benchPod, error) {
	conn, err := grpc.NewClient("unix://"+containerdSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	p := &benchPod{rt: runtimeapi.NewRuntimeServiceClient(conn), conn: conn}
	p.uid = randHex(4) + "-" + randHex(2) + "-" + randHex(2) + "-" + randHex(2) + "-" + randHex(6)
	p.sbCfg = &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: p.uid},
		Labels:   map[string]string{cri.LabelPodUID: p.uid, cri.LabelPodName: name, cri.LabelPodNamespace: "default"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/kubepods/burstable/pod" + p.uid,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	resp, err := p.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: p.sbCfg})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("RunPodSandbox: %w", err)
	}
	p.sandbox = resp.PodSandboxId
	return p, nil
}

// run starts a container that sleeps, with a CPU request and no limit
// (cpu.max "max"), and returns where its cgroup is.
func (p *benchPod) run(ctx context.Context, cc *cri.Client, name string) (benchContainer, error) {
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: busyboxImage},
		Command:  []string{"/bin/busybox", "sleep", "100000"},
		Labels: map[string]string{cri.LabelPodUID: p.uid, cri.LabelContainerName: name,
			cri.LabelPodName: p.sbCfg.Metadata.Name, cri.LabelPodNamespace: "default"},
		Annotations: map[string]string{cri.AnnotationRestartCount: "0"},
		Linux:       &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102}},
	}
	created, err := p.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandbox, Config: cfg, SandboxConfig: p.sbCfg})
	if err != nil {
		return benchContainer{}, fmt.Errorf("CreateContainer %s: %w", name, err)
	}
	if _, err := p.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		return benchContainer{}, fmt.Errorf("StartContainer %s: %w", name, err)
	}
	ct, err := cc.Get(ctx, created.ContainerId)
	if err != nil {
		return benchContainer{}, err
	}
	path, err := cgroup.New().PathOf(ct.PID)
	if err != nil {
		return benchContainer{}, err
	}
	return benchContainer{name: name, id: ct.ID, cgroup: path, pid: ct.PID}, nil
}

func (p *benchPod) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, _ = p.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.sandbox})
	_, _ = p.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.sandbox})
	p.conn.Close()
}
