package agent

import (
	"sync"

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
		if !f.Match(&e.Intent) {
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
