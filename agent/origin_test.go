package agent_test

import (
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestOrigin: an intent says who asked for it, whatever its ID.
func TestOrigin(t *testing.T) {
	f := newDriftFixture(t, bigNode, nil, "/pod/a", "/pod/b")
	s := spec("a", "/pod/a", map[string]string{"cpu": "500m"}, map[string]string{"cpu": "1"})
	s.ID = "k8s.looks-like-the-intake" // the prefix says nothing
	if it := submit(t, f.a, s); it.Origin != intent.OriginAPI {
		t.Errorf("Submit: origin %q, want api", it.Origin)
	}
	kube := spec("b", "/pod/b", map[string]string{"cpu": "500m"}, nil)
	it, _, err := f.a.SubmitFrom(intent.OriginKubernetes, kube)
	if err != nil {
		t.Fatal(err)
	}
	if it = settle(t, f.a, it.ID); it.Origin != intent.OriginKubernetes {
		t.Errorf("SubmitFrom: origin %q, want kubernetes", it.Origin)
	}

	cgrouptest.SetFile(t, f.root, "/pod/a", "cpu.max", "20000 100000")
	f.check(t)
	d := f.driftIntents()
	if len(d) != 1 || d[0].Origin != intent.OriginDrift {
		t.Fatalf("drift intents %+v, want one of origin drift", d)
	}
}

// TestForgetContainerByKey: an intake forgets a container by its typed key.
func TestForgetContainerByKey(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 4 << 30}, "/pod/a")
	submit(t, f.a, spec("a", "/pod/a", map[string]string{"cpu": "500m"}, nil))
	if err := f.a.ForgetContainer(agent.Key{Cgroup: "/pod/b"}); err == nil {
		t.Error("forgetting an unmanaged container: no error")
	}
	if err := f.a.ForgetContainer(agent.Key{Cgroup: "/pod/a"}); err != nil {
		t.Fatal(err)
	}
	if cs := f.a.Containers(); len(cs) != 0 {
		t.Errorf("still managed: %+v", cs)
	}
	if got := (agent.Key{PodUID: "u", Name: "web"}).String(); got != "pod:u/web" {
		t.Errorf("key %q: the journal's form changed", got)
	}
}

// TestOriginOfLegacyRecords: intents journaled before they carried an
// origin get it back from their ID on replay.
func TestOriginOfLegacyRecords(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/a")
	dir := t.TempDir()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var last journal.Ticket
	for i, id := range []string{"k8s.uid.a.hash", "drift-20260101-000000-00", "plain"} {
		last = j.Append(journal.Record{Seq: uint64(i + 1), Container: "/pod/a", Intent: intent.Intent{
			ID:     id,
			Spec:   intent.Spec{ID: id, Target: intent.Target{Name: "a", CgroupPath: "/pod/a"}},
			Status: intent.Status{State: intent.Failed, AcceptedAt: now, UpdatedAt: now, CompletedAt: &now},
		}})
	}
	if err := j.Wait(last); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	a, _, _ := journaled(t, root, dir, admission.Capacity{MilliCPU: 4000, Memory: 4 << 30})
	recoverAgent(t, a)
	for id, want := range map[string]intent.Origin{"k8s.uid.a.hash": intent.OriginKubernetes, "drift-20260101-000000-00": intent.OriginDrift, "plain": intent.OriginAPI} {
		it, err := a.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if it.Origin != want {
			t.Errorf("%s: origin %q, want %q", id, it.Origin, want)
		}
	}
}
