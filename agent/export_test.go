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
