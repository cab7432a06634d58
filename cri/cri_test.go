package cri_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/cri"
	"github.com/resizer/resize-agent/cri/critest"
)

func statusFor(id string, attempt uint32) *runtimeapi.ContainerStatusResponse {
	info, _ := json.Marshal(map[string]any{
		"sandboxID":   "sb1",
		"pid":         4242,
		"config":      &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "web", Attempt: attempt}, Image: &runtimeapi.ImageSpec{Image: "busybox"}},
		"runtimeSpec": map[string]any{"linux": map[string]any{"cgroupsPath": "/kubepods/pod1/" + id}},
	})
	return &runtimeapi.ContainerStatusResponse{
		Status: &runtimeapi.ContainerStatus{
			Id: id, Metadata: &runtimeapi.ContainerMetadata{Name: "web", Attempt: attempt},
			State: runtimeapi.ContainerState_CONTAINER_RUNNING, StartedAt: 1700000000e9,
			Labels:    map[string]string{cri.LabelPodUID: "uid-1", cri.LabelContainerName: "web"},
			Resources: &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 1 << 28}},
		},
		Info: map[string]string{"info": string(info)},
	}
}

func dial(t *testing.T, r *critest.Runtime) *cri.Client {
	t.Helper()
	c, err := cri.Dial(critest.Serve(t, r), cri.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFindPicksNewestAttempt(t *testing.T) {
	var sel map[string]string
	r := &critest.Runtime{
		ListContainersFn: func(q *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			sel = q.Filter.LabelSelector
			return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
				{Id: "old", Metadata: &runtimeapi.ContainerMetadata{Attempt: 0}},
				{Id: "new", Metadata: &runtimeapi.ContainerMetadata{Attempt: 2}},
			}}, nil
		},
		ContainerStatusFn: func(q *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
			return statusFor(q.ContainerId, 2), nil
		},
	}
	c := dial(t, r)
	ct, err := c.Find(context.Background(), "uid-1", "web")
	if err != nil {
		t.Fatal(err)
	}
	if sel[cri.LabelPodUID] != "uid-1" || sel[cri.LabelContainerName] != "web" {
		t.Errorf("selector %v", sel)
	}
	if ct.ID != "new" || ct.PID != 4242 || ct.SandboxID != "sb1" || ct.CgroupsPath != "/kubepods/pod1/new" || !ct.Running() ||
		ct.Resources != (cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512, MemoryLimit: 1 << 28}) || ct.RestartCount != 2 || ct.PodUID != "uid-1" {
		t.Errorf("container %+v", ct)
	}
}

func TestErrorsMapToSentinels(t *testing.T) {
	r := &critest.Runtime{
		ListContainersFn: func(*runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			return &runtimeapi.ListContainersResponse{}, nil
		},
		ContainerStatusFn: func(q *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
			return nil, status.Error(codes.NotFound, "no such container")
		},
	}
	c := dial(t, r)
	if _, err := c.Find(context.Background(), "uid-1", "web"); !errors.Is(err, cri.ErrNotFound) {
		t.Errorf("Find none: %v", err)
	}
	if _, err := c.Get(context.Background(), "x"); !errors.Is(err, cri.ErrNotFound) {
		t.Errorf("Get gone: %v", err)
	}
	gone, err := cri.Dial("/nonexistent/cri.sock", cri.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if _, err := gone.Version(context.Background()); !errors.Is(err, cri.ErrUnavailable) {
		t.Errorf("no runtime: %v", err)
	}
	if _, err := cri.Dial("tcp://1.2.3.4:5"); err == nil {
		t.Error("tcp endpoint accepted")
	}
}

func TestUpdateSendsResources(t *testing.T) {
	var got *runtimeapi.LinuxContainerResources
	r := &critest.Runtime{UpdateContainerResourcesFn: func(q *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		got = q.Linux
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}}
	c := dial(t, r)
	if err := c.Update(context.Background(), "c1", cri.Resources{CPUPeriod: 100000, CPUQuota: -1, CPUShares: 2048, MemoryLimit: -1}); err != nil {
		t.Fatal(err)
	}
	if got.CpuPeriod != 100000 || got.CpuQuota != -1 || got.CpuShares != 2048 || got.MemoryLimitInBytes != -1 {
		t.Errorf("sent %v", got)
	}
}

func TestRestartCreatesNextAttempt(t *testing.T) {
	var created *runtimeapi.CreateContainerRequest
	sbInfo, _ := json.Marshal(map[string]any{"config": &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "uid-1"}}})
	r := &critest.Runtime{
		ContainerStatusFn: func(q *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
			if q.ContainerId == "c2" {
				return statusFor("c2", 1), nil
			}
			return statusFor(q.ContainerId, 0), nil
		},
		PodSandboxStatusFn: func(*runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
			return &runtimeapi.PodSandboxStatusResponse{Info: map[string]string{"info": string(sbInfo)}}, nil
		},
		StopContainerFn: func(*runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
			return &runtimeapi.StopContainerResponse{}, nil
		},
		CreateContainerFn: func(q *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			created = q
			return &runtimeapi.CreateContainerResponse{ContainerId: "c2"}, nil
		},
		StartContainerFn: func(*runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
			return &runtimeapi.StartContainerResponse{}, nil
		},
		RemoveContainerFn: func(*runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
			return &runtimeapi.RemoveContainerResponse{}, nil
		},
	}
	c := dial(t, r)
	ct, err := c.Restart(context.Background(), "c1", cri.Resources{CPUPeriod: 100000, CPUQuota: 20000, CPUShares: 256, MemoryLimit: 64 << 20}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ct.ID != "c2" {
		t.Errorf("new container %+v", ct)
	}
	if created.PodSandboxId != "sb1" || created.Config.Metadata.Attempt != 1 || created.Config.Linux.Resources.MemoryLimitInBytes != 64<<20 ||
		created.Config.Annotations[cri.AnnotationRestartCount] != "1" || created.SandboxConfig.Metadata.Uid != "uid-1" {
		t.Errorf("create request %v", created)
	}
	if got := strings.Join(r.Calls(), ","); got != "ContainerStatus,PodSandboxStatus,CreateContainer,StopContainer,StartContainer,RemoveContainer,ContainerStatus" {
		t.Errorf("calls %s", got)
	}
}

