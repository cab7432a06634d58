package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func ctl(t *testing.T, sock string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"--socket", sock}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestResizeGetListContainersNode(t *testing.T) {
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 2000, Memory: 4 << 30}, "/pod/web", "/pod/db")
	code, out, errs := ctl(t, s.Socket, "resize", "web", "--cgroup", "/pod/web", "--cpu-request", "500m", "--cpu-limit", "1", "--memory-limit", "256Mi", "--id", "r1")
	if code != exitOK || !strings.Contains(out, "Completed") || !strings.Contains(out, "r1") {
		t.Fatalf("resize: %d %q %q", code, out, errs)
	}
	if got := cgrouptest.ReadFile(t, s.Root, "/pod/web", "cpu.max"); got != "100000 100000" {
		t.Errorf("cpu.max %s", got)
	}
	// Infeasible exits 3 and says how much was asked and is allocatable.
	code, out, _ = ctl(t, s.Socket, "resize", "db", "--cgroup", "/pod/db", "--cpu-request", "8")
	if code != exitOutcome || !strings.Contains(out, "Infeasible") || !strings.Contains(out, "requested 8, free 1500m, allocatable 2") {
		t.Errorf("infeasible: %d %q", code, out)
	}
	// Deferred exits 0 and is shown as such.
	code, out, _ = ctl(t, s.Socket, "resize", "db", "--cgroup", "/pod/db", "--cpu-request", "1600m")
	if code != exitOK || !strings.Contains(out, "Deferred") {
		t.Errorf("deferred: %d %q", code, out)
	}
	code, out, _ = ctl(t, s.Socket, "get", "r1", "-o", "json")
	var it intent.Intent
	if code != exitOK || json.Unmarshal([]byte(out), &it) != nil || it.Status.State != intent.Completed {
		t.Errorf("get: %d %q", code, out)
	}
	code, out, _ = ctl(t, s.Socket, "list", "--state", "Infeasible")
	if code != exitOK || strings.Count(out, "Infeasible") != 2 { // state and reason columns
		t.Errorf("list: %d %q", code, out)
	}
	code, out, _ = ctl(t, s.Socket, "containers")
	if code != exitOK || !strings.Contains(out, "100000 100000") || !strings.Contains(out, "268435456") {
		t.Errorf("containers: %d %q", code, out)
	}
	code, out, _ = ctl(t, s.Socket, "node")
	if code != exitOK || !strings.Contains(strings.Join(strings.Fields(out), " "), "cpu 2 500m 1500m memory 4Gi 256Mi 3840Mi") {
		t.Errorf("node: %d %q", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 2000, Memory: 4 << 30}, "/c")
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"resize", "c"}, // no --cgroup
		{"resize", "c", "--cgroup", "/c", "--cpu-limit", "x"}, // bad quantity
		{"get"},
		{"list", "-o", "yaml"},
	} {
		if code, _, _ := ctl(t, s.Socket, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	// A server-side rejection is an error, with the server's reason.
	code, _, errs := ctl(t, s.Socket, "resize", "c", "--cgroup", "/../etc", "--cpu-limit", "1")
	if code != exitError || !strings.Contains(errs, "422") {
		t.Errorf("escape: %d %q", code, errs)
	}
	code, _, errs = ctl(t, "/nonexistent.sock", "node")
	if code != exitError || !strings.Contains(errs, "nonexistent.sock") {
		t.Errorf("no agent: %d %q", code, errs)
	}
}

// TestListShowsOrigin: get and list say who asked for each intent.
func TestListShowsOrigin(t *testing.T) {
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 2000, Memory: 4 << 30}, "/pod/web")
	if code, out, errs := ctl(t, s.Socket, "resize", "web", "--cgroup", "/pod/web", "--cpu-request", "500m", "--id", "r1"); code != exitOK {
		t.Fatalf("resize: %d %q %q", code, out, errs)
	}
	for _, args := range [][]string{{"get", "r1"}, {"list"}} {
		code, out, _ := ctl(t, s.Socket, args...)
		if lines := strings.Split(out, "\n"); code != exitOK || len(lines) < 2 || !strings.Contains(lines[0], "ORIGIN") || !strings.Contains(lines[1], " api ") {
			t.Errorf("%s: %d %q", args[0], code, out)
		}
	}
	code, out, _ := ctl(t, s.Socket, "get", "r1", "-o", "json")
	if code != exitOK || !strings.Contains(out, `"origin": "api"`) {
		t.Errorf("get -o json: %d %q", code, out)
	}
}
