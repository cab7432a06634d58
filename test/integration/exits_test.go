package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestExitCompletesDeferred: a container holding most of the node exits,
// and the intent Deferred behind it completes at once, on the kernel's own
// cgroup.events notification rather than at a resync (the agent's resync
// interval here is an hour).
func TestExitCompletesDeferred(t *testing.T) {
	mnt, base := cgrouptest.Real(t)
	cg := cgroup.New(cgroup.WithMountpoint(mnt))
	if err := cg.Check(); err != nil {
		t.Fatal(err)
	}
	w, err := cg.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	srv := agenttest.ServeWith(t, cg, admission.Capacity{MilliCPU: 2000, Memory: 1 << 30}, agent.WithExitWatcher(w))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Agent.Run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); <-done })
	e := &env{mnt, base, srv, api.NewClient(srv.Socket)}

	big := cgrouptest.Child(t, mnt, base, "big")
	bigProc := helper("RA_HELPER=busy")
	cgrouptest.StartIn(t, mnt, big, bigProc)
	small := cgrouptest.Child(t, mnt, base, "small")
	cgrouptest.StartIn(t, mnt, small, helper("RA_HELPER=busy"))

	mustState(t, e.resize(t, "big", big, "", res{"cpu": "1500m"}, nil), intent.Completed)
	def := e.resize(t, "small", small, "", res{"cpu": "1"}, res{"cpu": "1"})
	mustState(t, def, intent.Deferred)

	killed := time.Now()
	if err := bigProc.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	var it intent.Intent
	err = e.c.Watch(wctx, agent.Filter{IntentID: def.ID}, func(ev agent.Event) bool {
		it = ev.Intent
		return !it.Status.State.Terminal()
	})
	if err != nil && !it.Status.State.Terminal() {
		t.Fatalf("waiting for the Deferred intent: %v (last seen %s)", err, it.Status.State)
	}
	mustState(t, it, intent.Completed)
	t.Logf("Deferred intent completed %v after the container holding the capacity was killed", it.Status.CompletedAt.Sub(killed).Round(time.Microsecond))
	if got := cgrouptest.ReadFile(t, mnt, small, "cpu.max"); got != "100000 100000" {
		t.Errorf("small's cpu.max = %q", got)
	}
	for _, c := range srv.Agent.Containers() {
		if c.Name == "big" {
			t.Errorf("the exited container is still managed: %+v", c)
		}
	}
}