// restartRuntime is a runtime for Restart whose create and start answer
// from the given funcs; c1 is the running container.
func restartRuntime(create func() (string, error), start func(id string) error, running map[string]bool) *critest.Runtime {
	sbInfo, _ := json.Marshal(map[string]any{"config": &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "uid-1"}}})
	return &critest.Runtime{
		ContainerStatusFn: func(q *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
			st := statusFor(q.ContainerId, 0)
			if !running[q.ContainerId] {
				st.Status.State = runtimeapi.ContainerState_CONTAINER_EXITED
			}
			return st, nil
		},
		PodSandboxStatusFn: func(*runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
			return &runtimeapi.PodSandboxStatusResponse{Info: map[string]string{"info": string(sbInfo)}}, nil
		},
		StopContainerFn: func(*runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
			running["c1"] = false
			return &runtimeapi.StopContainerResponse{}, nil
		},
		CreateContainerFn: func(*runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			id, err := create()
			return &runtimeapi.CreateContainerResponse{ContainerId: id}, err
		},
		StartContainerFn: func(q *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
			return &runtimeapi.StartContainerResponse{}, start(q.ContainerId)
		},
		RemoveContainerFn: func(*runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
			return &runtimeapi.RemoveContainerResponse{}, nil
		},
	}
}

// TestRestartCannotLoseTheContainer (issue 18 item 2): a start that fails
// after the old container is stopped is retried with a new attempt; a start
// that timed out but completed counts; a create that fails leaves the old
// container running; a restart that cannot start anything says that no
// container is left.
func TestRestartCannotLoseTheContainer(t *testing.T) {
	res := cri.Resources{CPUPeriod: 100000, CPUQuota: 20000, CPUShares: 256}
	t.Run("start fails once, then a new attempt starts", func(t *testing.T) {
		running, n := map[string]bool{"c1": true}, 0
		r := restartRuntime(func() (string, error) { n++; return fmt.Sprintf("n%d", n), nil }, func(id string) error {
			if id == "n1" {
				return status.Error(codes.Unknown, "failed to create shim task")
			}
			running[id] = true
			return nil
		}, running)
		ct, err := dial(t, r).Restart(context.Background(), "c1", res, time.Second)
		if err != nil || ct.ID != "n2" {
			t.Fatalf("restart: %+v, %v", ct, err)
		}
	})
	t.Run("a start that timed out but ran", func(t *testing.T) {
		running := map[string]bool{"c1": true}
		r := restartRuntime(func() (string, error) { return "n1", nil }, func(id string) error {
			running[id] = true
			return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
		}, running)
		ct, err := dial(t, r).Restart(context.Background(), "c1", res, time.Second)
		if err != nil || ct.ID != "n1" {
			t.Fatalf("restart: %+v, %v", ct, err)
		}
		if got := strings.Count(strings.Join(r.Calls(), ","), "CreateContainer"); got != 1 {
			t.Errorf("%d creates, want 1 (the started one kept)", got)
		}
	})
	t.Run("create fails: the old one keeps running", func(t *testing.T) {
		running := map[string]bool{"c1": true}
		r := restartRuntime(func() (string, error) { return "", status.Error(codes.Unknown, "no space left on device") }, func(string) error { return nil }, running)
		_, err := dial(t, r).Restart(context.Background(), "c1", res, time.Second)
		var re *cri.RestartError
		if !errors.As(err, &re) || re.Running != "c1" || !errors.Is(err, cri.ErrRestart) || !running["c1"] {
			t.Fatalf("err %v, want a RestartError leaving c1 running", err)
		}
		if strings.Contains(strings.Join(r.Calls(), ","), "StopContainer") {
			t.Errorf("stopped the old container without a new one: %v", r.Calls())
		}
	})
	t.Run("nothing starts: no container is left, and it says so", func(t *testing.T) {
		running, n := map[string]bool{"c1": true}, 0
		r := restartRuntime(func() (string, error) { n++; return fmt.Sprintf("n%d", n), nil },
			func(string) error { return status.Error(codes.Unknown, "exec format error") }, running)
		_, err := dial(t, r).Restart(context.Background(), "c1", res, time.Second)
		var re *cri.RestartError
		if !errors.As(err, &re) || re.Running != "" || !strings.Contains(err.Error(), "no running container is left") {
			t.Fatalf("err %v", err)
		}
		if n != 4 {
			t.Errorf("%d attempts created, want 4 tries", n)
		}
	})
}
