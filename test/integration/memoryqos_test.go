package integration_test

import (
	"context"
	"strconv"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// TestCRIMemoryQoSHigh: a container created the way the kubelet creates
// one under MemoryQoS (the unified map with memory.min, memory.low and
// memory.high = floor((request + 0.9 × (limit − request)) / page) × page,
// pkg/kubelet/kuberuntime/kuberuntime_container_linux.go) has its memory
// limit raised, then lowered, through the agent's CRI path. containerd
// merges an update's unified map into its record and runc writes it all
// again, so an update that says nothing of memory.high put the old one
// back: memory.max 512Mi throttled at 243Mi. Now memory.high follows the
// limit as the kubelet would set it, in the kernel and in containerd's
// record. A container created without one keeps memory.high at max.
func TestCRIMemoryQoSHigh(t *testing.T) {
	const mi = 1 << 20
	e := setupCRI(t, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30})
	p := e.runPod(t)
	high := func(req, lim int64) int64 { return int64(float64(req)+float64(lim-req)*0.9) / 4096 * 4096 }
	qos := e.runContainer(t, p, "qos", &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 256 * mi,
		Unified: map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": strconv.FormatInt(high(128*mi, 256*mi), 10)},
	}, "/bin/busybox", "sh", "-c", "trap exit TERM; while :; do sleep 1; done")
	plain := e.runContainer(t, p, "plain", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 256 * mi},
		"/bin/busybox", "sh", "-c", "trap exit TERM; while :; do sleep 1; done")
	qcg, pcg := e.cgroupOf(t, qos), e.cgroupOf(t, plain)
	if got := cgrouptest.ReadFile(t, e.mnt, qcg, "memory.high"); got != strconv.FormatInt(high(128*mi, 256*mi), 10) {
		t.Fatalf("created with memory.high %s, want the kubelet's %d", got, high(128*mi, 256*mi))
	}
	for _, lim := range []int64{512 * mi, 192 * mi} {
		l := strconv.FormatInt(lim/mi, 10) + "Mi"
		for _, name := range []string{"qos", "plain"} {
			it := e.resize(t, p, name, res{"memory": "128Mi"}, res{"memory": l}, nil)
			mustState(t, it, intent.Completed)
		}
		want := strconv.FormatInt(high(128*mi, lim), 10)
		if got := cgrouptest.ReadFile(t, e.mnt, qcg, "memory.max"); got != strconv.FormatInt(lim, 10) {
			t.Errorf("limit %s: memory.max %s", l, got)
		}
		if got := cgrouptest.ReadFile(t, e.mnt, qcg, "memory.high"); got != want {
			t.Errorf("limit %s: memory.high %s, want %s (the kubelet's for the new limit; the old one was %d)", l, got, want, high(128*mi, 256*mi))
		}
		st, err := e.CRI.Get(context.Background(), qos.ID)
		if err != nil || strconv.FormatInt(st.Resources.MemoryHigh, 10) != want {
			t.Errorf("limit %s: containerd's record memory.high %d (%v), want %s", l, st.Resources.MemoryHigh, err, want)
		}
		if got := cgrouptest.ReadFile(t, e.mnt, pcg, "memory.high"); got != "max" {
			t.Errorf("limit %s: memory.high %s of a container without MemoryQoS, want max", l, got)
		}
	}
	e.sameContainer(t, qos)

	// Before: an update without memory.high, as the agent sent it, leaves
	// the raised memory.max throttled at the old memory.high.
	old := e.runContainer(t, p, "old", &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 256 * mi,
		Unified: map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": strconv.FormatInt(high(128*mi, 256*mi), 10)},
	}, "/bin/busybox", "sh", "-c", "trap exit TERM; while :; do sleep 1; done")
	if err := e.CRI.Update(context.Background(), old.ID, cri.Resources{MemoryLimit: 512 * mi}); err != nil {
		t.Fatal(err)
	}
	ocg := e.cgroupOf(t, old)
	t.Logf("an update without memory.high: memory.max %s, memory.high %s",
		cgrouptest.ReadFile(t, e.mnt, ocg, "memory.max"), cgrouptest.ReadFile(t, e.mnt, ocg, "memory.high"))
	if got := cgrouptest.ReadFile(t, e.mnt, ocg, "memory.high"); got != strconv.FormatInt(high(128*mi, 256*mi), 10) {
		t.Errorf("an update without memory.high left memory.high %s: containerd no longer writes its recorded one back?", got)
	}
}
