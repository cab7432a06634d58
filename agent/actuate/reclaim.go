package actuate

import (
	"context"
	"fmt"
	"time"

	"github.com/resizer/resize-agent/cgroup"
)

// MemoryCgroups is what bringing a cgroup's memory usage down needs of the
// cgroup filesystem; *cgroup.Manager has it.
type MemoryCgroups interface {
	memoryShrinker
	PageSize() int64
}

var _ MemoryCgroups = (*cgroup.Manager)(nil)

// Reclaimed is what ReclaimBelow did to one cgroup.
type Reclaimed struct {
	Path string
	// Limit is the memory limit usage was brought under.
	Limit int64
	// Found is memory.high before; Set is what ReclaimBelow left in it
	// (Found when it did not lower it, or when it gave up and put Found
	// back).
	Found, Set    int64
	Before, After cgroup.Memory
	Took          time.Duration
	// Err says why usage did not come down; nil when it did.
	Err error
	// Message is the figures, for a log line or an Event.
	Message string
}

// Held reports whether memory.high is left lowered, for the caller to put
// back with RestoreHigh.
func (r Reclaimed) Held() bool { return r.Set != r.Found }

// Amount is how much usage came down.
func (r Reclaimed) Amount() int64 { return max(r.Before.Current-r.After.Current, 0) }

// ReclaimBelow brings the memory usage of cgroup path a little under limit
// the way a shrink before a decrease does (memory.high lowered, then
// memory.reclaim in chunks, watching usage and PSI, within timeout), for a
// decrease that someone else carries out: memory.max is never written.
// When usage came down, memory.high is left a little under limit, so that
// usage stays there until the decrease is carried out, and the caller puts
// it back with RestoreHigh. When it did not, memory.high is put back at
// once and Err says why.
func ReclaimBelow(ctx context.Context, ms MemoryCgroups, path string, limit int64, timeout time.Duration) Reclaimed {
	if timeout <= 0 {
		timeout = DefaultShrinkTimeout
	}
	page := ms.PageSize()
	// memory.high is held where the shrink aims, in whole pages (the
	// kernel keeps it in pages): the kubelet refuses a limit at or below
	// usage, and usage can pass memory.high by a few pages before the
	// kernel reclaims them.
	hold := shrinkGoal(limit, page) / page * page
	rep := reclaimTo(ctx, ms, page, path, limit, hold, time.Now().Add(timeout))
	out := Reclaimed{Path: path, Limit: limit, Found: rep.oldHigh, Set: rep.oldHigh, Before: rep.before, After: rep.after, Took: rep.took, Err: rep.err}
	if rep.highSet {
		out.Set = hold
		if rep.oldHigh != cgroup.Unlimited && rep.oldHigh < out.Set {
			out.Set = rep.oldHigh
		}
	}
	if rep.err == nil {
		out.Message = rep.success()
		return out
	}
	out.Message = rep.failure()
	if rep.highSet {
		if err := ms.SetMemoryHigh(path, rep.oldHigh); err != nil {
			out.Err = fmt.Errorf("%w; restoring memory.high to %s: %w", rep.err, maxText(rep.oldHigh), err)
			out.Message += fmt.Sprintf("; restoring memory.high to %s FAILED: %v", maxText(rep.oldHigh), err)
			return out
		}
		out.Set = rep.oldHigh
		out.Message += fmt.Sprintf("; memory.high restored to %s", maxText(rep.oldHigh))
	}
	return out
}

// RestoreHigh puts back the memory.high that ReclaimBelow found, unless
// someone else wrote memory.high since (the kubelet, under MemoryQoS, sets
// it for the new limit with the decrease: its value then stands). It says
// what memory.high holds afterwards and whether it wrote it.
func RestoreHigh(ms MemoryCgroups, r Reclaimed) (now int64, wrote bool, err error) {
	if !r.Held() {
		return r.Set, false, nil
	}
	m, err := ms.ReadMemory(r.Path)
	if err != nil {
		return 0, false, fmt.Errorf("reading memory.high of %s: %w", r.Path, err)
	}
	if m.High != r.Set {
		return m.High, false, nil
	}
	if err := ms.SetMemoryHigh(r.Path, r.Found); err != nil {
		return m.High, false, fmt.Errorf("restoring memory.high of %s to %s: %w", r.Path, maxText(r.Found), err)
	}
	return r.Found, true, nil
}

// HighText is memory.high's value as a message shows it.
func HighText(v int64) string { return maxText(v) }
