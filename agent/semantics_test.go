package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// startedAs gives a runtime container the resources the kubelet created it
// with, in the runtime's record and its files.
func startedAs(t *testing.T, ra *agenttest.RuntimeAgent, id string, r cri.Resources) {
	t.Helper()
	if err := ra.Runtime.Update(context.Background(), id, r); err != nil {
		t.Fatal(err)
	}
}

func podIntent(name, uid string, req, lim map[string]string, restart ...corev1.ResourceName) intent.Spec {
	s := intent.Spec{Target: intent.Target{Name: name, PodUID: uid}}
	s.Resources.Requests, s.Resources.Limits = list2(req), list2(lim)
	for _, r := range restart {
		s.ResizePolicy = append(s.ResizePolicy, corev1.ContainerResizePolicy{ResourceName: r, RestartPolicy: corev1.RestartContainer})
	}
	return s
}

// TestRestartOnlyWhenTheRuntimeValuesChange: under RestartContainer, the
// first intent for a container that asks for what it has does not restart
// it (issue 18 item 1: the agent did not know the requests and counted it
// as a change); a change under another resource's policy does not; a
// change under that policy does, the memory request included once the
// agent knows it (the kubelet judges it by its checkpoint).
func TestRestartOnlyWhenTheRuntimeValuesChange(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	ct := ra.AddContainer(t, "uid-1", "app", "/kubepods/burstable/poduid-1/app")
	startedAs(t, ra, ct.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: 100000, CPUShares: 512, MemoryLimit: 128 << 20})
	both := []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

	it := submit(t, ra.Agent, podIntent("app", "uid-1", map[string]string{"cpu": "500m", "memory": "64Mi"}, map[string]string{"cpu": "1", "memory": "128Mi"}, both...))
	want(t, it, intent.Completed, "")
	if it.Status.Restarted {
		t.Errorf("restarted for the values it has: %s", it.Status.Message)
	}
	it = submit(t, ra.Agent, podIntent("app", "uid-1", map[string]string{"memory": "96Mi"}, nil, corev1.ResourceCPU))
	want(t, it, intent.Completed, "")
	if it.Status.Restarted {
		t.Errorf("restarted for a memory request under a CPU-only restart policy: %s", it.Status.Message)
	}
	it = submit(t, ra.Agent, podIntent("app", "uid-1", map[string]string{"memory": "128Mi"}, nil, both...))
	want(t, it, intent.Completed, "")
	if !it.Status.Restarted {
		t.Errorf("not restarted for a memory request under RestartContainer: %s", it.Status.Message)
	}
	it = submit(t, ra.Agent, podIntent("app", "uid-1", nil, map[string]string{"memory": "192Mi"}, corev1.ResourceMemory))
	want(t, it, intent.Completed, "")
	if !it.Status.Restarted {
		t.Errorf("not restarted for a memory limit under RestartContainer: %s", it.Status.Message)
	}
}

// TestRefusesRemovals: Kubernetes refuses to remove a limit or a request
// in place; so does the agent, with a clear reason, and nothing changes
// (issue 18 item 4).
func TestRefusesRemovals(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	ct := ra.AddContainer(t, "uid-1", "app", "/kubepods/burstable/poduid-1/app")
	startedAs(t, ra, ct.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: 100000, CPUShares: 512, MemoryLimit: 128 << 20})
	before := ra.Runtime.Updates()
	for _, tc := range []struct {
		req, lim map[string]string
		says     string
	}{
		{nil, map[string]string{"cpu": "0"}, "limits.cpu: resource limits cannot be removed"},
		{nil, map[string]string{"memory": "0"}, "limits.memory: resource limits cannot be removed"},
		{map[string]string{"cpu": "0"}, nil, "requests.cpu: resource requests cannot be removed"},
	} {
		_, _, err := ra.Submit(podIntent("app", "uid-1", tc.req, tc.lim))
		if !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v %v: err %v, want %q", tc.req, tc.lim, err, tc.says)
		}
	}
	if ra.Runtime.Updates() != before || ra.File(t, "/kubepods/burstable/poduid-1/app", "cpu.max") != "100000 100000" {
		t.Errorf("a refused intent changed something: %d updates, cpu.max %s", ra.Runtime.Updates()-before, ra.File(t, "/kubepods/burstable/poduid-1/app", "cpu.max"))
	}
}

