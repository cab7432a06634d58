package actuate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// TestKubeletMemoryHigh: the kubelet's MemoryQoS memory.high, with the
// cases of its TestGenerateContainerConfigWithMemoryQoSEnforced
// (pkg/kubelet/kuberuntime/kuberuntime_container_linux_test.go, 1.37:
// factor 0.9, the host's pages) worked out in bytes.
func TestKubeletMemoryHigh(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		name                string
		request, limit, out int64
	}{
		// floor((128Mi + 0.9 × 128Mi) / 4096) × 4096
		{"Burstable pod (128Mi requests, 256Mi limits) - set memory.high based on limits", 128 * mi, 256 * mi, 255012864},
		{"Guaranteed pod (256Mi requests, 256Mi limits) - skip setting memory.high", 256 * mi, 256 * mi, cri.MemoryHighMax},
		{"Burstable pod (128Mi requests, no limits): node allocatable, unknown to the agent", 128 * mi, 0, 0},
		{"limit without a request: 0.9 of it", 0, 256 * mi, 241590272},
		{"test/node's decrease (32Mi requests, 48Mi limits)", 32 * mi, 48 * mi, 48652288},
		{"at most the request: none", 256*mi - 4096, 256 * mi, cri.MemoryHighMax},
	} {
		if got := KubeletMemoryHigh(tc.request, tc.limit, 4096, 0.9); got != tc.out {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.out)
		}
	}
}

type fakeRuntime struct {
	mu      sync.Mutex
	updates []cri.Resources
}

func (f *fakeRuntime) Update(_ context.Context, _ string, r cri.Resources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.updates = append(f.updates, r)
	return nil
}

func (f *fakeRuntime) Restart(context.Context, string, cri.Resources, time.Duration) (cri.Container, error) {
	panic("not here")
}

// TestRuntimeUpdateSetsKubeletMemoryHigh: a memory update through the
// runtime of a container whose record holds the kubelet's MemoryQoS
// memory.high sends the one for the new limit (else containerd would write
// the old one back with it); of any other container, none.
func TestRuntimeUpdateSetsKubeletMemoryHigh(t *testing.T) {
	const mi = 1 << 20
	for _, qos := range []bool{true, false} {
		cg := &fakeCgroups{
			st:  cgroup.State{CPUMax: cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}, CPUWeight: 100, MemoryMax: 256 * mi, MemoryCurrent: 10 * mi},
			mem: cgroup.Memory{Current: 10 * mi, High: cgroup.Unlimited, Max: 256 * mi},
		}
		rt := &fakeRuntime{}
		x := &Actuator{Cgroups: cg, Runtime: rt, Period: 100000}
		want := intent.Resources{MemoryRequest: 128 * mi, MemoryLimit: 512 * mi}
		x.Do(context.Background(), Job{Want: want, Old: intent.Resources{MemoryRequest: 128 * mi, MemoryLimit: 256 * mi},
			Memory: true, RuntimeID: "c1", KubeletMemoryHigh: qos,
			Container: Level{Path: "/c", Want: x.ContainerFiles("/c", want, false, true)}})
		if len(rt.updates) == 0 {
			t.Fatalf("qos %v: no runtime update", qos)
		}
		u := rt.updates[0]
		wantHigh := int64(0)
		if qos {
			wantHigh = 496603136 // floor((128Mi + 0.9 × 384Mi) / 4096) × 4096
		}
		if u.MemoryLimit != 512*mi || u.MemoryHigh != wantHigh {
			t.Errorf("qos %v: update %+v, want memory limit %d and memory.high %d", qos, u, 512*mi, wantHigh)
		}
	}
}
