package journal

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
)

// bigRecord is an intent record as the agent writes it: requests and
// limits, a message, and on Completed the files it wrote.
func bigRecord(seq uint64, id, key string, s intent.State) Record {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sp := intent.Spec{ID: id, Target: intent.Target{Name: "web", PodUID: "0a1b2c3d-" + key, PodCgroupPath: "/kubepods/burstable/pod" + key}}
	sp.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	sp.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")}
	r := Record{Seq: seq, Container: "pod:0a1b2c3d-" + key + "/web", Intent: intent.Intent{ID: id, Spec: sp,
		Status: intent.Status{State: s, AcceptedAt: now, UpdatedAt: now, Message: "queued again after an agent restart (was Proposed)"}}}
	if s == intent.Completed {
		r.Intent.Status.CompletedAt = &now
		r.Intent.Status.Via = "runtime"
		r.Intent.Status.Applied = intent.Applied{
			{Cgroup: "/kubepods/burstable/pod" + key, Values: []cgroup.Value{{File: "cpu.max", Data: "100000 100000"}, {File: "memory.max", Data: "536870912"}}},
			{Cgroup: "/kubepods/burstable/pod" + key + "/c1", Values: []cgroup.Value{{File: "cpu.max", Data: "100000 100000"}, {File: "cpu.weight", Data: "10"}, {File: "memory.max", Data: "536870912"}}},
		}
		r.Resources = &Resources{Resources: intent.Resources{CPULimit: 1000, CPURequest: 250, MemoryLimit: 512 << 20, MemoryRequest: 256 << 20}, CPU: true, Memory: true}
	}
	return r
}

// writeBig writes a journal of about size bytes straight to dir: intents
// of 1,000 containers, each Proposed, InProgress and Completed, and one
// intent per container left Proposed at the end.
func writeBig(t testing.TB, dir string, size int64) (intents int) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	var n int64
	put := func(r Record) {
		line, err := encode(r)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(line)
		n += int64(len(line))
	}
	seq := uint64(0)
	for n < size {
		seq++
		id, key := fmt.Sprintf("20260102-030405-%016x", seq), fmt.Sprint(seq%1000)
		for _, s := range []intent.State{intent.Proposed, intent.InProgress, intent.Completed} {
			put(bigRecord(seq, id, key, s))
		}
	}
	for k := range 1000 {
		seq++
		put(bigRecord(seq, fmt.Sprintf("20260102-030405-%016x", seq), fmt.Sprint(k), intent.Proposed))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return int(seq)
}

// peakHeap runs f and returns the most heap it held at once beyond what
// was in use before, sampled every 200 µs.
func peakHeap(f func()) uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	runtime.GC()
	base := read()
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			peak = max(peak, read())
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	f()
	close(stop)
	wg.Wait()
	peak = max(peak, read())
	return peak - min(peak, base)
}

// TestReplayMemory (issue 15, finding 8): replaying a 26 MB journal holds
// a bounded heap, not about ten times the file.
func TestReplayMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes and replays a 26 MB journal")
	}
	dir := t.TempDir()
	size := int64(26 << 20) // the issue's; REPLAY_MB sets another
	if mb, err := strconv.Atoi(os.Getenv("REPLAY_MB")); err == nil && mb > 0 {
		size = int64(mb) << 20
	}
	intents := writeBig(t, dir, size)
	var j *Journal
	var took time.Duration
	peak := peakHeap(func() {
		t0 := time.Now()
		j = open(t, dir)
		took = time.Since(t0)
	})
	defer j.Close()
	rs := j.Records()
	live := 0
	for _, r := range rs {
		if !r.Intent.Status.State.Terminal() {
			live++
		}
	}
	t.Logf("replayed a %d MiB journal of %d intents in %v: peak heap %.1f MiB, %d records returned, %d not terminal",
		size>>20, intents, took, float64(peak)/(1<<20), len(rs), live)
	if live != 1000 {
		t.Errorf("%d intents not terminal after replay, want 1000", live)
	}
	if limit := uint64(64 << 20); peak > limit {
		t.Errorf("replay peaked at %.1f MiB of heap, want at most %d MiB", float64(peak)/(1<<20), limit>>20)
	}
}
