package agent

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/resizer/resize-agent/agent/api"
)

// The API's wire types, defined in the leaf package api.
type (
	Event         = api.Event
	Filter        = api.Filter
	ContainerInfo = api.ContainerInfo
	CgroupValues  = api.CgroupValues
	NodeInfo      = api.NodeInfo
	DriftInfo     = api.DriftInfo
	DriftFile     = api.DriftFile
	// DriftPolicy is what the agent does when a managed container's cgroup
	// no longer holds what its last completed intent gave it.
	DriftPolicy = api.DriftPolicy
)

// watchBuffer is how many events a watcher may fall behind before it is
// cut off; a client then sees its stream end and can watch again.
const watchBuffer = 256

// A subscriber's queue grows as events come and shrinks as they are taken:
// a channel of watchBuffer events was allocated whole for each watcher
// (about 188 KiB with the agent's own, for a stream that may never see an
// event; issue 15).
type subscriber struct {
	f      Filter
	wake   chan struct{} // one pending wake-up
	mu     sync.Mutex
	queue  []Event
	closed bool // no more events: the hub dropped it or closed
	// settled: only the events that settle an intent (Await), so that a
	// submission waiting for its outcome is not woken for InProgress.
	settled bool
}

// next returns the next event, waiting for one; false when the subscriber
// is closed and its queue drained, or ctx is done.
func (s *subscriber) next(ctx context.Context) (Event, bool) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			e := s.queue[0]
			s.queue[0] = Event{}
			s.queue = s.queue[1:]
			if len(s.queue) == 0 {
				s.queue = nil // release the backing array
			}
			s.mu.Unlock()
			return e, true
		}
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return Event{}, false
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Event{}, false
		}
	}
}

// push queues e; false when the subscriber is too far behind, and then it is
// closed.
func (s *subscriber) push(e Event) bool {
	s.mu.Lock()
	ok := len(s.queue) < watchBuffer
	if ok {
		s.queue = append(s.queue, e)
	} else {
		s.closed = true
	}
	s.mu.Unlock()
	s.signal()
	return ok
}

func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.signal()
}

func (s *subscriber) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

type hub struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
	// events counts what was published, for Agent.Activity.
	events atomic.Uint64
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

func (h *hub) subscribe(f Filter, settled bool) *subscriber {
	s := &subscriber{f: f, wake: make(chan struct{}, 1), settled: settled}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
	s.close()
}

// publish never blocks: a watcher too far behind is dropped.
func (h *hub) publish(e Event) {
	h.events.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if s.settled && !e.Intent.Status.State.Settled() {
			continue
		}
		if s.f.Match(&e.Intent) && !s.push(e) {
			delete(h.subs, s)
		}
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		delete(h.subs, s)
		s.close()
	}
}
