package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Stats are one cgroup's pressure counters since the Tracker was loaded (or
// since the cgroup's first event).
type Stats struct {
	// RunqLatency is the run-queue latency of the cgroup's tasks.
	RunqLatency Histogram
	// ReclaimStall is the time the cgroup's tasks spent in memcg reclaim
	// and global direct reclaim; Reclaims counts those reclaim passes.
	ReclaimStall time.Duration
	Reclaims     uint64
	// OOMKills counts processes of the cgroup killed by the OOM killer
	// (memcg or global OOM).
	OOMKills uint64
}

// OOMEvent is one OOM kill.
type OOMEvent struct {
	PID      int    // victim process (thread group) id
	TID      int    // victim task id (usually == PID)
	Comm     string // victim's command name
	CgroupID uint64 // victim's cgroup v2 id
	Time     time.Time
}

// Option configures Load.
type Option func(*options)

type options struct {
	maxCgroups  uint32
	eventBuffer int
	oomHook     string // program name; "" = best available
	// beforeAttach, if set, runs before each program is attached and can
	// fail the attach (tests of the clean-up on error).
	beforeAttach func(prog string) error
}

// WithMaxCgroups sets how many cgroups the per-cgroup maps hold (default
// 2048). The run-queue histograms are allocated up front, 232 bytes per
// cgroup and CPU (464 KiB per CPU at the default); the memory counters
// are allocated on first use. When the maps are full, cgroups without an
// entry are not counted until Forget makes room.
func WithMaxCgroups(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.maxCgroups = uint32(n)
		}
	}
}

// WithEventBuffer sets the capacity of the OOMEvents channel (default 64).
// While it is full, further events wait in the kernel ring buffer (64 KiB,
// about 1600 events); when that is full too, events are lost (the OOMKills
// counters are not).
func WithEventBuffer(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.eventBuffer = n
		}
	}
}

// Tracker holds the loaded and attached programs and their maps. Its
// methods are safe for concurrent use.
type Tracker struct {
	coll      *ebpf.Collection
	oomHook   oomHook
	links     []link.Link
	progs     []string  // attached programs, by name
	runqLat   *ebpf.Map // slot -> per-CPU histograms
	runqSlots *ebpf.Map // cgroup id -> slot
	runqFree  *ebpf.Map // queue of free slots
	runqGen   *ebpf.Map // bumped after a slot is freed
	cgMem     *ebpf.Map
	// limitWrites is cgroup id -> CLOCK_MONOTONIC ns of the last write to
	// its limit files; nil where the kernel has no cgroup_file_write to
	// trace.
	limitWrites *ebpf.Map
	forgetMu    sync.Mutex // serialises Forget's updates of runqGen
	reader      *ringbuf.Reader
	events      chan OOMEvent
	stop        chan struct{}
	wg          sync.WaitGroup

	mu       sync.RWMutex // write-held by Close
	closed   bool
	closeErr error
	once     sync.Once
}

// Program names in pressure.bpf.c, by hook.
var (
	schedPrograms = []string{
		pressureProgOnSchedSwitch,
	}
	reclaimPrograms = []string{
		pressureProgOnMemcgReclaimBegin,
		pressureProgOnMemcgReclaimEnd,
		pressureProgOnDirectReclaimBegin,
		pressureProgOnDirectReclaimEnd,
	}
)

// oomHook is one of the alternative OOM kill programs of pressure.bpf.c.
type oomHook struct {
	prog   string          // program name
	attach ebpf.AttachType // tp_btf or fentry
	target string          // tracepoint or kernel function
}

// oomHooks in order of preference; see the end of pressure.bpf.c.
var oomHooks = []oomHook{
	{pressureProgOnMarkVictim, ebpf.AttachTraceRawTp, "mark_victim"},
	{pressureProgOnOomKill, ebpf.AttachTraceFEntry, "__oom_kill_process"},
	{pressureProgOnOomKillChosen, ebpf.AttachTraceFEntry, "oom_kill_process"},
}

