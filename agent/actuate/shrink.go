package actuate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
)

// A memory limit below a cgroup's usage is reached in steps rather than by
// writing memory.max at once (where the kernel reclaims and, failing that,
// OOM-kills): memory.high goes to the new limit, which throttles the cgroup's
// allocations and makes the kernel reclaim; memory.reclaim asks for the
// rest; once memory.current is under the limit the normal steps lower
// memory.max (through the runtime for a runtime's container), and memory.high
// goes back to what it was. If usage will not come down in time, memory.high
// is restored and the intent fails with the figures, memory.max untouched.

// DefaultShrinkTimeout bounds how long a shrink waits for usage to come down.
const DefaultShrinkTimeout = 30 * time.Second

const (
	// shrinkPoll is the pause between reclaim rounds; dentries and inodes
	// are freed after an RCU grace period, so memory.current lags.
	shrinkPoll = 50 * time.Millisecond
	// shrinkChunk is the most one memory.reclaim write asks for.
	shrinkChunk = 64 << 20
	// shrinkStuckRounds rounds in a row without usage falling by a page
	// mean it will not come down (anonymous memory with no swap).
	shrinkStuckRounds = 4
	// shrinkMaxStall is the share of the elapsed time, once past
	// shrinkStallGrace, that the cgroup may spend fully stalled on memory
	// (PSI memory full) before the shrink gives up to spare the workload.
	shrinkMaxStall   = 0.5
	shrinkStallGrace = 2 * time.Second
)

// memoryShrinker is what a shrink needs of the cgroup filesystem beyond
// Cgroups; *cgroup.Manager has it.
type memoryShrinker interface {
	ReadMemory(path string) (cgroup.Memory, error)
	SetMemoryHigh(path string, v int64) error
	Reclaim(path string, n int64) (int64, error)
	SupportsReclaim(path string) (bool, error)
}

// belowUsage lists the levels whose new memory.max is below their usage and
// below their present limit: the container first (not when it restarts,
// since a restarted container starts from nothing), then its pod.
func belowUsage(j *job) []*level {
	var out []*level
	if !j.Restart {
		out = append(out, &j.ctr)
	}
	if j.pod != nil {
		out = append(out, j.pod)
	}
	return slices.DeleteFunc(out, func(l *level) bool {
		if l.want.MemoryMax == nil || *l.want.MemoryMax == cgroup.Unlimited {
			return true
		}
		lim := *l.want.MemoryMax
		return lim >= l.cur.MemoryCurrent || lim >= memLimit(l.cur.MemoryMax)
	})
}

// memoryBelowUsage is write's check of a memory decrease below usage. It
// returns stop=true with the result when write must not go on by itself:
// the decrease is refused (memory.reclaim missing, shrinking turned off, or
// usage back above the limit after a shrink), or it was carried out by
// shrink, which called write again once usage was down.
func (j *job) memoryBelowUsage() (Result, bool) {
	if j.AllowMemoryBelowUsage {
		return Result{}, false
	}
	levels := belowUsage(j)
	if len(levels) == 0 {
		return Result{}, false
	}
	ms, ok := j.x.Cgroups.(memoryShrinker)
	if ok && !j.shrunk && j.x.ShrinkTimeout >= 0 {
		for _, l := range levels {
			if sup, err := ms.SupportsReclaim(l.path); err != nil || !sup {
				ok = false
			}
		}
		if ok {
			j.shrunk = true
			return j.shrink(ms, levels), true
		}
	}
	l := levels[0]
	lim := *l.want.MemoryMax
	why := "since the kernel would have to reclaim and might OOM-kill the container"
	if j.shrunk {
		why = "since usage grew back above it after the reclaim"
	}
	return failed(intent.ReasonMemoryBelowUsage,
		"memory limit %s is below the current usage %s of %s; refusing, %s (set allowMemoryBelowUsage to force)",
		intent.FormatMemory(lim), intent.FormatMemory(l.cur.MemoryCurrent), l.path, why), true
}

// shrinkReport is what one level's shrink did.
type shrinkReport struct {
	path          string
	target        int64 // the new memory.max
	oldHigh       int64 // memory.high before, restored after
	high          int64 // memory.high as lowered
	highSet       bool  // memory.high was lowered
	before, after cgroup.Memory
	took          time.Duration
	rounds        int
	err           error // why usage did not come down; nil when it did
}

