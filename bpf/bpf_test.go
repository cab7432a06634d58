package bpf

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"go.uber.org/goleak"
)

// withOOMHook forces one of the OOM programs (tests of the fallbacks).
func withOOMHook(prog string) Option {
	return func(o *options) { o.oomHook = prog }
}

func load(t testing.TB, opts ...Option) *Tracker {
	t.Helper()
	tr, err := Load(opts...)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("Load: %+v", ve)
		}
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// (a) Everything loads and attaches, Close tears it down without leaking
// goroutines, and the maps fill up on their own.
func TestLoadAttach(t *testing.T) {
	requireBPF(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	tr, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Logf("kernel %s: %d programs attached, OOM hook %s (program %s)", kernelRelease(), len(tr.links), tr.OOMHook(), tr.oomHook.prog)
	// The limit-write hook is fexit, which this build host's kernel
	// refuses (EPERM) and the VM's loads (TestLimitWriteTimed needs it).
	want := len(schedPrograms) + len(reclaimPrograms) + 1
	if tr.TimesLimitWrites() {
		want++
	}
	t.Logf("limit-write hook attached: %v", tr.TimesLimitWrites())
	if len(tr.links) != want {
		t.Errorf("%d links, want %d", len(tr.links), want)
	}

	// Something runs on this machine: some cgroup gets samples.
	deadline := time.Now().Add(5 * time.Second)
	var all map[uint64]Stats
	for {
		runtime.Gosched()
		time.Sleep(20 * time.Millisecond)
		if all, err = tr.All(); err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, s := range all {
			n += s.RunqLatency.Count
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no run-queue latency samples in any cgroup after 5 s")
		}
	}
	for id, s := range all {
		if len(s.RunqLatency.Buckets) != HistogramBuckets {
			t.Errorf("cgroup %d: %d buckets", id, len(s.RunqLatency.Buckets))
		}
		var sum uint64
		for _, c := range s.RunqLatency.Buckets {
			sum += c
		}
		if sum != s.RunqLatency.Count {
			t.Errorf("cgroup %d: buckets add up to %d, count %d", id, sum, s.RunqLatency.Count)
		}
		one, err := tr.Stats(id)
		if err != nil {
			t.Fatal(err)
		}
		if one.RunqLatency.Count < s.RunqLatency.Count {
			t.Errorf("cgroup %d: Stats count %d < All count %d", id, one.RunqLatency.Count, s.RunqLatency.Count)
		}
		t.Logf("cgroup %d: %s", id, describe(s.RunqLatency))
	}
	if s, err := tr.Stats(math.MaxUint64); err != nil || s.RunqLatency.Count != 0 || len(s.RunqLatency.Buckets) != HistogramBuckets {
		t.Errorf("Stats of an unknown cgroup = %+v, %v; want zero stats", s, err)
	}

	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := <-tr.OOMEvents(); ok {
		t.Error("OOMEvents channel not closed by Close")
	}
	if _, err := tr.Stats(1); err == nil {
		t.Error("Stats after Close: no error")
	}
	tr.Forget(1) // no-op, no panic
}

// (b) CPU burners in one cgroup, more runnable threads than CPUs: their
// run-queue latency is attributed to that cgroup's id, not to an idle
// cgroup's. The sum is checked against the kernel's own run-delay
// accounting (/proc/PID/task/TID/schedstat) of the same threads, read
// while the burners are stopped (SIGSTOP): a wait is counted by the
// kernel at the task's switch-in and by the program at its next
// switch-out, and with waits of tens of ms on a loaded machine, reading
// both while they run differs by several percent at the edges.
func TestRunqLatencyByCgroup(t *testing.T) {
	requireBPF(t)
	root := cgroup2Mount(t)
	busy := newCgroup(t, root, "busy")
	idle := newCgroup(t, root, "idle")
	if busy.id == idle.id || busy.id == 0 {
		t.Fatalf("cgroup ids %d, %d", busy.id, idle.id)
	}
	tr := load(t)

	startHelper(t, idle, "idle")
	// Let it start up and fall asleep: until its cgroup sees no run-queue
	// wait for 300 ms. A fixed 300 ms was too short on a loaded host (CI,
	// beside a VM and builds): the helper's start-up (the Go runtime's
	// init, its first GC) still ran in the window, and its waits counted
	// against the idle cgroup.
	quiet := time.Now().Add(10 * time.Second)
	for last := ^uint64(0); ; time.Sleep(300 * time.Millisecond) {
		st, err := tr.Stats(idle.id)
		if err != nil {
			t.Fatal(err)
		}
		if st.RunqLatency.Count == last || time.Now().After(quiet) {
			break
		}
		last = st.RunqLatency.Count
	}

	n := runtime.NumCPU() + 2
	var pids []int
	for i := 0; i < n; i++ {
		pids = append(pids, startHelper(t, busy, "burn").Process.Pid)
	}
	time.Sleep(300 * time.Millisecond)

	stopAll(t, pids)
	busy0, err := tr.Stats(busy.id)
	if err != nil {
		t.Fatal(err)
	}
	idle0, _ := tr.Stats(idle.id)
	delay0, haveDelay := runDelay(pids)
	contAll(t, pids)
	time.Sleep(2 * time.Second)
	stopAll(t, pids)
	busy1, _ := tr.Stats(busy.id)
	idle1, _ := tr.Stats(idle.id)
	delay1, _ := runDelay(pids)
	contAll(t, pids)

	b, i := sub(busy1, busy0), sub(idle1, idle0)
	t.Logf("%d burners on %d CPUs, 2 s: busy cgroup %d: %s", n, runtime.NumCPU(), busy.id, describe(b.RunqLatency))
	t.Logf("idle cgroup %d: %s", idle.id, describe(i.RunqLatency))
	if b.RunqLatency.Count < 100 {
		t.Errorf("busy cgroup: %d samples in 2 s, want >= 100", b.RunqLatency.Count)
	}
	if b.RunqLatency.Mean() < 100*time.Microsecond {
		t.Errorf("busy cgroup: mean run-queue latency %v with %d burners on %d CPUs, want >= 100µs", b.RunqLatency.Mean(), n, runtime.NumCPU())
	}
	if i.RunqLatency.Count*100 > b.RunqLatency.Count {
		t.Errorf("idle cgroup got %d samples, busy %d: busy samples leak into other cgroups?", i.RunqLatency.Count, b.RunqLatency.Count)
	}
	if haveDelay {
		kernel := delay1 - delay0
		ratio := float64(b.RunqLatency.Sum) / float64(kernel)
		t.Logf("run-queue wait of the burners: BPF sum %v, kernel schedstat %v (ratio %.3f)", b.RunqLatency.Sum, kernel, ratio)
		if ratio < 0.98 || ratio > 1.02 {
			t.Errorf("BPF sum %v vs kernel run delay %v: ratio %.3f outside [0.98, 1.02]", b.RunqLatency.Sum, kernel, ratio)
		}
	}

	all, err := tr.All()
	if err != nil {
		t.Fatal(err)
	}
	if all[busy.id].RunqLatency.Count < busy1.RunqLatency.Count {
		t.Errorf("All()[busy] count %d < Stats count %d", all[busy.id].RunqLatency.Count, busy1.RunqLatency.Count)
	}

	// Forget: once the cgroup is empty its entries go and stay gone.
	removeCgroup(t, busy.path)
	time.Sleep(100 * time.Millisecond) // exiting burners' last switches
	tr.Forget(busy.id)
	if s, _ := tr.Stats(busy.id); s.RunqLatency.Count != 0 {
		t.Errorf("after Forget: %d samples", s.RunqLatency.Count)
	}
	if all, _ := tr.All(); all != nil {
		if _, ok := all[busy.id]; ok {
			t.Error("after Forget: cgroup still in All()")
		}
	}
}

// (c) A burner throttled by cpu.max waits most of each period: its
// run-queue latency rises far above an unthrottled burner's. The two run
// one after the other, so that on a machine with one CPU they do not
// compete with each other.
func TestCPUMaxRaisesRunqLatency(t *testing.T) {
	root := requireCgroup2Limits(t)
	throttled := newCgroup(t, root, "throttled")
	free := newCgroup(t, root, "free")
	throttled.write(t, "cpu.max", "10000 100000")
	tr := load(t)

	burn := func(cg testCgroup) Histogram {
		cmd := startShellBurner(t, cg)
		time.Sleep(300 * time.Millisecond)
		s0, err := tr.Stats(cg.id)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond)
		s1, err := tr.Stats(cg.id)
		if err != nil {
			t.Fatal(err)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return sub(s1, s0).RunqLatency
	}
	fr := burn(free)
	th := burn(throttled)

	t.Logf("cpu.max 10000 100000: %s", describe(th))
	t.Logf("cpu.max max:          %s", describe(fr))
	t.Logf("throttled: p50 %v, mean %v; unthrottled: p50 %v, mean %v", th.Quantile(0.5), th.Mean(), fr.Quantile(0.5), fr.Mean())
	t.Logf("cpu.stat of the throttled cgroup: %s", strings.Join(strings.Fields(throttled.read(t, "cpu.stat")), " "))
	if th.Count < 10 {
		t.Fatalf("throttled cgroup: %d samples in 2.5 s, want >= 10", th.Count)
	}
	if th.Mean() < 10*time.Millisecond {
		t.Errorf("throttled mean %v, want >= 10ms (90 ms of every 100 ms throttled)", th.Mean())
	}
	if th.Mean() < 10*fr.Mean() {
		t.Errorf("throttled mean %v not well above unthrottled mean %v", th.Mean(), fr.Mean())
	}
	if th.Quantile(0.5) < 10*fr.Quantile(0.5) {
		t.Errorf("throttled p50 %v not well above unthrottled p50 %v", th.Quantile(0.5), fr.Quantile(0.5))
	}
}

// (c) A process allocating past memory.max reclaims, then is OOM-killed;
// kill count, ring buffer event and reclaim stall are all attributed to
// its cgroup.
func TestOOMKillAttributed(t *testing.T) {
	root := requireCgroup2Limits(t)
	tr := load(t)
	t.Logf("OOM hook: %s", tr.OOMHook())
	testOOMKill(t, tr, root)
}

// The fallback OOM hooks (fentry), where the kernel has them and allows
// BPF trampolines.
func TestOOMHookFallbacks(t *testing.T) {
	root := requireCgroup2Limits(t)
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range oomHooks[1:] {
		t.Run(h.prog, func(t *testing.T) {
			if !h.usable(kernel) {
				t.Skipf("kernel BTF has no %s", h.target)
			}
			tr, err := Load(withOOMHook(h.prog))
			if errors.Is(err, ErrNotSupported) || errors.Is(err, os.ErrPermission) {
				// e.g. a kernel that refuses BPF trampolines (fentry)
				t.Skipf("fallback hook %s on %s does not load here: %v", h.prog, h.target, err)
			}
			if err != nil {
				t.Fatalf("fallback hook %s on %s: %v", h.prog, h.target, err)
			}
			defer tr.Close()
			testOOMKill(t, tr, root)
		})
	}
}

func testOOMKill(t *testing.T, tr *Tracker, root string) {
	cg := newCgroup(t, root, "oom")
	cg.write(t, "memory.max", fmt.Sprint(64<<20))
	if _, err := os.Stat(cg.path + "/memory.swap.max"); err == nil {
		cg.write(t, "memory.swap.max", "0")
	}
	other := newCgroup(t, root, "bystander")

	cmd := startHelper(t, cg, "alloc", "RESIZE_AGENT_BPF_TEST_MIB=200")
	pid := cmd.Process.Pid
	err := cmd.Wait()
	if err == nil {
		t.Fatal("the 200 MiB allocator in a 64 MiB cgroup exited normally")
	}
	t.Logf("allocator pid %d in cgroup %d: %v; memory.events: %s", pid, cg.id, err, strings.Join(strings.Fields(cg.read(t, "memory.events")), " "))

	var ev OOMEvent
	timeout := time.After(10 * time.Second)
wait:
	for {
		select {
		case e, ok := <-tr.OOMEvents():
			if !ok {
				t.Fatal("OOMEvents closed")
			}
			t.Logf("OOM event: %+v", e)
			if e.CgroupID == cg.id {
				ev = e
				break wait
			}
		case <-timeout:
			t.Fatal("no OOM event for the cgroup within 10 s")
		}
	}
	if ev.PID != pid {
		t.Errorf("event PID %d, want the allocator %d", ev.PID, pid)
	}
	if ev.Comm == "" {
		t.Error("event without comm")
	}
	if d := time.Since(ev.Time); d < 0 || d > time.Minute {
		t.Errorf("event time %v is %v from now", ev.Time, d)
	}

	s, err := tr.Stats(cg.id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup %d: OOM kills %d, reclaim stall %v in %d reclaims, run queue %s", cg.id, s.OOMKills, s.ReclaimStall, s.Reclaims, describe(s.RunqLatency))
	if s.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want >= 1", s.OOMKills)
	}
	if s.ReclaimStall <= 0 || s.Reclaims == 0 {
		t.Errorf("reclaim stall %v in %d reclaims, want > 0", s.ReclaimStall, s.Reclaims)
	}
	if o, _ := tr.Stats(other.id); o.OOMKills != 0 || o.Reclaims != 0 {
		t.Errorf("bystander cgroup got %d OOM kills, %d reclaims", o.OOMKills, o.Reclaims)
	}
}

// A Load that fails part way closes what it opened: no file descriptors
// (programs, maps, links) or goroutines are left behind.
func TestLoadFailsCleanly(t *testing.T) {
	requireBPF(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	// Warm up what stays open for the process's lifetime (kernel BTF
	// cache, feature probes).
	if tr, err := Load(); err != nil {
		t.Fatal(err)
	} else {
		tr.Close()
	}
	before := countFDs()
	injected := errors.New("injected")
	attached := 0
	_, err := Load(func(o *options) {
		o.beforeAttach = func(string) error {
			if attached == 3 {
				return injected
			}
			attached++
			return nil
		}
	})
	if !errors.Is(err, injected) {
		t.Fatalf("Load = %v, want the injected error", err)
	}
	if after := countFDs(); after != before {
		t.Errorf("%d open files before the failed Load, %d after", before, after)
	}
}

func TestErrNotSupported(t *testing.T) {
	err := classify("x", fmt.Errorf("wrapped: %w", ebpf.ErrNotSupported))
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, ebpf.ErrNotSupported) {
		t.Errorf("%v: does not match both ErrNotSupported", err)
	}
	if err := classify("x", btf.ErrNotFound); !errors.Is(err, ErrNotSupported) {
		t.Errorf("%v: missing attach target does not match ErrNotSupported", err)
	}
	if err := classify("x", os.ErrPermission); errors.Is(err, ErrNotSupported) {
		t.Errorf("%v: permission error matches ErrNotSupported", err)
	}
}

// Forget of a cgroup that still has tasks frees its histogram slot and the
// cgroup gets a new one on its next events (counting from zero again);
// every slot stays either in use by exactly one cgroup or free, never
// both and never lost.
func TestForgetFreesSlot(t *testing.T) {
	requireBPF(t)
	root := cgroup2Mount(t)
	busy := newCgroup(t, root, "forget")
	const slots = 256
	tr := load(t, WithMaxCgroups(slots))
	startHelper(t, busy, "burn")
	startHelper(t, busy, "burn")
	startHelper(t, busy, "burn")

	waitSamples := func(min uint64) Stats {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			s, err := tr.Stats(busy.id)
			if err != nil {
				t.Fatal(err)
			}
			if s.RunqLatency.Count >= min {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("cgroup %d: %d samples after 5 s, want >= %d", busy.id, s.RunqLatency.Count, min)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	before := waitSamples(200)
	var slot0 uint32
	if err := tr.runqSlots.Lookup(busy.id, &slot0); err != nil {
		t.Fatalf("no slot for the busy cgroup: %v", err)
	}
	tr.Forget(busy.id)
	after, err := tr.Stats(busy.id)
	if err != nil {
		t.Fatal(err)
	}
	if after.RunqLatency.Count >= before.RunqLatency.Count {
		t.Errorf("right after Forget %d samples, before %d: not counting afresh", after.RunqLatency.Count, before.RunqLatency.Count)
	}
	after = waitSamples(after.RunqLatency.Count + 1)
	var slot1 uint32
	if err := tr.runqSlots.Lookup(busy.id, &slot1); err != nil {
		t.Fatalf("no new slot after Forget: %v", err)
	}
	t.Logf("slot %d with %d samples, after Forget slot %d with %d", slot0, before.RunqLatency.Count, slot1, after.RunqLatency.Count)
	if slot1 == slot0 {
		t.Errorf("slot %d reused at once: the queue of free slots is FIFO", slot0)
	}

	// Detach, then account for every slot.
	for _, l := range tr.links {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	tr.links = nil

	// A CPU's copy of the slot that still holds another (forgotten)
	// cgroup's counts is not read as this cgroup's.
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	copies := make([]pressureRunqHist, ncpu)
	for i := range copies {
		copies[i].CgroupId, copies[i].Count, copies[i].Slots[0] = busy.id, 5, 5
	}
	copies[0].CgroupId = busy.id + 1000
	if err := tr.runqLat.Update(slot1, copies, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if s, err := tr.Stats(busy.id); err != nil || s.RunqLatency.Count != uint64(5*(ncpu-1)) {
		t.Errorf("Stats with one foreign CPU copy of %d: count %d (%v), want %d", ncpu, s.RunqLatency.Count, err, 5*(ncpu-1))
	}

	owner := map[uint32]uint64{}
	var id uint64
	var slot uint32
	for it := tr.runqSlots.Iterate(); it.Next(&id, &slot); {
		if o, dup := owner[slot]; dup {
			t.Errorf("slot %d held by cgroups %d and %d", slot, o, id)
		}
		owner[slot] = id
	}
	free := map[uint32]bool{}
	for tr.runqFree.LookupAndDelete(nil, &slot) == nil {
		if free[slot] {
			t.Errorf("slot %d twice in the free queue", slot)
		}
		if o, used := owner[slot]; used {
			t.Errorf("slot %d both free and held by cgroup %d", slot, o)
		}
		free[slot] = true
	}
	if len(owner)+len(free) != slots {
		t.Errorf("%d slots in use + %d free != %d", len(owner), len(free), slots)
	}
	if !free[slot0] {
		t.Errorf("the forgotten slot %d is not free", slot0)
	}
}

// With run-time statistics on, every attached program reports its runs
// and run time; the scheduler program runs on this machine's switches.
func TestProgramStats(t *testing.T) {
	requireBPF(t)
	st, err := EnableRunTimeStats()
	if err != nil {
		t.Fatalf("EnableRunTimeStats: %v", err)
	}
	defer st.Close()
	tr := load(t)
	pingPong(t, 1, 2000)
	ps, err := tr.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != len(tr.links) {
		t.Errorf("%d program stats for %d attached programs", len(ps), len(tr.links))
	}
	found := false
	for _, p := range ps {
		t.Logf("%s: %d runs, %v, %d misses", p.Name, p.Runs, p.RunTime, p.Misses)
		if p.Name == pressureProgOnSchedSwitch {
			found = true
			if p.Runs < 2000 || p.RunTime <= 0 {
				t.Errorf("%s: %d runs, %v after 2000 round trips", p.Name, p.Runs, p.RunTime)
			}
		}
	}
	if !found {
		t.Errorf("no stats for %s", pressureProgOnSchedSwitch)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.ProgramStats(); err == nil {
		t.Error("ProgramStats after Close: no error")
	}
}

// The kernel's time of a successful write to cpu.max, cpu.weight or
// memory.max, by whoever wrote it (the latency tracker's cgroup phase: its
// own reads ran seconds late on a node short of CPU). Other files and
// failed writes leave it alone.
func TestLimitWriteTimed(t *testing.T) {
	root := requireCgroup2Limits(t)
	cg := newCgroup(t, root, "writes")
	tr := load(t)
	if !tr.TimesLimitWrites() {
		t.Fatalf("kernel %s: the limit-write hook (fexit/cgroup_file_write) did not load or attach", kernelRelease())
	}
	if _, ok, err := tr.LastLimitWrite(cg.id); err != nil || ok {
		t.Fatalf("before any write: %v, %v", ok, err)
	}
	// bpf_ktime_get_ns turned into wall time by the clocks' offset:
	// allow a little either way.
	within := func(what string, at, before, after time.Time) {
		t.Helper()
		if at.Before(before.Add(-5*time.Millisecond)) || at.After(after.Add(5*time.Millisecond)) {
			t.Errorf("%s: timed %v, want between %v and %v", what, at.Format(time.StampMicro), before.Format(time.StampMicro), after.Format(time.StampMicro))
		}
	}
	for _, f := range []struct{ file, value string }{{"cpu.max", "50000 100000"}, {"cpu.weight", "50"}, {"memory.max", "104857600"}, {"cpu.weight.nice", "5"}, {"memory.high", "52428800"}} {
		time.Sleep(20 * time.Millisecond)
		before := time.Now()
		cg.write(t, f.file, f.value)
		after := time.Now()
		at, ok, err := tr.LastLimitWrite(cg.id)
		if err != nil || !ok {
			t.Fatalf("after writing %s: %v, %v", f.file, ok, err)
		}
		within(f.file, at, before, after)
		// The last write to any cgroup is this one.
		own, _, _ := tr.LimitWriteStamp(cg.id)
		if any, ok, err := tr.AnyLimitWriteStamp(); err != nil || !ok || any != own {
			t.Errorf("after writing %s: the last write anywhere %d (%v, %v), want this cgroup's %d", f.file, any, ok, err, own)
		}
	}
	// The kernel's stamps, not wall times: those are turned from the
	// monotonic clock by the clocks' offset read anew each time, which a
	// guest's clock adjustment moved by 21 ms between two reads (CI).
	last, _, _ := tr.LimitWriteStamp(cg.id)
	anyLast, _, _ := tr.AnyLimitWriteStamp()
	time.Sleep(20 * time.Millisecond)
	cg.write(t, "memory.low", "0")
	if ns, _, _ := tr.LimitWriteStamp(cg.id); ns != last {
		t.Errorf("a memory.low write moved the stamp from %d to %d", last, ns)
	}
	if err := os.WriteFile(cg.path+"/cpu.max", []byte("nonsense"), 0); err == nil {
		t.Fatal("the kernel took cpu.max nonsense")
	}
	if ns, _, _ := tr.LimitWriteStamp(cg.id); ns != last {
		t.Errorf("a failed cpu.max write moved the stamp from %d to %d", last, ns)
	}
	if any, _, _ := tr.AnyLimitWriteStamp(); any != anyLast {
		t.Errorf("memory.low and a failed cpu.max write moved the last write anywhere from %d to %d", anyLast, any)
	}
}