// usable tells whether the running kernel (its BTF) has the hook with the
// arguments the program reads.
func (h oomHook) usable(kernel *btf.Spec) bool {
	if h.attach == ebpf.AttachTraceFEntry {
		var fn *btf.Func
		return kernel.TypeByName(h.target, &fn) == nil
	}
	// tp_btf: the typedef btf_trace_<name> is a pointer to
	// void (*)(void *__data, <TP_PROTO args>). mark_victim's first
	// argument must be the task (older kernels pass an int pid).
	var td *btf.Typedef
	if kernel.TypeByName("btf_trace_"+h.target, &td) != nil {
		return false
	}
	ptr, ok := btf.UnderlyingType(td.Type).(*btf.Pointer)
	if !ok {
		return false
	}
	proto, ok := btf.UnderlyingType(ptr.Target).(*btf.FuncProto)
	if !ok || len(proto.Params) < 2 {
		return false
	}
	arg, ok := btf.UnderlyingType(proto.Params[1].Type).(*btf.Pointer)
	if !ok {
		return false
	}
	st, ok := btf.UnderlyingType(arg.Target).(*btf.Struct)
	return ok && st.Name == "task_struct"
}

// chooseOOMHook returns the first usable hook, or the one named by force
// (tests use that to check the fallbacks).
func chooseOOMHook(kernel *btf.Spec, force string) (oomHook, error) {
	for _, h := range oomHooks {
		if force != "" && h.prog != force {
			continue
		}
		if h.usable(kernel) {
			return h, nil
		}
	}
	return oomHook{}, notSupported("OOM kill hook", errors.New("kernel BTF has none of tp_btf/mark_victim(struct task_struct *, ...), __oom_kill_process, oom_kill_process"))
}

// Load loads the programs into the kernel and attaches them. It raises
// RLIMIT_MEMLOCK where the kernel still charges BPF memory to it. On error
// everything opened so far is closed again. Errors caused by a kernel that
// lacks a needed feature match ErrNotSupported.
func Load(opts ...Option) (*Tracker, error) {
	o := options{maxCgroups: 2048, eventBuffer: 64}
	for _, opt := range opts {
		opt(&o)
	}

	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("bpf: raising RLIMIT_MEMLOCK: %w", err)
	}
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, notSupported("kernel BTF", err)
	}
	if err := haveSchedInfo(kernel); err != nil {
		return nil, err
	}
	spec, err := loadPressure()
	if err != nil {
		return nil, fmt.Errorf("bpf: %w", err)
	}
	oom, err := chooseOOMHook(kernel, o.oomHook)
	if err != nil {
		return nil, err
	}
	for _, h := range oomHooks {
		if h.prog != oom.prog {
			delete(spec.Programs, h.prog)
		}
	}
	// The limit-write hook is a plus: a kernel without the function (in
	// its BTF) still gets everything else.
	var fn *btf.Func
	writes := kernel.TypeByName("cgroup_file_write", &fn) == nil
	if !writes {
		delete(spec.Programs, pressureProgOnCgroupFileWrite)
	}
	for _, m := range []string{pressureMapRunqLat, pressureMapRunqSlots, pressureMapRunqFree, pressureMapCgMem} {
		spec.Maps[m].MaxEntries = o.maxCgroups
	}

	collOpts := ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{KernelTypes: kernel}}
	coll, err := ebpf.NewCollectionWithOptions(spec, collOpts)
	if err != nil && writes {
		// fexit needs BPF trampolines, which some kernels and sandboxes
		// refuse (EPERM) where tp_btf loads: go on without the hook.
		delete(spec.Programs, pressureProgOnCgroupFileWrite)
		writes = false
		coll, err = ebpf.NewCollectionWithOptions(spec, collOpts)
	}
	if err != nil {
		return nil, classify("loading programs", err)
	}
	t := &Tracker{
		coll:      coll,
		oomHook:   oom,
		runqLat:   coll.Maps[pressureMapRunqLat],
		runqSlots: coll.Maps[pressureMapRunqSlots],
		runqFree:  coll.Maps[pressureMapRunqFree],
		runqGen:   coll.Maps[pressureMapRunqGen],
		cgMem:     coll.Maps[pressureMapCgMem],
		events:    make(chan OOMEvent, o.eventBuffer),
		stop:      make(chan struct{}),
	}
	fail := func(err error) (*Tracker, error) {
		t.closeResources()
		return nil, err
	}
	for slot := uint32(0); slot < o.maxCgroups; slot++ {
		if err := t.runqFree.Update(nil, slot, ebpf.UpdateAny); err != nil {
			return fail(fmt.Errorf("bpf: filling the free slot queue: %w", err))
		}
	}

	progs := append(append(append([]string{}, schedPrograms...), reclaimPrograms...), oom.prog)
	for _, name := range progs {
		if o.beforeAttach != nil {
			if err := o.beforeAttach(name); err != nil {
				return fail(fmt.Errorf("bpf: attaching %s: %w", name, err))
			}
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[name]})
		if err != nil {
			return fail(classify("attaching "+name, err))
		}
		t.links = append(t.links, l)
		t.progs = append(t.progs, name)
	}

	if writes {
		// Optional as above: a refused attach leaves the hook off.
		if l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[pressureProgOnCgroupFileWrite]}); err == nil {
			t.links = append(t.links, l)
			t.progs = append(t.progs, pressureProgOnCgroupFileWrite)
			t.limitWrites = coll.Maps[pressureMapLimitWrites]
		}
	}

	t.reader, err = ringbuf.NewReader(coll.Maps[pressureMapOomEvents])
	if err != nil {
		return fail(classify("opening OOM ring buffer", err))
	}
	t.wg.Add(1)
	go t.readEvents()
	return t, nil
}