// Reclaim is what a shrink did, for the log: a note per level whose usage
// came down, and the restores of memory.high, with their failures.
type Reclaim struct {
	Reclaimed, Restored []string
	RestoreErr          error
}

// shrink brings each level's usage under its new limit, container first,
// then runs write, then restores memory.high whatever happened.
func (j *job) shrink(ms memoryShrinker, levels []*level) Result {
	timeout := j.x.ShrinkTimeout
	if timeout == 0 {
		timeout = DefaultShrinkTimeout
	}
	if j.BeforeShrink != nil {
		if err := j.BeforeShrink(); err != nil {
			return failed(intent.ReasonMemoryBelowUsage, "memory limit below usage of %s, and not reclaimed first: %v", levels[0].path, err)
		}
	}
	deadline := time.Now().Add(timeout)
	var done []*shrinkReport
	var out Result
	for _, l := range levels {
		rep := reclaimTo(j.ctx, ms, j.x.Cgroups.PageSize(), l.path, *l.want.MemoryMax, 0, deadline)
		done = append(done, rep)
		if rep.err != nil {
			out = failed(intent.ReasonMemoryBelowUsage, "%s", rep.failure())
			break
		}
	}
	if out.State == "" {
		// write times its own phases; write's caller times this whole call
		// as the reclaim phase, so take write's share back out of it.
		t := time.Now()
		out = j.write()
		j.took.Reclaim -= time.Since(t)
	}
	var notes, restored []string
	var restoreErrs []error
	for _, rep := range done {
		if rep.err == nil {
			notes = append(notes, rep.success())
		}
	}
	for _, rep := range slices.Backward(done) {
		if !rep.highSet {
			continue
		}
		// An update through the runtime sets the kubelet's MemoryQoS
		// memory.high for the new limit (runtimeResources): that one stands.
		if m, err := ms.ReadMemory(rep.path); err == nil && m.High != spec.PageAlign(rep.high, j.x.Cgroups.PageSize()) {
			restored = append(restored, fmt.Sprintf("memory.high of %s left at %s as the runtime set it", rep.path, maxText(m.High)))
			continue
		}
		if err := ms.SetMemoryHigh(rep.path, rep.oldHigh); err != nil {
			restoreErrs = append(restoreErrs, fmt.Errorf("restoring memory.high of %s: %w", rep.path, err))
			restored = append(restored, fmt.Sprintf("restoring memory.high of %s to %s FAILED: %v", rep.path, maxText(rep.oldHigh), err))
			continue
		}
		restored = append(restored, fmt.Sprintf("memory.high of %s restored to %s", rep.path, maxText(rep.oldHigh)))
	}
	j.rec = &Reclaim{Reclaimed: notes, Restored: restored, RestoreErr: errors.Join(restoreErrs...)}
	msg := out.Message
	if len(notes) > 0 {
		msg = strings.Join(notes, "; ") + "; then " + msg
	}
	if len(restored) > 0 {
		msg += "; " + strings.Join(restored, ", ")
	}
	out.Message = msg
	return out
}

// shrinkGoal is where a shrink to target aims: under the limit by a margin,
// so that memory.max can be written (or the kubelet's check of usage
// against it pass) without the kernel reclaiming, or OOM-killing, for the
// last pages charged meanwhile.
func shrinkGoal(target, page int64) int64 { return target - max(target/100, 64*page) }

