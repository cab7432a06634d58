package agent_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/bpf"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// BenchmarkIdleMinute is a minute of the agent at rest with 1,000 managed
// containers, as the daemon runs it (make bench's "at rest" row, in the
// VM): six drift checks (the sixth a sweep that reads every file) and six
// resyncs, on a clock the benchmark moves. Where the eBPF programs load
// (root, BTF) the drift checks follow the kernel's limit writes through
// them, as on a node; elsewhere through a stand-in that costs no system
// call, which the name says. cpu-%-of-core is the CPU of that minute over a
// minute.
func BenchmarkIdleMinute(b *testing.B) {
	paths := benchPaths(1000)
	root := cgrouptest.FakeTree(b, paths...)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	now := time.Unix(2e9, 0)
	var writes agent.LimitWrites = agenttest.NewWriteMarks(paths...)
	marks := "stand-in"
	if os.Getenv("BENCH_IDLE_BPF") != "0" {
		// Only with the limit-write hook attached (fexit on
		// cgroup_file_write: not on every kernel): without it nothing can
		// be skipped, as the daemon then does not ask.
		if tr, err := bpf.Load(); err == nil {
			b.Cleanup(func() { tr.Close() })
			if tr.TimesLimitWrites() {
				writes, marks = pressure.BPF{T: tr, CG: cg}, "ebpf"
			}
		}
	}
	opts := append(daemonOpts(b), agent.WithClock(func() time.Time { return now }), agent.WithDriftWrites(writes, time.Minute))
	a := agent.New(cg, admission.NewLedger(admission.Capacity{MilliCPU: 1 << 30, Memory: 1 << 50}), opts...)
	b.Cleanup(func() { a.Close(context.Background()) })
	var last string
	for i, p := range paths {
		it, _, err := a.Submit(cpuSpec(i, p, 200))
		if err != nil {
			b.Fatal(err)
		}
		last = it.ID
	}
	if it := settleB(b, a, last); it.Status.State != intent.Completed {
		b.Fatalf("%s: %s", it.ID, it.Status.Message)
	}
	ctx := context.Background()
	minute := func() {
		for range 6 {
			now = now.Add(10 * time.Second)
			a.DriftCheck(ctx)
			a.Resync()
		}
	}
	minute() // the first checks read everything once
	if os.Getenv("BENCH_IDLE_DEBUG") != "" {
		for range 6 {
			now = now.Add(10 * time.Second)
			b.Logf("%+v", a.DriftCheck(ctx))
		}
	}
	b.Run(fmt.Sprintf("marks=%s", marks), func(b *testing.B) {
		cpu0 := cpuTime()
		n := 0
		for b.Loop() {
			minute()
			n++
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n)/float64(time.Minute)*100, "cpu-%-of-core")
	})
}
