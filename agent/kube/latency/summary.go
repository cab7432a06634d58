package latency

import (
	"fmt"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent/api"
)

// summary is the one line of the ResizeMeasured Event: who, the phases,
// and per container the pressure before -> after.
func summary(r *api.KubeResize, mismatch string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "generation %d", r.Generation)
	if r.Manager != "" {
		fmt.Fprintf(&b, " by %s", r.Manager)
	}
	what := strings.Join(r.Containers, ",")
	if r.PodLevel {
		what = strings.TrimPrefix(what+"; pod-level resources", "; ")
	}
	fmt.Fprintf(&b, " (%s) %s:", what, r.Outcome)
	for _, ph := range r.Phases {
		if ph.Phase == "accepted" {
			fmt.Fprintf(&b, " seen %s after accepted,", secs(ph.Seconds))
			continue
		}
		fmt.Fprintf(&b, " %s +%s", ph.Phase, secs(ph.Seconds))
		if ph.Phase == "cgroup" && len(r.ContainerCgroups) > 1 {
			// Which container the kubelet got to last, and when the others
			// were done.
			parts := make([]string, len(r.ContainerCgroups))
			for i, c := range r.ContainerCgroups {
				parts[i] = fmt.Sprintf("%s +%s", c.Container, secs(c.Seconds))
			}
			fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
		}
	}
	if r.Deferred {
		b.WriteString(" (was deferred)")
	}
	if r.Error != "" {
		fmt.Fprintf(&b, " (kubelet: %s)", r.Error)
	}
	if mismatch != "" && !hasPhase(r, "cgroup") && (r.Outcome == "completed" || r.Outcome == "timeout") {
		fmt.Fprintf(&b, " (files: %s)", mismatch)
	}
	for _, p := range r.Pressure {
		fmt.Fprintf(&b, "; %s before->after:", p.Container)
		pair := func(label string, f func(*api.PressureWindow) string) {
			x, y := "?", "?"
			if p.Before != nil {
				x = f(p.Before)
			}
			if p.After != nil {
				y = f(p.After)
			}
			if x == "" && y == "" {
				return
			}
			fmt.Fprintf(&b, " %s %s->%s", label, x, y)
		}
		pair("runq p50", func(w *api.PressureWindow) string { return optDur(w.RunqP50Seconds) })
		pair("p99", func(w *api.PressureWindow) string { return optDur(w.RunqP99Seconds) })
		pair("throttled", func(w *api.PressureWindow) string {
			if w.ThrottledRatio == nil {
				return dur(w.ThrottledSeconds/w.Seconds) + "/s"
			}
			return fmt.Sprintf("%.0f%% %s/s", *w.ThrottledRatio*100, dur(w.ThrottledSeconds/w.Seconds))
		})
		pair("cpu psi", func(w *api.PressureWindow) string { return pct(w.CPUPressure) })
		pair("mem psi", func(w *api.PressureWindow) string { return pct(w.MemoryPressure) })
		pair("reclaim", func(w *api.PressureWindow) string { return optDur(w.ReclaimStallSeconds) })
		if p.Before != nil && p.After != nil {
			fmt.Fprintf(&b, " (%.0fs/%.0fs)", p.Before.Seconds, p.After.Seconds)
		}
	}
	return b.String()
}

func hasPhase(r *api.KubeResize, name string) bool {
	for _, p := range r.Phases {
		if p.Phase == name {
			return true
		}
	}
	return false
}

func secs(s float64) string { return fmt.Sprintf("%.2fs", s) }

func dur(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Microsecond).String()
}

func optDur(v *float64) string {
	if v == nil {
		return "-"
	}
	return dur(*v)
}

func pct(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", *v*100)
}