// TestQoSChangeJudgedFromTheRuntime: the QoS class is judged from what the
// runtime reports for every container of the pod, from the first intent on
// (issue 18 item 4: it was checked only once both resources were declared).
func TestQoSChangeJudgedFromTheRuntime(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	g := ra.AddContainer(t, "uid-g", "app", "/kubepods/poduid-g/app")
	startedAs(t, ra, g.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512, MemoryLimit: 128 << 20})
	_, _, err := ra.Submit(podIntent("app", "uid-g", nil, map[string]string{"cpu": "1"}))
	if !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), "from Guaranteed to Burstable") {
		t.Errorf("Guaranteed to Burstable in a first intent: %v", err)
	}

	be := ra.AddContainer(t, "uid-b", "app", "/kubepods/besteffort/poduid-b/app")
	startedAs(t, ra, be.ID, cri.Resources{CPUPeriod: 100000, CPUShares: 2})
	_, _, err = ra.Submit(podIntent("app", "uid-b", map[string]string{"cpu": "100m"}, nil))
	if !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), "from BestEffort to Burstable") {
		t.Errorf("BestEffort to Burstable in a first intent: %v", err)
	}

	// A Guaranteed pod with a second container the agent does not manage
	// that is Burstable: the pod is Burstable, and making the managed one
	// Burstable too changes nothing.
	cgrouptest.AddFake(t, ra.Root, "/kubepods/burstable/poduid-p")
	a := ra.AddContainer(t, "uid-p", "a", "/kubepods/burstable/poduid-p/a")
	side := ra.AddContainer(t, "uid-p", "side", "/kubepods/burstable/poduid-p/side")
	startedAs(t, ra, a.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512, MemoryLimit: 128 << 20})
	startedAs(t, ra, side.ID, cri.Resources{CPUPeriod: 100000, CPUShares: 102})
	want(t, submit(t, ra.Agent, podIntent("a", "uid-p", nil, map[string]string{"cpu": "1"})), intent.Completed, "")
}

// TestRuntimeRecordFollowsNoChange: a resize whose files already hold the
// values still reaches the runtime, so that its record is a kubelet-driven
// node's: 25m and 20m of requests give the same cpu.weight, not the same
// shares (issue 18 item 6); and no limit is sent as 0, as the kubelet does.
func TestRuntimeRecordFollowsNoChange(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	ct := ra.AddContainer(t, "uid-1", "app", "/kubepods/burstable/poduid-1/app")
	startedAs(t, ra, ct.ID, cri.Resources{CPUPeriod: 100000, CPUShares: 25})
	it := submit(t, ra.Agent, podIntent("app", "uid-1", map[string]string{"cpu": "20m"}, nil))
	want(t, it, intent.Completed, intent.ReasonNoChange)
	got, err := ra.Runtime.Get(context.Background(), ct.ID)
	if err != nil || got.Resources.CPUShares != 20 || got.Resources.CPUQuota != 0 {
		t.Errorf("runtime's record %+v (%v), want 20 shares and quota 0 (no limit)", got.Resources, err)
	}
}

// TestMemoryRequestOnlyIsBurstable: a container whose only resource is a
// memory request has the same runtime record as a BestEffort one (no
// runtime carries a memory request); the kubelet's placement of its pod
// under the burstable QoS cgroup says it is Burstable, so its spec can be
// declared, and then removing the request is refused as Kubernetes refuses
// it (issue 18: the e2e case "Burstable pod - remove memory requests").
func TestMemoryRequestOnlyIsBurstable(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, bigNode)
	ct := ra.AddContainer(t, "uid-1", "app", "/kubepods/burstable/poduid-1/app")
	startedAs(t, ra, ct.ID, cri.Resources{CPUPeriod: 100000, CPUShares: 2})
	it := submit(t, ra.Agent, podIntent("app", "uid-1", map[string]string{"memory": "35Mi"}, nil))
	want(t, it, intent.Completed, "")
	_, _, err := ra.Submit(podIntent("app", "uid-1", map[string]string{"memory": "0"}, nil))
	if !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), "requests.memory: resource requests cannot be removed (it is 35Mi)") {
		t.Errorf("removing the declared memory request: %v", err)
	}

	// Under the besteffort QoS cgroup the same record is BestEffort, and a
	// request is still a QoS change.
	be := ra.AddContainer(t, "uid-2", "app", "/kubepods/besteffort/poduid-2/app")
	startedAs(t, ra, be.ID, cri.Resources{CPUPeriod: 100000, CPUShares: 2})
	if _, _, err := ra.Submit(podIntent("app", "uid-2", map[string]string{"memory": "35Mi"}, nil)); !errors.Is(err, intent.ErrInvalid) ||
		!strings.Contains(err.Error(), "from BestEffort to Burstable") {
		t.Errorf("a memory request for a BestEffort pod: %v", err)
	}
}