// Close detaches and unloads everything, stops the OOM event goroutine and
// closes the OOMEvents channel. It is safe to call more than once.
func (t *Tracker) Close() error {
	t.once.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		t.closeErr = t.closeResources()
	})
	return t.closeErr
}

func (t *Tracker) closeResources() error {
	var errs []error
	for _, l := range t.links {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	t.links = nil
	close(t.stop)
	if t.reader != nil {
		if err := t.reader.Close(); err != nil {
			errs = append(errs, err)
		}
		t.wg.Wait()
	} else {
		close(t.events) // no reader goroutine to close it
	}
	t.coll.Close()
	if len(errs) > 0 {
		return fmt.Errorf("bpf: close: %w", errors.Join(errs...))
	}
	return nil
}

var errClosed = errors.New("bpf: tracker closed")

// TimesLimitWrites reports whether the limit-write hook is attached
// (LastLimitWrite can say anything).
func (t *Tracker) TimesLimitWrites() bool { return t.limitWrites != nil }

// LastLimitWrite is when the cgroup's cpu.max, cpu.weight, memory.max or memory.high
// was last written with success, by anyone, as the kernel timed it; ok is
// false when no write was seen since the programs were attached (or the
// entry was evicted: the map keeps the 4,096 cgroups written last), or
// when the kernel has no hook for it.
func (t *Tracker) LastLimitWrite(cgroupID uint64) (at time.Time, ok bool, err error) {
	ns, ok, err := t.LimitWriteStamp(cgroupID)
	if !ok || err != nil {
		return time.Time{}, false, err
	}
	return monoToWall(ns), true, nil
}

// LimitWriteStamp is LastLimitWrite's kernel time as the program took it
// (CLOCK_MONOTONIC ns): two calls that return the same stamp saw the same
// last write, which the wall-clock times cannot promise (their offset is
// read anew each time).
func (t *Tracker) LimitWriteStamp(cgroupID uint64) (ns uint64, ok bool, err error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return 0, false, errClosed
	}
	if t.limitWrites == nil {
		return 0, false, nil
	}
	switch err := t.limitWrites.Lookup(cgroupID, &ns); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("bpf: reading the last limit write of cgroup %d: %w", cgroupID, err)
	}
	return ns, true, nil
}

