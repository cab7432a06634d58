package actuate

import (
	"testing"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

const mi = 1 << 20

// TestPodResources: the kubelet's pod cgroup (ResourceConfigForPod): the
// CPU requests summed, a limit only when every container has one.
func TestPodResources(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []intent.Resources
		want intent.Resources
	}{
		{"none", nil, intent.Resources{}},
		{"all limited", []intent.Resources{
			{CPURequest: 500, CPULimit: 1000, MemoryRequest: 64 * mi, MemoryLimit: 128 * mi},
			{CPURequest: 250, CPULimit: 500, MemoryLimit: 64 * mi},
		}, intent.Resources{CPURequest: 750, CPULimit: 1500, MemoryLimit: 192 * mi}},
		{"one without a CPU limit", []intent.Resources{
			{CPURequest: 500, CPULimit: 1000, MemoryLimit: 128 * mi},
			{CPURequest: 250, MemoryLimit: 64 * mi},
		}, intent.Resources{CPURequest: 750, MemoryLimit: 192 * mi}},
		{"one without a memory limit", []intent.Resources{
			{CPURequest: 500, CPULimit: 1000, MemoryLimit: 128 * mi},
			{CPURequest: 250, CPULimit: 500},
		}, intent.Resources{CPURequest: 750, CPULimit: 1500}},
	} {
		if got := podResources(tc.in); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestPodFiles: the pod cgroup sums the members and the pod's listed
// containers that are not members (by runtime ID, of the same pod), for
// the resources some member declares.
func TestPodFiles(t *testing.T) {
	x := &Actuator{Period: 100000}
	members := []Member{
		{RuntimeID: "a", Resources: intent.Resources{CPURequest: 1000, CPULimit: 1000, MemoryLimit: 128 * mi}, CPU: true},
		{Resources: intent.Resources{CPURequest: 100, CPULimit: 100, MemoryLimit: 32 * mi}}, // a bare cgroup member
	}
	listed := []cri.Container{
		{ID: "a", PodUID: "u", Resources: cri.Resources{CPUPeriod: 100000, CPUQuota: 900000, CPUShares: 9216}}, // a member: not counted twice
		{ID: "b", PodUID: "u", Resources: cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512, MemoryLimit: 64 * mi}},
		{ID: "c", PodUID: "other", Resources: cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 512}},
	}
	got := x.PodFiles("/pod", "u", members, listed)
	// 1000m + 100m + 500m, weight of 1600m by the kubelet's rule for pod
	// cgroups (shares 1638: 63; runc's container formula would give 145);
	// memory not declared by anyone.
	want := intent.Resources{CPURequest: 1600, CPULimit: 1600}.Cgroup(100000, true, false)
	if got.MemoryMax != nil || *got.CPUMax != *want.CPUMax || *got.CPUWeight != 63 {
		t.Errorf("PodFiles = %v, want %v", got.Values(), want.Values())
	}
	members[1].Memory = true
	if got := x.PodFiles("/pod", "u", members, listed); got.MemoryMax == nil || *got.MemoryMax != 224*mi {
		t.Errorf("with memory declared, memory.max = %v, want %d", got.Values(), 224*mi)
	}
}

// roundingCgroups stores CPU quotas rounded up to 10ms per second, as
// systemd does.
type roundingCgroups struct{ Cgroups }

func (roundingCgroups) Stored(_ string, r cgroup.Resources) cgroup.Resources {
	if r.CPUMax != nil && r.CPUMax.Quota != cgroup.Unlimited {
		c := *r.CPUMax
		step := int64(c.Period) / 100
		c.Quota = (c.Quota + step - 1) / step * step
		r.CPUMax = &c
	}
	return r
}

// TestContainerFilesStored: what the files must hold is what the driver
// will store, so that verification and drift are not fooled by its rounding.
func TestContainerFilesStored(t *testing.T) {
	r := intent.Resources{CPURequest: 15, CPULimit: 15, MemoryLimit: 64 * mi}
	plain := (&Actuator{Period: 100000}).ContainerFiles("/c", r, true, false)
	if plain.CPUMax.Quota != 1500 || plain.MemoryMax != nil {
		t.Errorf("plain: %v", plain.Values())
	}
	rounded := (&Actuator{Cgroups: roundingCgroups{}, Period: 100000}).ContainerFiles("/c", r, true, true)
	if rounded.CPUMax.Quota != 2000 || rounded.MemoryMax == nil || *rounded.MemoryMax != 64*mi {
		t.Errorf("rounded: %v", rounded.Values())
	}
}

