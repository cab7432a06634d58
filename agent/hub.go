package agent

import (
	"sync"

	"github.com/resizer/resize-agent/agent/intent"
)

// Event is one change of an intent, as watchers see it.
type Event struct {
	Type   string        `json:"type"` // ADDED or MODIFIED
	Intent intent.Intent `json:"intent"`
}

// Filter selects the events a watcher gets; empty fields match everything.
type Filter struct {
	IntentID  string
	Container string // target name or cgroup path
}

func (f Filter) match(it *intent.Intent) bool {
	if f.IntentID != "" && it.ID != f.IntentID {
		return false
	}
	if f.Container != "" && it.Spec.Target.Name != f.Container && it.Spec.Target.CgroupPath != f.Container {
		return false
	}
	return true
}

// watchBuffer is how many events a watcher may fall behind before it is
// cut off; a client then sees its stream end and can watch again.
const watchBuffer = 256

type hub struct {
	mu   sync.Mutex
	subs map[chan Event]Filter
}

func newHub() *hub { return &hub{subs: map[chan Event]Filter{}} }

func (h *hub) subscribe(f Filter) chan Event {
	ch := make(chan Event, watchBuffer)
	h.mu.Lock()
	h.subs[ch] = f
	h.mu.Unlock()
	return ch
}

func (h *hub) unsubscribe(ch chan Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

// publish never blocks: a watcher whose buffer is full is dropped.
func (h *hub) publish(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch, f := range h.subs {
		if !f.match(&e.Intent) {
			continue
		}
		select {
		case ch <- e:
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		delete(h.subs, ch)
		close(ch)
	}
}
