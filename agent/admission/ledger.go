// Package admission keeps account of the node's allocatable CPU and memory
// and of what every known container has been given, and decides whether a
// resize fits now, later (Deferred) or never (Infeasible), the way the
// kubelet decides for in-place pod resize.
package admission

import (
	"fmt"
	"strings"
	"sync"

	"github.com/resizer/resize-agent/agent/intent"
)

// Capacity is an amount of CPU (millicores) and memory (bytes).
type Capacity struct {
	MilliCPU int64 `json:"milliCPU"`
	Memory   int64 `json:"memoryBytes"`
}

func (c Capacity) sub(o Capacity) Capacity {
	return Capacity{c.MilliCPU - o.MilliCPU, c.Memory - o.Memory}
}

func (c Capacity) add(o Capacity) Capacity {
	return Capacity{c.MilliCPU + o.MilliCPU, c.Memory + o.Memory}
}

// Verdict is the outcome of an admission check.
type Verdict int

const (
	Fit Verdict = iota
	Deferred
	Infeasible
)

// Decision is a Verdict with a message that says how much was asked, how
// much is free and how much is allocatable.
type Decision struct {
	Verdict Verdict
	Message string
}

// Ledger is safe for concurrent use.
type Ledger struct {
	mu          sync.Mutex
	allocatable Capacity
	alloc       map[string]Capacity
	total       Capacity // the sum of alloc, kept so that admission is O(1)
}

// NewLedger returns an empty ledger for a node with this much allocatable.
func NewLedger(allocatable Capacity) *Ledger {
	return &Ledger{allocatable: allocatable, alloc: map[string]Capacity{}}
}

// Reserve admits req for the container key in place of what it holds now.
// On Fit the ledger records req; otherwise nothing changes. A request that
// does not grow either resource always fits, so a shrink is never held up.
func (l *Ledger) Reserve(key string, req Capacity) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.check(key, req)
	if d.Verdict == Fit {
		l.setLocked(key, req)
	}
	return d
}

// Check is Reserve without recording anything.
func (l *Ledger) Check(key string, req Capacity) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.check(key, req)
}

func (l *Ledger) check(key string, req Capacity) Decision {
	cur := l.alloc[key]
	free := l.allocatable.sub(l.allocatedLocked())
	var infeasible, deferred []string
	// The container may grow into what is free plus what it holds already.
	probe := func(name string, asked, held, free, alloc int64, format func(int64) string) {
		if asked <= held {
			return // not growing
		}
		msg := fmt.Sprintf("%s: requested %s, free %s, allocatable %s", name, format(asked), format(max(free, 0)), format(alloc))
		if held > 0 {
			msg += fmt.Sprintf(" (the container holds %s)", format(held))
		}
		switch {
		case asked > alloc:
			infeasible = append(infeasible, msg)
		case asked > free+held:
			deferred = append(deferred, msg)
		}
	}
	probe("cpu", req.MilliCPU, cur.MilliCPU, free.MilliCPU, l.allocatable.MilliCPU, intent.FormatCPU)
	probe("memory", req.Memory, cur.Memory, free.Memory, l.allocatable.Memory, intent.FormatMemory)
	switch {
	case len(infeasible) > 0:
		return Decision{Infeasible, "Node didn't have enough capacity: " + strings.Join(infeasible, "; ")}
	case len(deferred) > 0:
		return Decision{Deferred, "Node didn't have enough resource: " + strings.Join(deferred, "; ")}
	}
	return Decision{Verdict: Fit}
}

// Set records req for key unconditionally (used to restore after a failed
// apply, or to account for a container first seen with its resources).
func (l *Ledger) Set(key string, req Capacity) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setLocked(key, req)
}

func (l *Ledger) setLocked(key string, req Capacity) {
	l.total = l.total.sub(l.alloc[key]).add(req)
	l.alloc[key] = req
}

// Get returns what key holds.
func (l *Ledger) Get(key string) Capacity {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.alloc[key]
}

// Release forgets key.
func (l *Ledger) Release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total = l.total.sub(l.alloc[key])
	delete(l.alloc, key)
}

// Allocatable returns the node's allocatable capacity.
func (l *Ledger) Allocatable() Capacity {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.allocatable
}

// Allocated returns the sum of every container's requests.
func (l *Ledger) Allocated() Capacity {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.allocatedLocked()
}

func (l *Ledger) allocatedLocked() Capacity { return l.total }