// TestCRIMapping: criResources sends what the kubelet sends the runtime,
// and FromRuntime reads it back as the requests and limits it came from.
func TestCRIMapping(t *testing.T) {
	for _, tc := range []struct {
		name     string
		r        intent.Resources
		cpu, mem bool
		want     cri.Resources
		back     intent.Resources // FromRuntime(want)
	}{
		{"limited", intent.Resources{CPURequest: 500, CPULimit: 1000, MemoryRequest: 64 * mi, MemoryLimit: 128 * mi}, true, true,
			cri.Resources{CPUPeriod: 100000, CPUQuota: 100000, CPUShares: 512, MemoryLimit: 128 * mi},
			intent.Resources{CPURequest: 500, CPULimit: 1000, MemoryLimit: 128 * mi}}, // the memory request does not reach the runtime
		{"unlimited", intent.Resources{CPURequest: 250}, true, true,
			cri.Resources{CPUPeriod: 100000, CPUQuota: 0, CPUShares: 256, MemoryLimit: 0}, // the kubelet's 0 for no limit
			intent.Resources{CPURequest: 250}},
		{"no request: the kubelet's floor of 2 shares", intent.Resources{}, true, false,
			cri.Resources{CPUPeriod: 100000, CPUQuota: 0, CPUShares: 2},
			intent.Resources{}},
		{"cpu only: memory left as it is", intent.Resources{CPURequest: 1000, CPULimit: 2000, MemoryLimit: 64 * mi}, true, false,
			cri.Resources{CPUPeriod: 100000, CPUQuota: 200000, CPUShares: 1024},
			intent.Resources{CPURequest: 1000, CPULimit: 2000}},
		{"100m: 102 shares read back as 100m (rounded up)", intent.Resources{CPURequest: 100, CPULimit: 100}, true, false,
			cri.Resources{CPUPeriod: 100000, CPUQuota: 10000, CPUShares: 102},
			intent.Resources{CPURequest: 100, CPULimit: 100}},
		{"memory only: cpu left as it is", intent.Resources{CPURequest: 1000, MemoryLimit: 64 * mi}, false, true,
			cri.Resources{MemoryLimit: 64 * mi},
			intent.Resources{MemoryLimit: 64 * mi}},
	} {
		got := criResources(tc.r, tc.cpu, tc.mem, 100000)
		if got != tc.want {
			t.Errorf("%s: criResources = %+v, want %+v", tc.name, got, tc.want)
		}
		if back := FromRuntime(got); back != tc.back {
			t.Errorf("%s: FromRuntime = %+v, want %+v", tc.name, back, tc.back)
		}
	}
}

// TestRuntimeDiffers: a resource changes for a restart only when what the
// runtime reports for it would change: shares, quota per period, memory
// limit; never the memory request.
func TestRuntimeDiffers(t *testing.T) {
	reported := cri.Resources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 256, MemoryLimit: 128 * mi}
	for _, tc := range []struct {
		name     string
		reported cri.Resources
		want     intent.Resources
		cpu, mem bool
	}{
		{"same", reported, intent.Resources{CPURequest: 250, CPULimit: 500, MemoryRequest: 64 * mi, MemoryLimit: 128 * mi}, false, false},
		{"memory request only", reported, intent.Resources{CPURequest: 250, CPULimit: 500, MemoryRequest: 128 * mi, MemoryLimit: 128 * mi}, false, false},
		{"request up", reported, intent.Resources{CPURequest: 300, CPULimit: 500, MemoryLimit: 128 * mi}, true, false},
		{"limit up", reported, intent.Resources{CPURequest: 250, CPULimit: 600, MemoryLimit: 128 * mi}, true, false},
		{"memory up", reported, intent.Resources{CPURequest: 250, CPULimit: 500, MemoryLimit: 256 * mi}, false, true},
		{"same rate on another period", cri.Resources{CPUPeriod: 50000, CPUQuota: 25000, CPUShares: 256, MemoryLimit: 128 * mi},
			intent.Resources{CPURequest: 250, CPULimit: 500, MemoryLimit: 128 * mi}, false, false},
		{"no limits, -1 or 0 alike", cri.Resources{CPUPeriod: 100000, CPUQuota: -1, CPUShares: 2, MemoryLimit: -1}, intent.Resources{}, false, false},
		{"unset shares are the floor", cri.Resources{}, intent.Resources{}, false, false},
	} {
		cpu, mem := RuntimeDiffers(tc.reported, tc.want, 100000)
		if cpu != tc.cpu || mem != tc.mem {
			t.Errorf("%s: RuntimeDiffers = cpu %v mem %v, want %v %v", tc.name, cpu, mem, tc.cpu, tc.mem)
		}
	}
}
