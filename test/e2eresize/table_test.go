package e2eresize

import (
	"strings"
	"testing"
)

// TestCaseTable checks the extraction and the expected values without the
// VM: the case counts the docs give, unique names, the e2e's rollback and
// refusal rules, and the kubelet's pod cgroup formulas on known values.
func TestCaseTable(t *testing.T) {
	t.Setenv("E2E_RESIZE_ALL", "") // the default set, whatever the run asks for
	all, def, refusals := 0, 0, 0
	names := map[string]bool{}
	for _, tc := range cases() {
		all++
		if selected(tc.name, nil) {
			def++
		}
		if names[tc.name] {
			t.Errorf("case %q twice", tc.name)
		}
		names[tc.name] = true
		if tc.refuse != "" {
			refusals++
		}
		if tc.noRollback != (tc.name == "burstable/extended/5 containers") {
			t.Errorf("%s: noRollback %v; the e2e rolls back every case but the extended one", tc.name, tc.noRollback)
		}
		if tc.needsSpec && !strings.Contains(tc.name, "memory requests") {
			t.Errorf("%s: needsSpec is for the memory request alone", tc.name)
		}
	}
	if all != 56 || def != 29 || refusals != 7 {
		t.Errorf("%d cases, %d by default, %d refusals; docs/testing.md says 56, 29, 7", all, def, refusals)
	}
	// One CPU of requests: the kubelet's pod cpu.weight is 39 (its own
	// linear conversion of 1024 shares, not runc's container formula);
	// the pod's cpu.max and memory.max sum the containers' limits.
	pod := podFiles([]rr{{cpuReq: "1", cpuLim: "2", memReq: "64Mi", memLim: "100Mi"}})
	want := files{"cpu.weight": "39", "cpu.max": "200000 100000", "memory.max": "104857600"}
	for f, v := range want {
		if pod[f] != v {
			t.Errorf("pod %s = %s, want %s", f, pod[f], v)
		}
	}
	// A container without a limit leaves the pod's unlimited.
	if pod := podFiles([]rr{{cpuReq: "20m", cpuLim: "30m", memLim: "45Mi"}, {cpuReq: "20m"}}); pod["cpu.max"] != "max 100000" || pod["memory.max"] != "max" {
		t.Errorf("pod with an unlimited container: %v", pod)
	}
	if c := containerFiles(rr{cpuReq: "20m", cpuLim: "30m", memLim: "45Mi"}); c["cpu.max"] != "3000 100000" || c["memory.max"] != "47185920" {
		t.Errorf("container files %v", c)
	}
}
