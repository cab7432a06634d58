package bpf

import (
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// pingPong runs rounds round trips of one byte over a pair of blocking
// pipes between two OS threads, for each of pairs pairs at once: every
// round trip is two blocking reads, i.e. two wakeups and context switches.
func pingPong(tb testing.TB, pairs, rounds int) {
	var wg sync.WaitGroup
	for p := 0; p < pairs; p++ {
		var ab, ba [2]int
		if err := unix.Pipe2(ab[:], unix.O_CLOEXEC); err != nil {
			tb.Fatal(err)
		}
		if err := unix.Pipe2(ba[:], unix.O_CLOEXEC); err != nil {
			tb.Fatal(err)
		}
		side := func(in, out int, first bool) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			buf := []byte{0}
			for i := 0; i < rounds; i++ {
				if first {
					_, _ = unix.Write(out, buf)
					_, _ = unix.Read(in, buf)
				} else {
					_, _ = unix.Read(in, buf)
					_, _ = unix.Write(out, buf)
				}
			}
		}
		wg.Add(2)
		go side(ba[0], ab[1], true)
		go side(ab[0], ba[1], false)
		defer func() {
			for _, fd := range []int{ab[0], ab[1], ba[0], ba[1]} {
				_ = unix.Close(fd)
			}
		}()
	}
	wg.Wait()
}

// sample is what one run of the workload cost.
type sample struct {
	wall   time.Duration
	cpu    time.Duration // this process, user + system (getrusage)
	ctxsw  int64         // this process's context switches, voluntary + involuntary
	rounds int
}

func (s *sample) add(o sample) {
	s.wall += o.wall
	s.cpu += o.cpu
	s.ctxsw += o.ctxsw
	s.rounds += o.rounds
}

func rusage(tb testing.TB) unix.Rusage {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return ru
}

func measure(tb testing.TB, pairs, rounds int) sample {
	r0 := rusage(tb)
	t0 := time.Now()
	pingPong(tb, pairs, rounds)
	wall := time.Since(t0)
	r1 := rusage(tb)
	cpu := func(ru unix.Rusage) time.Duration {
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return sample{
		wall:   wall,
		cpu:    cpu(r1) - cpu(r0),
		ctxsw:  (r1.Nvcsw + r1.Nivcsw) - (r0.Nvcsw + r0.Nivcsw),
		rounds: rounds * pairs,
	}
}

// BenchmarkSchedOverhead measures, in one run, a scheduler-heavy workload
// (NumCPU pairs of OS threads ping-ponging over pipes) without the programs
// and with them loaded and attached, in five rounds (base first in even
// rounds, BPF first in odd ones, so that drift cancels), and reports what
// the programs add:
//
//	ns/event       CPU time (this process, getrusage) added per context
//	               switch of the workload, over all rounds; each switch
//	               covers one sched_switch program run (the log line
//	               has the per-round values and their median)
//	wall-ns/event  the same from wall-clock time x NumCPU
//	cpu%-base, cpu%-bpf  the workload's CPU share of the machine
//	ctxsw/s-base, ctxsw/s-bpf  context switches per second
//
// The programs' own run time per invocation is BenchmarkProgramCost's.
//
// b.N is the number of round trips per pair and phase:
//
//	go test -run '^$' -bench SchedOverhead -benchtime 100000x ./bpf
func BenchmarkSchedOverhead(b *testing.B) {
	requireBPF(b)
	pairs := runtime.NumCPU()
	ncpu := float64(runtime.NumCPU())
	// Enough Ps that the Go runtime never has to hand off the P of a
	// thread blocked in read(2): the switches are the kernel's, not the
	// runtime's.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2*pairs + 2))
	pingPong(b, pairs, 1000) // warm up: threads, pipes, page faults

	withTracker := func() sample {
		b.StopTimer()
		tr, err := Load()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		s := measure(b, pairs, b.N)
		b.StopTimer()
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return s
	}
	perSwitch := func(d time.Duration, s sample) float64 {
		return float64(d.Nanoseconds()) / float64(s.ctxsw)
	}

	const rounds = 5
	var base, withBPF sample
	var cpuAdded, wallAdded []float64
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		var sb, sp sample
		if r%2 == 0 {
			sb = measure(b, pairs, b.N)
			sp = withTracker()
		} else {
			sp = withTracker()
			sb = measure(b, pairs, b.N)
		}
		base.add(sb)
		withBPF.add(sp)
		cpuAdded = append(cpuAdded, perSwitch(sp.cpu, sp)-perSwitch(sb.cpu, sb))
		wallAdded = append(wallAdded, (perSwitch(sp.wall, sp)-perSwitch(sb.wall, sb))*ncpu)
	}
	b.StopTimer()

	share := func(s sample) float64 { return 100 * float64(s.cpu) / (float64(s.wall) * ncpu) }
	rate := func(s sample) float64 { return float64(s.ctxsw) / s.wall.Seconds() }
	b.ReportMetric(perSwitch(withBPF.cpu, withBPF)-perSwitch(base.cpu, base), "ns/event")
	b.ReportMetric((perSwitch(withBPF.wall, withBPF)-perSwitch(base.wall, base))*ncpu, "wall-ns/event")
	b.ReportMetric(share(base), "cpu%-base")
	b.ReportMetric(share(withBPF), "cpu%-bpf")
	b.ReportMetric(rate(base), "ctxsw/s-base")
	b.ReportMetric(rate(withBPF), "ctxsw/s-bpf")
	b.Logf("%d pairs, %d round trips per pair and phase, %d rounds: base %v wall, %v CPU, %d switches (%.0f CPU ns/switch); with BPF %v wall, %v CPU, %d switches (%.0f CPU ns/switch); CPU ns added per switch by round %.0f (median %.0f), wall x NumCPU %.0f (median %.0f)",
		pairs, b.N, rounds, base.wall, base.cpu, base.ctxsw, perSwitch(base.cpu, base),
		withBPF.wall, withBPF.cpu, withBPF.ctxsw, perSwitch(withBPF.cpu, withBPF),
		cpuAdded, median(cpuAdded), wallAdded, median(wallAdded))
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// progCost is one program's BPF run-time statistics over an interval.
type progCost struct {
	runs uint64
	ns   time.Duration
}

func (c progCost) perRun() float64 {
	if c.runs == 0 {
		return 0
	}
	return float64(c.ns.Nanoseconds()) / float64(c.runs)
}

func progStats(tb testing.TB, p *ebpf.Program) progCost {
	tb.Helper()
	st, err := p.Stats()
	if err != nil {
		tb.Fatal(err)
	}
	return progCost{runs: st.RunCount, ns: st.Runtime}
}

// emptyProgram loads and attaches a tp_btf program that does nothing, the
// floor a program on that hook cannot go below.
func emptyProgram(tb testing.TB, tp string) (*ebpf.Program, func()) {
	tb.Helper()
	return tracingProgram(tb, tp, "empty", asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()})
}

