package journal

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/intent"
)

// appendRecord appends r's JSON as json.Marshal writes it, field for field
// and byte for byte, without reflection. Every intent is encoded at least
// twice (accepted, and its outcome), and under TCG encoding/json took
// 180 µs of the 1.8 ms a resize spent in the agent, the record of its
// acceptance being on the path of the answer (issue 16); this takes a
// third of its time. What it does not write itself (a ResourceClaim, a
// string that needs escaping) goes through encoding/json.
// TestAppendRecordMatchesMarshal holds it to json.Marshal's bytes for
// records with every field set at random, so that a field added to these
// types (ours or Kubernetes') fails the test rather than go missing from
// the journal.
func appendRecord(b []byte, r *Record) ([]byte, error) {
	e := encoder{b: b}
	e.raw(`{"seq":`)
	e.b = strconv.AppendUint(e.b, r.Seq, 10)
	e.raw(`,"container":`)
	e.str(r.Container)
	e.raw(`,"intent":`)
	e.intent(&r.Intent)
	if rs := r.Resources; rs != nil {
		e.raw(`,"resources":{"cpuRequestMilli":`)
		e.b = strconv.AppendInt(e.b, rs.CPURequest, 10)
		e.raw(`,"cpuLimitMilli":`)
		e.b = strconv.AppendInt(e.b, rs.CPULimit, 10)
		e.raw(`,"memoryRequestBytes":`)
		e.b = strconv.AppendInt(e.b, rs.MemoryRequest, 10)
		e.raw(`,"memoryLimitBytes":`)
		e.b = strconv.AppendInt(e.b, rs.MemoryLimit, 10)
		e.raw(`,"cpu":`)
		e.b = strconv.AppendBool(e.b, rs.CPU)
		e.raw(`,"memory":`)
		e.b = strconv.AppendBool(e.b, rs.Memory)
		e.raw(`}`)
	}
	if r.Restarting != "" {
		e.raw(`,"restarting":`)
		e.str(r.Restarting)
	}
	e.raw(`}`)
	return e.b, e.err
}

type encoder struct {
	b   []byte
	err error
}

func (e *encoder) raw(s string) { e.b = append(e.b, s...) }

// str writes s as encoding/json does. The strings of a record (IDs, paths,
// names, messages) need no escaping but for the odd message: those go to
// encoding/json, which escapes HTML characters and replaces invalid UTF-8.
func (e *encoder) str(s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			e.marshal(s)
			return
		}
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, s...)
	e.b = append(e.b, '"')
}

// field writes ,"name": and s, unless s is empty (omitempty).
func (e *encoder) field(name, s string) {
	if s != "" {
		e.b = append(e.b, ',', '"')
		e.b = append(e.b, name...)
		e.b = append(e.b, '"', ':')
		e.str(s)
	}
}

func (e *encoder) marshal(v any) {
	js, err := json.Marshal(v)
	if err != nil && e.err == nil {
		e.err = err
	}
	e.b = append(e.b, js...)
}

func (e *encoder) time(t time.Time) {
	if y := t.Year(); y < 0 || y > 9999 {
		e.marshal(t) // json.Marshal's error
		return
	}
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.b = append(e.b, '"')
}

func (e *encoder) intent(in *intent.Intent) {
	e.raw(`{"id":`)
	e.str(in.ID)
	e.field("origin", string(in.Origin))
	e.raw(`,"spec":`)
	e.spec(&in.Spec)
	e.raw(`,"status":`)
	e.status(&in.Status)
	e.raw(`}`)
}