// AnyLimitWriteStamp is the kernel time of the last limit write to any
// cgroup (0: none seen since the programs were attached); ok is false
// when the hook is not attached. Equal stamps taken at two times mean
// that no cgroup's cpu.max, cpu.weight, memory.max or memory.high was written in
// between.
func (t *Tracker) AnyLimitWriteStamp() (ns uint64, ok bool, err error) {
	if !t.TimesLimitWrites() {
		return 0, false, nil
	}
	ns, _, err = t.LimitWriteStamp(anyCgroup)
	return ns, err == nil, err
}

// anyCgroup is limit_writes' key for the last write to any cgroup: no
// cgroup has id 0 (the root's is 1).
const anyCgroup = 0

// monoToWall turns a bpf_ktime_get_ns time (CLOCK_MONOTONIC) into the wall
// clock, by the two clocks' offset now.
func monoToWall(ns uint64) time.Time {
	var mono unix.Timespec
	wall := time.Now()
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono) != nil {
		return time.Time{}
	}
	return wall.Add(-time.Duration(mono.Nano() - int64(ns)))
}

// Stats returns one cgroup's counters, summed over CPUs. A cgroup without
// events so far has zero Stats (and a nil error).
func (t *Tracker) Stats(cgroupID uint64) (Stats, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return Stats{}, errClosed
	}
	var s Stats
	var slot uint32
	switch err := t.runqSlots.Lookup(cgroupID, &slot); {
	case err == nil:
		if err := t.readRunq(cgroupID, slot, &s.RunqLatency); err != nil {
			return Stats{}, err
		}
	case !errors.Is(err, ebpf.ErrKeyNotExist):
		return Stats{}, fmt.Errorf("bpf: reading run-queue latency of cgroup %d: %w", cgroupID, err)
	}
	if s.RunqLatency.Buckets == nil {
		s.RunqLatency.Buckets = make([]uint64, HistogramBuckets)
	}
	var ms []pressureMemStats
	switch err := t.cgMem.Lookup(cgroupID, &ms); {
	case err == nil:
		for i := range ms {
			s.addMem(&ms[i])
		}
	case !errors.Is(err, ebpf.ErrKeyNotExist):
		return Stats{}, fmt.Errorf("bpf: reading memory stats of cgroup %d: %w", cgroupID, err)
	}
	return s, nil
}

// readRunq adds up the CPUs' histograms in slot that belong to cgroupID
// (a copy may still hold a forgotten cgroup's counts, see runq_hist_get).
func (t *Tracker) readRunq(cgroupID uint64, slot uint32, h *Histogram) error {
	var hs []pressureRunqHist
	if err := t.runqLat.Lookup(slot, &hs); err != nil {
		return fmt.Errorf("bpf: reading run-queue latency of cgroup %d (slot %d): %w", cgroupID, slot, err)
	}
	for i := range hs {
		if hs[i].CgroupId == cgroupID {
			h.add(&hs[i])
		}
	}
	return nil
}

func (s *Stats) addMem(m *pressureMemStats) {
	s.ReclaimStall += time.Duration(m.ReclaimNs)
	s.Reclaims += m.Reclaims
	s.OOMKills += m.OomKills
}

