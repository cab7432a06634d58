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
