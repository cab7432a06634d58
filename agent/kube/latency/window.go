package latency

import (
	"time"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
)

// reading is one read of every pressure source for one cgroup: cumulative
// counters, so that two readings give what happened between them.
type reading struct {
	at    time.Time
	bpf   *pressure.Sample // run-queue histogram, reclaim stall
	files *pressure.Sample // cpu.stat, PSI
}

func (r reading) ok() bool { return r.bpf != nil || r.files != nil }

// has reports whether r holds every source o holds, PSI included. A read
// that lost a source (a cgroup removed under it, a source failing once)
// yields a reading the window would take as "no throttling, no PSI"; the
// windows end on readings as whole as the container's samples instead.
func (r reading) has(o reading) bool {
	if o.bpf != nil && r.bpf == nil {
		return false
	}
	if o.files == nil {
		return true
	}
	return r.files != nil && (!o.files.Files.HasPSI || r.files.Files.HasPSI)
}

// read reads every source for the cgroup p, stamped when the reads are done
// (a round over many containers takes a while).
func (t *Tracker) read(p string) reading {
	var r reading
	for _, src := range t.opts.Sources {
		s, err := src.Read(p)
		if err != nil {
			continue
		}
		switch {
		case s.RunqLatency != nil && r.bpf == nil:
			r.bpf = &s
		case s.Files != nil && r.files == nil:
			r.files = &s
		}
	}
	r.at = t.opts.Now()
	return r
}

// ring keeps the last readings of one container, oldest first, in a fixed
// array: the cost per container is bounded whatever the uptime.
type ring struct {
	buf  []reading
	next int
	full bool
}

func newRing(n int) *ring { return &ring{buf: make([]reading, n)} }

func (g *ring) add(r reading) {
	g.buf[g.next] = r
	g.next = (g.next + 1) % len(g.buf)
	if g.next == 0 {
		g.full = true
	}
}

// atOrBefore is the newest reading taken at or before t that has every
// source like has; failing that, the oldest such kept (a window shorter
// than asked, which the window's length says).
func (g *ring) atOrBefore(t time.Time, like reading) (reading, bool) {
	n := g.next
	if g.full {
		n = len(g.buf)
	}
	var best, oldest reading
	for i := range n {
		r := g.buf[i]
		if !r.ok() || !r.has(like) {
			continue
		}
		if !r.at.After(t) && r.at.After(best.at) {
			best = r
		}
		if oldest.at.IsZero() || r.at.Before(oldest.at) {
			oldest = r
		}
	}
	if !best.at.IsZero() {
		return best, true
	}
	return oldest, !oldest.at.IsZero()
}

// newest is the newest reading taken at or before t, and only that.
func (g *ring) newest(t time.Time) (reading, bool) {
	var best reading
	for i, r := range g.buf {
		if !g.full && i >= g.next {
			break
		}
		if r.ok() && !r.at.After(t) && r.at.After(best.at) {
			best = r
		}
	}
	return best, !best.at.IsZero()
}

// birth is the reading of a cgroup at its container's start at, for the
// end reading b: every counter the window uses starts at zero when the
// cgroup is made (PSI totals, cpu.stat; the BPF maps count a cgroup from
// its first event), so this is zero with b's shape. The start is the
// status's startedAt (whole seconds; the cgroup is made a moment before),
// so such a window may be up to a second long or short.
func birth(at time.Time, b reading) reading {
	z := reading{at: at}
	if b.files != nil {
		f := *b.files
		f.Files = &cgroup.Pressure{HasPSI: b.files.Files != nil && b.files.Files.HasPSI}
		f.CPUStall, f.MemoryStall, f.OOMKills = 0, 0, 0
		z.files = &f
	}
	if b.bpf != nil {
		s := *b.bpf
		if h := b.bpf.RunqLatency; h != nil {
			s.RunqLatency = &pressure.Histogram{Bounds: h.Bounds, Counts: make([]uint64, len(h.Counts))}
		}
		s.CPUStall, s.MemoryStall, s.OOMKills, s.Reclaims = 0, 0, 0, 0
		z.bpf = &s
	}
	return z
}

// window is what the counters did between a and b; nil if they cannot say.
func window(a, b reading) *api.PressureWindow {
	d := b.at.Sub(a.at)
	if d <= 0 || !a.ok() || !b.ok() {
		return nil
	}
	w := &api.PressureWindow{Start: a.at, Seconds: d.Seconds(), Source: "psi"}
	share := func(x time.Duration) *float64 {
		v := max(0, x.Seconds()/d.Seconds())
		return &v
	}
	if a.files != nil && b.files != nil {
		fa, fb := a.files.Files, b.files.Files
		w.ThrottledSeconds = max(0, (fb.Throttled - fa.Throttled).Seconds())
		if p := fb.Periods - fa.Periods; fb.Periods >= fa.Periods && p > 0 {
			v := float64(fb.ThrottledPeriods-fa.ThrottledPeriods) / float64(p)
			w.ThrottledRatio = &v
		}
		if fa.HasPSI && fb.HasPSI {
			w.CPUPressure = share(fb.CPU.Some - fa.CPU.Some)
			w.MemoryPressure = share(fb.Memory.Some - fa.Memory.Some)
		}
	}
	if a.bpf != nil && b.bpf != nil {
		w.Source = "ebpf"
		ha, hb := a.bpf.RunqLatency, b.bpf.RunqLatency
		if hb.Count >= ha.Count && len(ha.Counts) == len(hb.Counts) {
			w.RunqCount = hb.Count - ha.Count
			delta := make([]uint64, len(hb.Counts))
			for i := range delta {
				delta[i] = hb.Counts[i] - ha.Counts[i]
			}
			w.RunqP50Seconds = quantile(0.5, hb.Bounds, delta, w.RunqCount)
			w.RunqP99Seconds = quantile(0.99, hb.Bounds, delta, w.RunqCount)
		}
		v := max(0, (b.bpf.MemoryStall - a.bpf.MemoryStall).Seconds())
		w.ReclaimStallSeconds = &v
	}
	return w
}

// quantile estimates the q-quantile of a cumulative histogram (counts at or
// below each bound, total in all) by linear interpolation within the bucket
// the rank falls in, as Prometheus's histogram_quantile does; a rank past
// the last bound gives the last bound. nil when nothing was observed.
func quantile(q float64, bounds []float64, cum []uint64, total uint64) *float64 {
	if total == 0 || len(bounds) == 0 {
		return nil
	}
	rank := q * float64(total)
	lower, prev := 0.0, uint64(0)
	for i, b := range bounds {
		if float64(cum[i]) >= rank {
			v := b
			if n := cum[i] - prev; n > 0 {
				v = lower + (b-lower)*(rank-float64(prev))/float64(n)
			}
			return &v
		}
		lower, prev = b, cum[i]
	}
	v := bounds[len(bounds)-1]
	return &v
}