// All returns the counters of every cgroup seen so far, by cgroup id.
func (t *Tracker) All() (map[uint64]Stats, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return nil, errClosed
	}
	all := make(map[uint64]Stats)
	var id uint64
	var slot uint32
	it := t.runqSlots.Iterate()
	for it.Next(&id, &slot) {
		s := all[id]
		if err := t.readRunq(id, slot, &s.RunqLatency); err != nil {
			return nil, err
		}
		all[id] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bpf: iterating run-queue latency: %w", err)
	}
	var ms []pressureMemStats
	it = t.cgMem.Iterate()
	for it.Next(&id, &ms) {
		s := all[id]
		for i := range ms {
			s.addMem(&ms[i])
		}
		all[id] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bpf: iterating memory stats: %w", err)
	}
	for id, s := range all {
		if s.RunqLatency.Buckets == nil {
			s.RunqLatency.Buckets = make([]uint64, HistogramBuckets)
			all[id] = s
		}
	}
	return all, nil
}

// Forget deletes a cgroup's entries, for a cgroup that is gone. (Its id is
// not reused: cgroup ids are 64-bit and only increase.) A cgroup that still
// has tasks gets new entries on its next event.
func (t *Tracker) Forget(cgroupID uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return
	}
	_ = t.cgMem.Delete(cgroupID)
	t.forgetMu.Lock()
	defer t.forgetMu.Unlock()
	var slot uint32
	if t.runqSlots.Lookup(cgroupID, &slot) != nil {
		return
	}
	if t.runqSlots.Delete(cgroupID) != nil {
		return // deleted by a concurrent Forget
	}
	// Tasks that cached the slot look it up again (and miss) once the
	// generation changes; only then may the slot go to another cgroup.
	// Its CPU copies keep this cgroup's counts until a new owner
	// overwrites them, and are not read as anyone else's.
	var gen uint32
	if t.runqGen.Lookup(uint32(0), &gen) == nil {
		_ = t.runqGen.Update(uint32(0), gen+1, ebpf.UpdateAny)
	}
	_ = t.runqFree.Update(nil, slot, ebpf.UpdateAny)
}

// OOMHook names the OOM kill hook Load picked for this kernel:
// "tp_btf/mark_victim", "fentry/__oom_kill_process" or
// "fentry/oom_kill_process".
func (t *Tracker) OOMHook() string {
	if t.oomHook.attach == ebpf.AttachTraceFEntry {
		return "fentry/" + t.oomHook.target
	}
	return "tp_btf/" + t.oomHook.target
}

// OOMEvents returns the channel of OOM kills. There is one channel per
// Tracker, shared by all callers; Close closes it.
func (t *Tracker) OOMEvents() <-chan OOMEvent {
	return t.events
}

// oomRecord is struct oom_event of pressure.bpf.c.
type oomRecord struct {
	BootNs   uint64
	CgroupID uint64
	Pid      uint32
	Tid      uint32
	Comm     [16]byte
}

const oomRecordSize = 40

func (t *Tracker) readEvents() {
	defer t.wg.Done()
	defer close(t.events)
	var rec ringbuf.Record
	for {
		if err := t.reader.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			select {
			case <-t.stop:
				return
			case <-time.After(100 * time.Millisecond):
				continue
			}
		}
		ev, ok := decodeOOM(rec.RawSample)
		if !ok {
			continue
		}
		select {
		case t.events <- ev:
		case <-t.stop:
			return
		}
	}
}

func decodeOOM(raw []byte) (OOMEvent, bool) {
	if len(raw) < oomRecordSize {
		return OOMEvent{}, false
	}
	var r oomRecord
	if err := binary.Read(bytes.NewReader(raw[:oomRecordSize]), binary.NativeEndian, &r); err != nil {
		return OOMEvent{}, false
	}
	comm := r.Comm[:]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	return OOMEvent{
		PID:      int(r.Pid),
		TID:      int(r.Tid),
		Comm:     string(comm),
		CgroupID: r.CgroupID,
		Time:     bootTime(r.BootNs),
	}, true
}

// bootTime converts a CLOCK_BOOTTIME reading (ns) to wall-clock time.
func bootTime(ns uint64) time.Time {
	now := time.Now()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(uint64(ts.Nano()) - ns))
}
