package latency

import (
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// The cost of the pressure rings with many containers: every container's
// cgroup files read (cpu.stat, PSI, memory.events, through the same reader
// as the daemon's PSI source) once per round, and the memory the rings and
// the tracked pods hold. A round runs every SampleEvery (5 s); with 200
// containers, ns/op divided by 5 s is the share of one CPU it costs.
func BenchmarkSampleRound(b *testing.B) {
	for _, n := range []int{50, 200} {
		b.Run(fmt.Sprintf("containers=%d", n), func(b *testing.B) {
			tr, now := manyContainers(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				now = now.Add(5 * time.Second)
				tr.tick(now)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/5e9*100, "%cpu@5s")
		})
	}
}

// TestRingMemoryBounded: after many rounds the tracker's heap stays what a
// full ring per container costs (the rings do not grow with uptime), and
// that is a few KiB per container.
func TestRingMemoryBounded(t *testing.T) {
	const n = 100
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	base := heap()
	tr, now := manyContainers(t, n)
	for range 8 {
		now = now.Add(5 * time.Second)
		tr.tick(now)
	}
	full := heap()
	for range 16 {
		now = now.Add(5 * time.Second)
		tr.tick(now)
	}
	later := heap()
	per := float64(int64(later)-int64(base)) / n
	t.Logf("heap: %d containers, %.1f KiB each after 24 rounds (%.1f KiB after 8, a full ring)", n, per/1024, float64(int64(full)-int64(base))/n/1024)
	if later > full+n*1024 {
		t.Errorf("heap grew from %d to %d bytes between round 8 and 24: the rings are not bounded", full, later)
	}
	if per > 32*1024 {
		t.Errorf("%.0f bytes per container", per)
	}
	runtime.KeepAlive(tr)
}

func manyContainers(tb testing.TB, n int) (*Tracker, time.Time) {
	root := cgrouptest.FakeTree(tb)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	tr, err := New(Options{NodeName: node, Cgroups: cg, Sources: []pressure.Source{pressure.Files{CG: cg}}, Logger: slog.New(slog.DiscardHandler), MaxContainers: n})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for i := range n {
		u := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		id := fmt.Sprintf("c%06d", i)
		p := testPod(1, small)
		p.UID, p.Name = types.UID(u), fmt.Sprintf("p%d", i)
		p.Status.QOSClass = corev1.PodQOSBurstable
		p.Status.ContainerStatuses[0].ContainerID = "containerd://" + id
		path := candidates(u, corev1.PodQOSBurstable, "containerd://"+id)[1]
		cgrouptest.AddFake(tb, root, path)
		cgrouptest.FakePressure(tb, root, path, uint64(i), 1, 0)
		tr.observe(p, now)
	}
	tr.tick(now)
	return tr, now
}
