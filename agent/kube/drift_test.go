package kube

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// A cgroup value written behind the agent's back, restored by the agent's
// drift check, is told on the pod as a Warning Event. (In Kubernetes mode
// the agent manages no pod's container; an agent without
// WithKubeletOwnsPods, as here, still can, through its API.)
func TestDriftRestoreEvent(t *testing.T) {
	f := newFixture(t, true)
	p := f.pod("a", burstable, "", true)
	f.synced()
	if _, _, err := f.ra.Submit(intent.Spec{Target: intent.Target{Name: "web", PodUID: string(p.UID)},
		Resources: corev1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "128Mi"), Limits: rl("cpu", "2", "memory", "256Mi")}}); err != nil {
		t.Fatal(err)
	}
	f.waitFile(p, "cpu.max", "200000 100000")
	cgrouptest.SetFile(t, f.ra.Root, cgroupOf(p.UID, "web"), "cpu.max", "max 100000")
	eventually(t, "restore", func() string {
		f.ra.DriftCheck(context.Background())
		if got := f.ra.File(t, cgroupOf(p.UID, "web"), "cpu.max"); got != "200000 100000" {
			return "cpu.max " + got
		}
		return ""
	})
	eventually(t, "event", func() string {
		if e := f.rec.find("a spec.containers{web} Warning CgroupDrift: container web: cgroup values changed behind the agent's back were restored"); e == "" {
			return fmt.Sprint(f.rec.all())
		}
		return ""
	})
}
