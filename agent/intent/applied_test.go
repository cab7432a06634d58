package intent

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// TestAppliedWire: Applied is written as the map it replaced was, keys
// sorted, and reads back the same.
func TestAppliedWire(t *testing.T) {
	var a Applied
	a.Add("/kubepods/pod1/c", spec.Value{File: "cpu.max", Data: "50000 100000"})
	a.Add("/kubepods/pod1", spec.Value{File: "memory.max", Data: "max"})
	a.Add("/kubepods/pod1/c", spec.Value{File: "memory.max", Data: "1048576"})
	asMap := map[string][]spec.Value{
		"/kubepods/pod1/c": {{File: "cpu.max", Data: "50000 100000"}, {File: "memory.max", Data: "1048576"}},
		"/kubepods/pod1":   {{File: "memory.max", Data: "max"}},
	}
	got, err := json.Marshal(Status{Applied: a})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(struct {
		Status
		Applied map[string][]spec.Value `json:"applied,omitempty"`
	}{Applied: asMap})
	if string(got) != string(want) {
		t.Errorf("wire form\n got %s\nwant %s", got, want)
	}
	var back Status
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Applied) != 2 || !reflect.DeepEqual(back.Applied.Of("/kubepods/pod1/c"), asMap["/kubepods/pod1/c"]) ||
		!reflect.DeepEqual(back.Applied.Of("/kubepods/pod1"), asMap["/kubepods/pod1"]) {
		t.Errorf("read back %+v", back.Applied)
	}
	if b, _ := json.Marshal(Status{}); string(b) != `{"state":"","acceptedAt":"0001-01-01T00:00:00Z","updatedAt":"0001-01-01T00:00:00Z"}` {
		t.Errorf("empty Applied written: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"applied":["x"]}`), &back); err == nil {
		t.Error("an array was read as Applied")
	}
	if a.Of("/elsewhere") != nil {
		t.Error("Of a cgroup not written")
	}
}