func (e *encoder) spec(s *intent.Spec) {
	e.raw(`{`)
	if s.ID != "" {
		e.raw(`"id":`)
		e.str(s.ID)
		e.raw(`,`)
	}
	e.raw(`"target":{"name":`)
	e.str(s.Target.Name)
	e.field("cgroupPath", s.Target.CgroupPath)
	e.field("podUID", s.Target.PodUID)
	e.field("containerID", s.Target.ContainerID)
	e.field("podCgroupPath", s.Target.PodCgroupPath)
	e.raw(`},"resources":{`)
	rr := &s.Resources
	sep := ""
	if len(rr.Limits) > 0 {
		e.raw(`"limits":`)
		e.list(rr.Limits)
		sep = ","
	}
	if len(rr.Requests) > 0 {
		e.raw(sep)
		e.raw(`"requests":`)
		e.list(rr.Requests)
		sep = ","
	}
	if len(rr.Claims) > 0 {
		e.raw(sep)
		e.raw(`"claims":`)
		e.marshal(rr.Claims)
	}
	e.raw(`}`)
	if len(s.ResizePolicy) > 0 {
		e.raw(`,"resizePolicy":[`)
		for i, p := range s.ResizePolicy {
			if i > 0 {
				e.raw(`,`)
			}
			e.raw(`{"resourceName":`)
			e.str(string(p.ResourceName))
			e.raw(`,"restartPolicy":`)
			e.str(string(p.RestartPolicy))
			e.raw(`}`)
		}
		e.raw(`]`)
	}
	if s.AllowMemoryBelowUsage {
		e.raw(`,"allowMemoryBelowUsage":true`)
	}
	if s.Priority != 0 {
		e.raw(`,"priority":`)
		e.b = strconv.AppendInt(e.b, int64(s.Priority), 10)
	}
	e.raw(`}`)
}

// list writes a ResourceList as encoding/json writes a map: keys sorted.
// A list holds cpu and memory, so the keys are sorted on the stack.
func (e *encoder) list(l corev1.ResourceList) {
	var small [4]corev1.ResourceName
	keys := small[:0]
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	e.raw(`{`)
	for i, k := range keys {
		if i > 0 {
			e.raw(`,`)
		}
		e.str(string(k))
		e.raw(`:"`)
		// Quantity.MarshalJSON's text without its allocation.
		q := l[k]
		var buf [32]byte
		number, suffix := q.CanonicalizeBytes(buf[:0])
		e.b = append(e.b, number...)
		e.b = append(e.b, suffix...)
		e.raw(`"`)
	}
	e.raw(`}`)
}

func (e *encoder) status(s *intent.Status) {
	e.raw(`{"state":`)
	e.str(string(s.State))
	e.field("reason", s.Reason)
	e.field("message", s.Message)
	e.raw(`,"acceptedAt":`)
	e.time(s.AcceptedAt)
	e.raw(`,"updatedAt":`)
	e.time(s.UpdatedAt)
	if s.CompletedAt != nil {
		e.raw(`,"completedAt":`)
		e.time(*s.CompletedAt)
	}
	if s.Attempts != 0 {
		e.raw(`,"attempts":`)
		e.b = strconv.AppendInt(e.b, int64(s.Attempts), 10)
	}
	e.field("supersededBy", s.SupersededBy)
	if len(s.Applied) > 0 {
		e.raw(`,"applied":`)
		e.applied(s.Applied)
	}
	e.field("via", s.Via)
	if s.Restarted {
		e.raw(`,"restarted":true`)
	}
	e.field("containerID", s.ContainerID)
	e.raw(`}`)
}

// applied writes what Applied.MarshalJSON does: an object keyed by cgroup,
// keys sorted.
func (e *encoder) applied(a intent.Applied) {
	var small [2]intent.AppliedCgroup
	sorted := append(small[:0], a...)
	slices.SortFunc(sorted, func(x, y intent.AppliedCgroup) int { return strings.Compare(x.Cgroup, y.Cgroup) })
	e.raw(`{`)
	for i, c := range sorted {
		if i > 0 {
			e.raw(`,`)
		}
		e.str(c.Cgroup)
		e.raw(`:`)
		if c.Values == nil {
			e.raw(`null`)
			continue
		}
		e.raw(`[`)
		for j, v := range c.Values {
			if j > 0 {
				e.raw(`,`)
			}
			e.raw(`{"File":`)
			e.str(v.File)
			e.raw(`,"Data":`)
			e.str(v.Data)
			e.raw(`}`)
		}
		e.raw(`]`)
	}
	e.raw(`}`)
}
