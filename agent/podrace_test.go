package agent_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestPodSumsUnderConcurrentResizes: resizes of a pod's containers at the
// same time must leave the pod cgroup at the sum of what its containers
// hold once every intent completed, whatever the interleaving (issue 18
// item 3: each computed the pod's sums from its siblings' old values).
// Container writes are slowed a little at random to widen the window.
func TestPodSumsUnderConcurrentResizes(t *testing.T) {
	const members, rounds = 3, 30
	paths := []string{"/pod"}
	for i := range members {
		paths = append(paths, fmt.Sprintf("/pod/c%d", i))
	}
	f := newFixture(t, admission.Capacity{MilliCPU: 64000, Memory: 64 * gi}, paths...)
	f.cg.mu.Lock()
	f.cg.fail = func(p string, _ cgroup.Resources) error {
		if p != "/pod" {
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		}
		return nil
	}
	f.cg.mu.Unlock()
	specOf := func(i, milli, mib int) intent.Spec {
		r := map[string]string{"cpu": fmt.Sprintf("%dm", milli), "memory": fmt.Sprintf("%dMi", mib)}
		s := spec(fmt.Sprintf("c%d", i), fmt.Sprintf("/pod/c%d", i), r, r)
		s.Target.PodCgroupPath = "/pod"
		return s
	}
	for i := range members {
		want(t, submit(t, f.a, specOf(i, 100, 16)), intent.Completed, "")
	}
	bad := 0
	for round := range rounds {
		milli, mib := make([]int, members), make([]int, members)
		var wg sync.WaitGroup
		for i := range members {
			milli[i], mib[i] = 100+100*rand.IntN(20), 16+rand.IntN(64)
			wg.Add(1)
			go func() {
				defer wg.Done()
				it, _, err := f.a.Submit(specOf(i, milli[i], mib[i]))
				if err != nil {
					t.Errorf("Submit: %v", err)
					return
				}
				if it = settle(t, f.a, it.ID); it.Status.State != intent.Completed {
					t.Errorf("round %d c%d: %s %s", round, i, it.Status.State, it.Status.Message)
				}
			}()
		}
		wg.Wait()
		var sumQuota, sumMem int
		for i := range members {
			sumQuota += milli[i] * 100
			sumMem += mib[i] << 20
		}
		gotCPU := cgrouptest.ReadFile(t, f.root, "/pod", "cpu.max")
		gotMem := cgrouptest.ReadFile(t, f.root, "/pod", "memory.max")
		if gotCPU != fmt.Sprintf("%d 100000", sumQuota) || gotMem != fmt.Sprint(sumMem) {
			bad++
			t.Errorf("round %d: pod cpu.max %s memory.max %s, want %d 100000 and %d (the containers' sums)", round, gotCPU, gotMem, sumQuota, sumMem)
		}
	}
	if bad > 0 {
		t.Logf("%d of %d rounds left the pod cgroup off its containers' sums", bad, rounds)
	}
}