// reclaimTo lowers memory.high of path to hold (target when 0; never
// raising it) and asks the kernel to reclaim until memory.current is a
// little under target, until deadline, until usage stops falling, or until
// the cgroup is stalled on memory too much. It leaves memory.high lowered;
// the caller restores it.
func reclaimTo(ctx context.Context, ms memoryShrinker, page int64, path string, target, hold int64, deadline time.Time) *shrinkReport {
	rep := &shrinkReport{path: path, target: target}
	start := time.Now()
	defer func() { rep.took = time.Since(start) }()
	var err error
	if rep.before, err = ms.ReadMemory(path); err != nil {
		rep.err = fmt.Errorf("reading its memory: %w", err)
		return rep
	}
	rep.after, rep.oldHigh = rep.before, rep.before.High
	goal := shrinkGoal(target, page)
	high := target
	if hold > 0 {
		high = hold
	}
	if rep.oldHigh != cgroup.Unlimited && rep.oldHigh < high {
		high = rep.oldHigh
	}
	if high != rep.oldHigh {
		// The write itself reclaims as far as the kernel can.
		if err := ms.SetMemoryHigh(path, high); err != nil {
			rep.err = fmt.Errorf("lowering memory.high: %w", err)
			return rep
		}
		rep.high, rep.highSet = high, true
	}
	best, stuck := rep.before.Current, 0
	for {
		if rep.after, err = ms.ReadMemory(path); err != nil {
			rep.err = fmt.Errorf("reading its memory: %w", err)
			return rep
		}
		cur := rep.after.Current
		if cur <= goal {
			return rep
		}
		if cur < best-page {
			best, stuck = cur, 0
		} else if stuck++; stuck >= shrinkStuckRounds {
			rep.err = fmt.Errorf("usage stopped falling after %d reclaim round(s)", rep.rounds)
			return rep
		}
		if el := time.Since(start); el > shrinkStallGrace {
			if full := rep.after.Pressure.Full - rep.before.Pressure.Full; float64(full) > shrinkMaxStall*float64(el) {
				rep.err = fmt.Errorf("the cgroup was fully stalled on memory for %s of %s", round(full), round(el))
				return rep
			}
		}
		if time.Now().After(deadline) {
			rep.err = fmt.Errorf("usage did not come down within the %s timeout", round(time.Since(start)))
			return rep
		}
		if ctx.Err() != nil {
			// Give up rather than outlive the caller (the agent shutting
			// down): memory.high is restored on the way out, not left
			// lowered.
			rep.err = context.Cause(ctx)
			return rep
		}
		rep.rounds++
		// In chunks: a write to memory.reclaim cannot be interrupted, and
		// the deadline is checked between them.
		_, err := ms.Reclaim(path, min(cur-goal, shrinkChunk))
		switch {
		case errors.Is(err, cgroup.ErrReclaimIncomplete):
			time.Sleep(shrinkPoll)
		case err != nil:
			rep.err = fmt.Errorf("memory.reclaim: %w", err)
			return rep
		}
	}
}

func (r *shrinkReport) reclaimed() int64 { return max(r.before.Current-r.after.Current, 0) }

func (r *shrinkReport) success() string {
	return fmt.Sprintf("%s: reclaimed %s in %s (memory.current %s -> %s under memory.high %s, %d memory.reclaim round(s)%s)",
		r.path, mib(r.reclaimed()), round(r.took), mib(r.before.Current), mib(r.after.Current), intent.FormatMemory(r.target), r.rounds, r.stall())
}

func (r *shrinkReport) failure() string {
	return fmt.Sprintf("memory limit %s is below the current usage %s of %s and the kernel could not reclaim enough: %v; "+
		"memory.current %s -> %s (reclaimed %s in %s; anon %s, file %s of which shmem %s, reclaimable slab %s, swap %s)%s; memory.max left at %s",
		intent.FormatMemory(r.target), mib(r.before.Current), r.path, r.err, mib(r.before.Current), mib(r.after.Current),
		mib(r.reclaimed()), round(r.took), mib(r.after.Anon), mib(r.after.File), mib(r.after.Shmem), mib(r.after.SlabReclaimable), mib(r.after.Swap),
		r.stall(), maxText(r.before.Max))
}

func (r *shrinkReport) stall() string {
	some, full := r.after.Pressure.Some-r.before.Pressure.Some, r.after.Pressure.Full-r.before.Pressure.Full
	if some <= 0 && full <= 0 {
		return ""
	}
	return fmt.Sprintf(", memory stall some %s full %s", round(some), round(full))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func maxText(v int64) string {
	if v == cgroup.Unlimited {
		return "max"
	}
	return intent.FormatMemory(v)
}

// ReleaseMemoryHigh puts memory.high of path back to to (cgroup.Unlimited,
// or the kubelet's MemoryQoS value as the runtime records it), and says
// what it was (to when there was nothing to do). The agent sets memory.high
// only while it shrinks memory, and restores it after; a crash in between
// would leave the cgroup throttled at the old target, and a shrink run
// again would take that lowered value for the one to restore.
func (x *Actuator) ReleaseMemoryHigh(path string, to int64) (int64, error) {
	ms, ok := x.Cgroups.(memoryShrinker)
	if !ok {
		return to, nil
	}
	m, err := ms.ReadMemory(path)
	if err != nil || m.High == to {
		return to, nil
	}
	return m.High, ms.SetMemoryHigh(path, to)
}
