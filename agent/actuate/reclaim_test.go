package actuate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/resizer/resize-agent/cgroup"
)

// shrinking is a cgroup whose usage memory.reclaim brings down.
type shrinking struct{ fakeCgroups }

func (s *shrinking) Reclaim(_ string, n int64) (int64, error) {
	s.mem.Current -= n
	return n, nil
}

// TestReclaimBelowHoldsThenRestores: usage is brought under the limit,
// memory.high held under it (memory.max untouched), and RestoreHigh puts
// back what was found, unless another writer (the kubelet under MemoryQoS)
// set memory.high meanwhile.
func TestReclaimBelowHoldsThenRestores(t *testing.T) {
	const mi = 1 << 20
	found := int64(147 * mi)
	for _, kubeletWrote := range []bool{false, true} {
		cg := &shrinking{fakeCgroups{mem: cgroup.Memory{Current: 98 * mi, High: found, Max: 160 * mi}}}
		r := ReclaimBelow(context.Background(), cg, "/c", 48*mi, time.Second)
		if r.Err != nil || !r.Held() || r.Found != found || r.Set >= 48*mi || r.Set%4096 != 0 || cg.mem.High != r.Set {
			t.Fatalf("reclaim %+v, memory.high now %d", r, cg.mem.High)
		}
		if r.After.Current >= 48*mi || r.Amount() != r.Before.Current-r.After.Current || !strings.Contains(r.Message, "reclaimed") {
			t.Errorf("figures %+v", r)
		}
		if kubeletWrote {
			cg.mem.High = 46 * mi
		}
		now, wrote, err := RestoreHigh(cg, r)
		switch {
		case err != nil:
			t.Fatal(err)
		case kubeletWrote && (wrote || now != 46*mi || cg.mem.High != 46*mi):
			t.Errorf("the kubelet's memory.high overwritten: now %d wrote %v", now, wrote)
		case !kubeletWrote && (!wrote || now != found || cg.mem.High != found):
			t.Errorf("memory.high not restored: now %d wrote %v", now, wrote)
		}
		for _, w := range cg.writes {
			if !strings.Contains(w, "memory.high") {
				t.Errorf("wrote %s: only memory.high is written", w)
			}
		}
	}
}

// TestReclaimBelowGivesUp: usage that will not come down (anonymous
// memory, no swap) ends with the reason and memory.high as it was.
func TestReclaimBelowGivesUp(t *testing.T) {
	const mi = 1 << 20
	cg := &fakeCgroups{mem: cgroup.Memory{Current: 70 * mi, Anon: 66 * mi, High: cgroup.Unlimited, Max: 256 * mi}}
	r := ReclaimBelow(context.Background(), cg, "/c", 40*mi, 5*time.Second)
	if r.Err == nil || r.Held() || cg.mem.High != cgroup.Unlimited {
		t.Fatalf("reclaim %+v, memory.high %d: want a failure with memory.high back at max", r, cg.mem.High)
	}
	if !strings.Contains(r.Message, "usage stopped falling") || !strings.Contains(r.Message, "anon 66.0 MiB") || !strings.Contains(r.Message, "memory.high restored to max") {
		t.Errorf("message %q", r.Message)
	}
	if got := fmt.Sprint(cg.writes); strings.Count(got, "memory.high") != 2 {
		t.Errorf("writes %s: memory.high lowered and put back", got)
	}
}
