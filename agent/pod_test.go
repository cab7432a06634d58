package agent_test

import (
	"context"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// TestPodCgroupCountsUnmanagedContainers: the agent manages one container
// of a two-container pod; the kubelet's pod cgroup it keeps in step must
// still leave room for the other container, whose resources come from the
// runtime.
func TestPodCgroupCountsUnmanagedContainers(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 8000, Memory: 8 * gi})
	const pod = "/kubepods/burstable/poduid-1"
	cgrouptest.AddFake(t, ra.Root, pod)
	ra.AddContainer(t, "uid-1", "web", pod+"/web")
	side := ra.AddContainer(t, "uid-1", "side", pod+"/side")
	// What the kubelet gave the sidecar: 500m request and limit, 64Mi.
	if err := ra.Runtime.Update(context.Background(), side.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512, MemoryLimit: 64 << 20}); err != nil {
		t.Fatal(err)
	}

	s := intent.Spec{Target: intent.Target{Name: "web", PodUID: "uid-1"}}
	s.Resources.Requests = list2(map[string]string{"cpu": "1", "memory": "128Mi"})
	s.Resources.Limits = list2(map[string]string{"cpu": "1", "memory": "128Mi"})
	want(t, submit(t, ra.Agent, s), intent.Completed, "")
	for file, v := range map[string]string{
		"cpu.max":    "150000 100000", // 1 + 500m
		"cpu.weight": "59",            // 1500m, the kubelet's linear rule (runc's would give 138)
		"memory.max": itoa(192 << 20),
	} {
		if got := ra.File(t, pod, file); got != v {
			t.Errorf("pod %s = %q, want %q", file, got, v)
		}
	}
	if got := ra.File(t, pod+"/web", "cpu.max"); got != "100000 100000" {
		t.Errorf("web cpu.max = %q", got)
	}

	// The sidecar loses its CPU limit: the pod may no longer have a quota.
	if err := ra.Runtime.Update(context.Background(), side.ID, cri.Resources{CPUPeriod: 100000, CPUQuota: -1, CPUShares: 512}); err != nil {
		t.Fatal(err)
	}
	s.Resources.Limits = list2(map[string]string{"cpu": "2", "memory": "128Mi"})
	s.Resources.Requests = list2(map[string]string{"cpu": "2", "memory": "128Mi"})
	want(t, submit(t, ra.Agent, s), intent.Completed, "")
	if got := ra.File(t, pod, "cpu.max"); got != "max 100000" {
		t.Errorf("pod cpu.max = %q with a container without a CPU limit, want max", got)
	}
}

func list2(m map[string]string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for k, v := range m {
		l[corev1.ResourceName(k)] = q(v)
	}
	return l
}

func itoa[T int | int64 | uint64](v T) string { return strconv.FormatInt(int64(v), 10) }
