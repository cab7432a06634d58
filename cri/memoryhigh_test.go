package cri_test

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/cri"
	"github.com/resizer/resize-agent/cri/critest"
)

// TestUpdateMemoryHigh: memory.high goes into the update's unified map
// only when asked for, as bytes or "max"; 0 sends no unified map at all.
func TestUpdateMemoryHigh(t *testing.T) {
	var got *runtimeapi.LinuxContainerResources
	r := &critest.Runtime{
		UpdateContainerResourcesFn: func(q *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
			got = q.Linux
			return &runtimeapi.UpdateContainerResourcesResponse{}, nil
		},
	}
	c := dial(t, r)
	for _, tc := range []struct {
		high int64
		want map[string]string
	}{
		{0, nil},
		{48652288, map[string]string{"memory.high": "48652288"}},
		{cri.MemoryHighMax, map[string]string{"memory.high": "max"}},
	} {
		if err := c.Update(context.Background(), "c1", cri.Resources{MemoryLimit: 48 << 20, MemoryHigh: tc.high}); err != nil {
			t.Fatal(err)
		}
		if len(got.Unified) != len(tc.want) || got.Unified["memory.high"] != tc.want["memory.high"] || got.MemoryLimitInBytes != 48<<20 {
			t.Errorf("MemoryHigh %d: sent %+v, want unified %v", tc.high, got, tc.want)
		}
	}
}
