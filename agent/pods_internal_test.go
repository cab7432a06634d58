package agent

import (
	"testing"

	"github.com/resizer/resize-agent/agent/intent"
)

// TestPods: a pod's members are kept as containers join and leave, the pod
// goes with its last member, and its QoS class, sizing and speaker come
// from its members alone.
func TestPods(t *testing.T) {
	ps := pods{}
	a := &container{key: "pod:u/a", runtimeID: "ra", res: intent.Resources{CPURequest: 500, CPULimit: 500, MemoryRequest: 64, MemoryLimit: 64}, cpu: true, mem: true}
	b := &container{key: "pod:u/b", runtimeID: "rb", res: intent.Resources{CPURequest: 100}, cpu: true}
	other := &container{key: "/other"}
	if p := ps.join("", other); p != nil || len(ps) != 0 {
		t.Fatalf("no pod path: joined %v", p)
	}
	a.pod = ps.join("/kubepods/podu", a)
	b.pod = ps.join("/kubepods/podu", b)
	if a.pod != b.pod || len(ps) != 1 || len(a.pod.members) != 2 {
		t.Fatalf("pods %v, members %v", ps, a.pod.members)
	}
	// b has no limits: the pod is Burstable; a alone would be Guaranteed.
	if q := a.qos(a.res); q != "Burstable" {
		t.Errorf("qos with b = %s", q)
	}
	if s := a.pod.speaker(); s != a {
		t.Errorf("speaker %s, want the first declaring member by key", s.key)
	}
	want := intent.Resources{CPURequest: 1000}
	m := a.pod.sizing(a, want, true, false)
	if len(m) != 2 || m[0].Resources != want || m[0].Memory || m[1].RuntimeID != "rb" {
		t.Errorf("sizing %+v", m)
	}
	a.running = true
	if a.pod.idle() {
		t.Error("idle with a member running")
	}
	ps.leave(a)
	if len(b.pod.members) != 1 || len(ps) != 1 {
		t.Errorf("after a left: members %v", b.pod.members)
	}
	if q := b.qos(b.res); q != "Burstable" {
		t.Errorf("qos alone = %s", q)
	}
	ps.leave(b)
	if len(ps) != 0 {
		t.Errorf("the pod outlived its last member: %v", ps)
	}
	ps.leave(other) // no pod: nothing to do
}
