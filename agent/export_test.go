package agent

import (
	"testing"
	"time"
)

// SetProbeTimeout shortens the runtime liveness probe for a test.
func SetProbeTimeout(t *testing.T, d time.Duration) {
	old := probeTimeout
	probeTimeout = d
	t.Cleanup(func() { probeTimeout = old })
}

// SharedSpecs is the number of resources sections in the agent's table of
// shared copies.
func (a *Agent) SharedSpecs() int { return a.specs.len() }

// Idle reports whether no managed container has an intent running or
// queued: a settled intent is published before its worker lets go of the
// container, and a drift check passes over a container still held.
func (a *Agent) Idle() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.containers {
		if !idle(c) {
			return false
		}
	}
	return true
}

// FullResync is how many Resyncs there are to one that looks at every
// container.
const FullResync = fullResync
