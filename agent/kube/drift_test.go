package kube

import (
	"context"
	"fmt"
	"testing"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// A cgroup value written behind the agent's back, restored by the agent's
// drift check, is told on the pod as a Warning Event.
func TestDriftRestoreEvent(t *testing.T) {
	f := newFixture(t, ModeAnnotation, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi})
	p := f.pod("a", burstable, `{"web": {"limits": {"cpu": "2"}}}`, true)
	f.waitFile(p, "cpu.max", "200000 100000")
	f.waitConditions("a", none)
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