// clockProgram reads the clock twice and does nothing else: about what
// BPF run-time statistics add to every program run (two sched_clock
// reads; bpf_ktime_get_ns reads the monotonic clock, a cousin).
func clockProgram(tb testing.TB, tp string) (*ebpf.Program, func()) {
	tb.Helper()
	return tracingProgram(tb, tp, "clock2", asm.Instructions{
		asm.FnKtimeGetNs.Call(),
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	})
}

func tracingProgram(tb testing.TB, tp, name string, insns asm.Instructions) (*ebpf.Program, func()) {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         name,
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceRawTp,
		AttachTo:     tp,
		License:      "Dual MIT/GPL",
		Instructions: insns,
	})
	if err != nil {
		tb.Fatalf("%s program on %s: %v", name, tp, err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		prog.Close()
		tb.Fatalf("attaching the %s program on %s: %v", name, tp, err)
	}
	return prog, func() { l.Close(); prog.Close() }
}

// maxAddedNs is what a scheduler program may cost per run above an empty
// program on the same hook (issue 16).
const maxAddedNs = 100

// BenchmarkProgramCost measures the scheduler programs' own run time per
// invocation with the kernel's BPF statistics (BPF_ENABLE_STATS:
// run_time_ns / run_cnt of each program), against an empty tp_btf program
// attached to the same tracepoint in the same run, under a scheduler-heavy
// workload (4 x NumCPU pairs of OS threads ping-ponging over pipes). The
// empty program is attached before the Tracker in even rounds and after it
// in odd ones, so that neither always runs first on a cold cache line. It
// fails when a program costs more than maxAddedNs above the empty one
// (the median over the rounds); a hook the Tracker no longer uses costs 0.
// b.N is the number of round trips per pair and round (at least 10000):
//
//	go test -run '^$' -bench ProgramCost -benchtime 50000x ./bpf
func BenchmarkProgramCost(b *testing.B) {
	requireBPF(b)
	st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enabling BPF run-time statistics: %v", err)
	}
	defer st.Close()
	// Four pairs per CPU: the CPUs are seldom idle, so nearly every run
	// is a task's switch-out, the program's full path (a switch-out of the
	// idle task returns at once and would flatter the average).
	pairs := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2*pairs + 2))
	pingPong(b, pairs, 1000) // warm up: threads, pipes, page faults

	hooks := []string{"sched_switch", "sched_wakeup"}
	spec, err := loadPressure()
	if err != nil {
		b.Fatal(err)
	}
	tracked := map[string]string{} // hook -> Tracker program on it
	for _, name := range schedPrograms {
		tracked[spec.Programs[name].AttachTo] = name
	}

	// b.N round trips per pair and round, but at least minTrips: the
	// first run of a benchmark has b.N == 1, too few runs to judge.
	const rounds, minTrips = 4, 10000
	trips := max(b.N, minTrips)
	// For scale: what two clock reads cost on this machine, i.e. about
	// what the statistics themselves add to each program run.
	clock, closeClock := clockProgram(b, "sched_switch")
	defer closeClock()
	var clockCost []float64
	added := map[string][]float64{}
	prog := map[string][]float64{}
	empty := map[string][]float64{}
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		b.StopTimer()
		var empties = map[string]*ebpf.Program{}
		var closers []func()
		attachEmpty := func() {
			for _, tp := range hooks {
				p, c := emptyProgram(b, tp)
				empties[tp] = p
				closers = append(closers, c)
			}
		}
		if r%2 == 0 {
			attachEmpty()
		}
		tr, err := Load()
		if err != nil {
			b.Fatal(err)
		}
		if r%2 == 1 {
			attachEmpty()
		}
		clock0 := progStats(b, clock)
		before := map[string][2]progCost{}
		for _, tp := range hooks {
			var c progCost
			if name, ok := tracked[tp]; ok {
				c = progStats(b, tr.coll.Programs[name])
			}
			before[tp] = [2]progCost{c, progStats(b, empties[tp])}
		}
		b.StartTimer()
		pingPong(b, pairs, trips)
		b.StopTimer()
		c := progStats(b, clock)
		c.runs -= clock0.runs
		c.ns -= clock0.ns
		clockCost = append(clockCost, c.perRun())
		for _, tp := range hooks {
			e := progStats(b, empties[tp])
			e.runs -= before[tp][1].runs
			e.ns -= before[tp][1].ns
			var c progCost
			if name, ok := tracked[tp]; ok {
				c = progStats(b, tr.coll.Programs[name])
				c.runs -= before[tp][0].runs
				c.ns -= before[tp][0].ns
			}
			if e.runs == 0 {
				b.Fatalf("the empty program on %s never ran", tp)
			}
			if _, ok := tracked[tp]; ok && c.runs == 0 {
				b.Fatalf("the Tracker's program on %s never ran", tp)
			}
			empty[tp] = append(empty[tp], e.perRun())
			prog[tp] = append(prog[tp], c.perRun())
			// A hook without a program costs nothing, not minus the floor.
			if _, ok := tracked[tp]; ok {
				added[tp] = append(added[tp], c.perRun()-e.perRun())
			} else {
				added[tp] = append(added[tp], 0)
			}
			b.Logf("round %d (empty program %s): %s: %d runs, %.0f ns/run; empty: %d runs, %.0f ns/run",
				r, map[bool]string{true: "first", false: "last"}[r%2 == 0], tp, c.runs, c.perRun(), e.runs, e.perRun())
		}
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
		for _, c := range closers {
			c()
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(median(clockCost), "clock2-ns/run")
	b.Logf("a program reading the clock twice on sched_switch: %.0f ns/run (median; by round %.0f)", median(clockCost), clockCost)
	for _, tp := range hooks {
		short := strings.TrimPrefix(tp, "sched_")
		b.ReportMetric(median(prog[tp]), short+"-ns/run")
		b.ReportMetric(median(empty[tp]), short+"-empty-ns/run")
		b.ReportMetric(median(added[tp]), short+"-added-ns/run")
		b.Logf("%s: program %.0f ns/run, empty %.0f ns/run, added %.0f ns/run (medians of %d rounds; by round %.0f)",
			tp, median(prog[tp]), median(empty[tp]), median(added[tp]), rounds, added[tp])
		if a := median(added[tp]); a > maxAddedNs {
			b.Errorf("%s: the program costs %.0f ns/run above an empty program (%.0f vs %.0f), more than %d", tp, a, median(prog[tp]), median(empty[tp]), maxAddedNs)
		}
	}
}
