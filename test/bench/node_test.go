package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNodeTable(t *testing.T) {
	f := filepath.Join(t.TempDir(), "node.json")
	if err := os.WriteFile(f, []byte(`{"kubelet":"v1.37.2","blocks":["kubelet alone","with the agent"],"rows":[
		{"mode":"kubelet alone","what":"cgroup","seconds":[3,1,2]},
		{"mode":"with the agent","what":"cgroup","seconds":[4,2]},
		{"mode":"with the agent","what":"agent cgroup","seconds":[1.5]},
		{"mode":"with the agent, eBPF off","what":"cgroup","seconds":[2.5]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var w strings.Builder
	if err := nodeTable(&w, f); err != nil {
		t.Fatal(err)
	}
	got := w.String()
	for _, want := range []string{
		"kubelet v1.37.2",
		"| the container's `cpu.max` and `memory.max` hold the new values (read from inside it every 200 ms) | 2.00 | 3.00 | 3.00 | 4.00 | 1.5× | 2.50 | 2.50 | 1.2× |",
		"| the agent's phases: the kernel's time of the last limit write (eBPF) or its read | - | - | 1.50 | 1.50 | - | - | - | - |",
		"the kubelet does it alone (the agent's DaemonSet deleted; 3 resizes), with the agent beside it (2) and with the agent without its eBPF programs (`--bpf=off`, 1)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "patch answered") || strings.Contains(got, "the API server answered") {
		t.Errorf("a measurement without values rendered:\n%s", got)
	}
	if err := nodeTable(&w, filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing file rendered without an error")
	}
}
