package agent

import (
	"sort"

	"github.com/resizer/resize-agent/agent/intent"
)

// ListPage is List a page at a time, so that a client walking a long
// history never makes the agent copy it whole: up to limit intents that
// match, oldest first, accepted after the one numbered after (0: from the
// start), and the number to pass as after for the next page (0: no more).
// The numbers are the intents' sequence numbers, which a.hist.order is sorted by,
// so a page starts where the last ended even when older intents have been
// evicted meanwhile.
func (a *Agent) ListPage(f Filter, state intent.State, after uint64, limit int) ([]intent.Intent, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := sort.Search(len(a.hist.order), func(i int) bool { return a.hist.intents[a.hist.order[i]].seq > after })
	out := []intent.Intent{}
	for ; i < len(a.hist.order); i++ {
		r := a.hist.intents[a.hist.order[i]]
		if !f.Match(&r.Intent) || (state != "" && r.Status.State != state) {
			continue
		}
		if len(out) == limit {
			return out, a.hist.intents[a.hist.order[i-1]].seq
		}
		out = append(out, r.Intent)
	}
	return out, 0
}
