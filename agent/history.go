package agent

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"weak"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/intent"
)

// history is every intent the agent holds, in the order accepted; a.mu
// guards it.
type history struct {
	intents map[string]*record
	order   []string // intent IDs, by acceptance
}

// add appends r, in acceptance (seq) order: with a journal, submissions
// can come back from their sync out of order.
func (h *history) add(r *record) {
	h.intents[r.ID] = r
	h.order = append(h.order, r.ID)
	for i := len(h.order) - 1; i > 0 && h.intents[h.order[i-1]].seq > r.seq; i-- {
		h.order[i-1], h.order[i] = h.order[i], h.order[i-1]
	}
}

// evict drops the oldest terminal intents beyond size.
func (h *history) evict(size int) {
	excess := len(h.order) - size
	if excess <= 0 {
		return
	}
	// The oldest are nearly always terminal: drop them off the front
	// without copying the rest, which every accepted intent would pay
	// once the history is full (issue 16).
	i := 0
	for ; i < excess && h.intents[h.order[i]].Status.State.Terminal(); i++ {
		delete(h.intents, h.order[i])
	}
	h.order, excess = h.order[i:], excess-i
	if excess == 0 {
		return
	}
	kept := h.order[:0]
	for _, id := range h.order {
		if excess > 0 && h.intents[id].Status.State.Terminal() {
			delete(h.intents, id)
			excess--
			continue
		}
		kept = append(kept, id)
	}
	h.order = kept
}

// specs shares one copy of each resources section among the intents that
// ask for the same: the history holds up to 10,000 intents, and a copy of
// their requests and limits maps was most of the agent's memory with 1,000
// managed containers (issue 16). The shared maps are never written: an
// intent's spec is fixed once accepted.
//
// The table holds each copy weakly, as the unique package holds its
// values, and forgets it once no intent holds it: a table that kept every
// spec it had seen grew by about 1.3 KiB per distinct spec, 4 MiB in the
// soak's minute of random specs, long after the history had let those
// intents go.
type specs struct {
	mu    sync.Mutex
	byKey map[string]weak.Pointer[sharedResources]
}

// sharedResources is one shared copy; the records that use it hold it, so
// that it lives as long as they do.
type sharedResources struct{ r corev1.ResourceRequirements }

// intern returns a copy of r that shares no map with the caller's r, and
// what the caller must keep while it uses that copy (nil when nothing is
// shared).
func (s *specs) intern(r corev1.ResourceRequirements) (corev1.ResourceRequirements, *sharedResources) {
	if len(r.Claims) > 0 {
		return *r.DeepCopy(), nil
	}
	var key strings.Builder
	for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
		if l == nil {
			key.WriteString("nil;")
			continue
		}
		names := slices.Sorted(maps.Keys(l))
		for _, n := range names {
			// As the API shows it: "1" and "1000m" are kept apart.
			js, err := l[n].MarshalJSON()
			if err != nil {
				return *r.DeepCopy(), nil
			}
			key.WriteString(string(n))
			key.WriteByte('=')
			key.Write(js)
			key.WriteByte(',')
		}
		key.WriteByte(';')
	}
	k := key.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.byKey[k].Value(); p != nil {
		return p.r, p
	}
	if s.byKey == nil {
		s.byKey = map[string]weak.Pointer[sharedResources]{}
	}
	p := &sharedResources{r: *r.DeepCopy()}
	s.byKey[k] = weak.Make(p)
	runtime.AddCleanup(p, s.forget, k)
	return p.r, p
}

// forget drops k's entry once its copy is gone, unless a newer copy took
// its place before the cleanup ran.
func (s *specs) forget(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if wp, ok := s.byKey[k]; ok && wp.Value() == nil {
		delete(s.byKey, k)
	}
}

// len is the number of specs in the table, for tests.
func (s *specs) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

// Activity counts the intents' changes of state since the agent started
// (acceptances, progress, outcomes, from every origin): while it stands
// still, the agent is at rest.
func (a *Agent) Activity() uint64 { return a.hub.events.Load() }

// Get returns an intent by ID.
func (a *Agent) Get(id string) (intent.Intent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.hist.intents[id]
	if !ok {
		return intent.Intent{}, fmt.Errorf("%w: intent %q", ErrNotFound, id)
	}
	return r.Intent, nil
}

// List returns the intents that match f, oldest first, optionally only
// those in state.
func (a *Agent) List(f Filter, state intent.State) []intent.Intent {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []intent.Intent{}
	for _, id := range a.hist.order {
		r := a.hist.intents[id]
		if f.Match(&r.Intent) && (state == "" || r.Status.State == state) {
			out = append(out, r.Intent)
		}
	}
	return out
}

// Watch returns the events that match f, starting with the current state of
// every matching intent that is not terminal (or of the one named by
// f.IntentID, whatever its state). The channel closes when ctx ends, when
// the watcher falls too far behind, or when the agent closes.
func (a *Agent) Watch(ctx context.Context, f Filter) <-chan Event {
	a.mu.Lock()
	sub := a.hub.subscribe(f, false)
	var initial []Event
	if f.IntentID != "" {
		// One intent, whatever its state: no scan of the history, which
		// every client waiting for its resize would otherwise pay.
		if r, ok := a.hist.intents[f.IntentID]; ok && f.Match(&r.Intent) {
			initial = append(initial, Event{Type: "ADDED", Intent: r.Intent})
		}
	} else {
		for _, id := range a.hist.order {
			r := a.hist.intents[id]
			if f.Match(&r.Intent) && !r.Status.State.Terminal() {
				initial = append(initial, Event{Type: "ADDED", Intent: r.Intent})
			}
		}
	}
	a.mu.Unlock()
	out := make(chan Event) // the subscriber's queue is the buffer
	go func() {
		defer close(out)
		defer a.hub.unsubscribe(sub)
		for _, e := range initial {
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
		for {
			e, ok := sub.next(ctx)
			if !ok {
				return
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Await returns intent id once it has settled (terminal or Deferred), or as
// it stands when ctx ends first. It serves a submission that waits for its
// outcome in the same request (POST /v1/intents?wait=): one subscriber,
// read where it wakes, without the goroutine and the channel of a watch.
func (a *Agent) Await(ctx context.Context, id string) (intent.Intent, error) {
	a.mu.Lock()
	r, ok := a.hist.intents[id]
	if !ok {
		a.mu.Unlock()
		return intent.Intent{}, fmt.Errorf("%w: intent %q", ErrNotFound, id)
	}
	last := r.Intent
	if last.Status.State.Settled() {
		a.mu.Unlock()
		return last, nil
	}
	// Subscribed under the lock: no change of r can fall between the
	// state read above and the subscription.
	sub := a.hub.subscribe(Filter{IntentID: id}, true)
	a.mu.Unlock()
	defer a.hub.unsubscribe(sub)
	for {
		e, ok := sub.next(ctx)
		if !ok {
			// ctx ended, or the hub let the subscriber go (the agent
			// closing): the intent as it stands now.
			if cur, err := a.Get(id); err == nil {
				return cur, nil
			}
			return last, nil
		}
		last = e.Intent
		if last.Status.State.Settled() {
			return last, nil
		}
	}
}
