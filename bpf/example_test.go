package bpf_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/resizer/resize-agent/bpf"
)

// Load the programs, follow OOM kills, and read one cgroup's pressure.
func Example() {
	tr, err := bpf.Load()
	if errors.Is(err, bpf.ErrNotSupported) {
		log.Printf("no eBPF pressure signals on this kernel: %v", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	go func() {
		// Ends when tr.Close closes the channel.
		for ev := range tr.OOMEvents() {
			log.Printf("OOM kill: pid %d (%s) in cgroup %d at %v", ev.PID, ev.Comm, ev.CgroupID, ev.Time)
		}
	}()

	// A cgroup's id is the inode number of its cgroupfs directory.
	const dir = "/sys/fs/cgroup/kubepods.slice"
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		log.Fatal(err)
	}
	s, err := tr.Stats(st.Ino)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: run-queue latency p50 %v p99 %v (%d samples), reclaim stall %v in %d reclaims, %d OOM kills\n",
		dir, s.RunqLatency.Quantile(0.5), s.RunqLatency.Quantile(0.99), s.RunqLatency.Count,
		s.ReclaimStall, s.Reclaims, s.OOMKills)

	// When the cgroup is removed:
	tr.Forget(st.Ino)
}

// A Prometheus histogram from a run-queue latency histogram.
func ExampleHistogram_Cumulative() {
	desc := prometheus.NewDesc("resize_agent_runq_latency_seconds",
		"Run-queue latency of the cgroup's tasks.", []string{"cgroup"}, nil)
	var h bpf.Histogram // from Tracker.Stats
	m := prometheus.MustNewConstHistogram(desc, h.Count, h.Sum.Seconds(), h.Cumulative(), "/kubepods.slice")
	_ = m
}

func ExampleHistogram_UpperBounds() {
	var h bpf.Histogram
	b := h.UpperBounds()
	fmt.Println(len(b), b[0], b[1], b[2], b[len(b)-2], b[len(b)-1])
	// Output: 26 1e-06 2e-06 4e-06 16.777216 +Inf
}
