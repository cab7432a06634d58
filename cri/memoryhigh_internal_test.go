package cri

import "testing"

// TestMemoryHighFromRecord: what the runtime records in the unified map
// (containerd reports its spec's, internal/cri/server/helpers.go).
func TestMemoryHighFromRecord(t *testing.T) {
	for _, tc := range []struct {
		unified map[string]string
		want    int64
	}{
		{nil, 0},
		{map[string]string{"memory.min": "0", "memory.low": "0"}, 0},
		{map[string]string{"memory.high": "max"}, MemoryHighMax},
		{map[string]string{"memory.high": "255012864", "memory.min": "0"}, 255012864},
		{map[string]string{"memory.high": "-5"}, 0},
		{map[string]string{"memory.high": "12k"}, 0},
	} {
		if got := memoryHigh(tc.unified); got != tc.want {
			t.Errorf("%v: %d, want %d", tc.unified, got, tc.want)
		}
	}
}
