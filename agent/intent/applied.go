package intent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// Applied lists the cgroup files an intent wrote and verified, by cgroup,
// in the order written. On the wire it is an object keyed by cgroup path
// (keys sorted), as a map would be. It is a slice because the history
// holds up to 10,000 intents and a map per intent for its one or two
// cgroups was 600 bytes of the agent's heap for each (issue 16).
type Applied []AppliedCgroup

// AppliedCgroup is what an intent wrote to one cgroup.
type AppliedCgroup struct {
	Cgroup string
	Values []spec.Value
}

// Add appends values to cgroup's.
func (a *Applied) Add(cgroup string, values ...spec.Value) {
	for i := range *a {
		if (*a)[i].Cgroup == cgroup {
			(*a)[i].Values = append((*a)[i].Values, values...)
			return
		}
	}
	*a = append(*a, AppliedCgroup{Cgroup: cgroup, Values: values})
}

// Of returns what was written to cgroup (nil if nothing).
func (a Applied) Of(cgroup string) []spec.Value {
	for _, c := range a {
		if c.Cgroup == cgroup {
			return c.Values
		}
	}
	return nil
}

// MarshalJSON writes an object keyed by cgroup, keys sorted.
func (a Applied) MarshalJSON() ([]byte, error) {
	if a == nil {
		return []byte("null"), nil
	}
	sorted := slices.SortedFunc(slices.Values(a), func(x, y AppliedCgroup) int { return strings.Compare(x.Cgroup, y.Cgroup) })
	var b bytes.Buffer
	b.WriteByte('{')
	for i, c := range sorted {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(c.Cgroup)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(c.Values)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads the object MarshalJSON writes, in key order.
func (a *Applied) UnmarshalJSON(b []byte) error {
	var m map[string][]spec.Value
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("applied: %w", err)
	}
	if m == nil {
		*a = nil
		return nil
	}
	out := make(Applied, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, AppliedCgroup{Cgroup: k, Values: m[k]})
	}
	*a = out
	return nil
}
