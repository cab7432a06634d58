package agent_test

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
)

// In Kubernetes mode the local API (resizectl, tokens, the socket) changes
// no Kubernetes pod: not by pod UID, not by container ID, not by the
// cgroup path under a kubelet pod cgroup. Other cgroups still can.
func TestKubeletOwnsPods(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, agent.WithKubeletOwnsPods())
	const uid = "0b9a1d6e-1111-4222-8333-944455556666"
	c := ra.AddContainer(t, uid, "web", "/kubepods/burstable/pod"+uid+"/web")
	ra.AddContainer(t, "", "sys", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b9a1d6e_1111_4222_8333_944455556666.slice/cri-x.scope")
	ra.AddContainer(t, "", "plain", "/other/plain")
	lim := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}
	for name, tg := range map[string]intent.Target{
		"pod UID":       {Name: "web", PodUID: uid},
		"container ID":  {Name: "web", ContainerID: c.ID},
		"cgroupfs path": {Name: "web", CgroupPath: "/kubepods/burstable/pod" + uid + "/web"},
		"systemd path":  {Name: "sys", CgroupPath: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b9a1d6e_1111_4222_8333_944455556666.slice/cri-x.scope"},
	} {
		_, _, err := ra.Submit(intent.Spec{Target: tg, Resources: lim})
		if !errors.Is(err, agent.ErrKubeletOwned) || !errors.Is(err, agent.ErrForbidden) {
			t.Errorf("%s: %v, want ErrKubeletOwned", name, err)
		}
	}
	if got := ra.File(t, "/kubepods/burstable/pod"+uid+"/web", "cpu.max"); got != "max 100000" {
		t.Errorf("cpu.max %q", got)
	}
	if _, _, err := ra.Submit(intent.Spec{Target: intent.Target{Name: "plain", CgroupPath: "/other/plain"}, Resources: lim}); err != nil {
		t.Errorf("a cgroup outside any pod: %v", err)
	}
}

// A followed intent is held and streamed but never admitted or applied;
// its state is what Report says, and Superseded is final.
func TestFollowAndReport(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 1000, Memory: 8 * gi})
	ra.AddContainer(t, "uid-1", "web", "/kubepods/burstable/poduid-1/web")
	s := intent.Spec{ID: "k8s.uid-1.web.abc", Target: intent.Target{Name: "web", PodUID: "uid-1"},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := ra.Watch(ctx, agent.Filter{IntentID: s.ID})
	it, created, err := ra.Follow(intent.OriginKubernetes, s)
	if err != nil || !created || it.Status.State != intent.Proposed || it.Status.Via != agent.ViaKubelet {
		t.Fatalf("follow: %+v %v %v", it, created, err)
	}
	if _, created, err := ra.Follow(intent.OriginKubernetes, s); err != nil || created {
		t.Errorf("again: %v %v", created, err)
	}
	// 64 CPUs on a 1-CPU ledger: a followed intent is not admitted.
	if a := ra.AllocatedMilliCPU(); a != 0 {
		t.Errorf("allocated %d", a)
	}
	if e := <-ch; e.Intent.Status.State != intent.Proposed {
		t.Errorf("first event %+v", e)
	}
	for _, st := range []intent.State{intent.Deferred, intent.Infeasible, intent.InProgress, intent.Completed} {
		if _, err := ra.Report(s.ID, st, string(st), "kubelet says "+string(st)); err != nil {
			t.Fatal(err)
		}
		if e := <-ch; e.Intent.Status.State != st {
			t.Errorf("event %+v, want %s", e.Intent.Status, st)
		}
	}
	if got := ra.File(t, "/kubepods/burstable/poduid-1/web", "cpu.weight"); got != "100" {
		t.Errorf("cpu.weight %q: a followed intent was applied", got)
	}
	if _, err := ra.Report(s.ID, intent.Superseded, intent.ReasonSuperseded, "newer"); err != nil {
		t.Fatal(err)
	}
	if it, _ := ra.Report(s.ID, intent.Completed, "x", "y"); it.Status.State != intent.Superseded {
		t.Errorf("left Superseded: %+v", it.Status)
	}
	// The agent's own intents are not Report's.
	own, _, err := ra.Submit(intent.Spec{Target: intent.Target{Name: "web", PodUID: "uid-1"}, Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ra.Report(own.ID, intent.Failed, "x", "y"); !errors.Is(err, agent.ErrConflict) {
		t.Errorf("report on the agent's own intent: %v", err)
	}
}
