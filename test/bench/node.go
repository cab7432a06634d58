package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

// nodeBench is the JSON test/node TestResizeBench writes (its NodeBench):
// per mode and measurement, the seconds of each resize.
type nodeBench struct {
	Kubelet string   `json:"kubelet"`
	Blocks  []string `json:"blocks"`
	Rows    []struct {
		Mode    string    `json:"mode"`
		What    string    `json:"what"`
		Seconds []float64 `json:"seconds"`
	} `json:"rows"`
}

const (
	nodeAlone    = "kubelet alone"
	nodeAgent    = "with the agent"
	nodeAgentOff = "with the agent, eBPF off"
)

// nodeWhat says what each measurement of the node bench is.
var nodeWhat = []struct{ key, text string }{
	{"patch answered", "the API server answered the patch"},
	{"admitted", "the kubelet's admission seen (PodResizeInProgress or observedGeneration, polled every 100 ms)"},
	{"cgroup", "the container's `cpu.max` and `memory.max` hold the new values (read from inside it every 200 ms)"},
	{"status", "`status.containerStatuses[].resources` reports them (polled every 100 ms)"},
	{"kubelet", "the kubelet's own `kubelet_pod_resize_duration_milliseconds` for the resize"},
	{"agent accepted", "the agent's phases: the API server's time of the change (whole seconds) to the agent seeing it"},
	{"agent admitted", "the agent's phases, from seeing the change: the kubelet's admission"},
	{"agent cgroup", "the agent's phases: the kernel's time of the last limit write (eBPF) or its read"},
	{"agent status", "the agent's phases: the status reporting the values"},
}

// nodeTable renders the Kubernetes resize on the real node: the kubelet
// alone beside the kubelet with the agent, per measurement.
func nodeTable(w *strings.Builder, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var nb nodeBench
	if err := json.Unmarshal(b, &nb); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	get := func(mode, what string) []float64 {
		for _, r := range nb.Rows {
			if r.Mode == mode && r.What == what {
				return r.Seconds
			}
		}
		return nil
	}
	sorted := func(v []float64) []float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s
	}
	cell := func(v []float64) string {
		if len(v) == 0 {
			return "- | -"
		}
		s := sorted(v)
		return fmt.Sprintf("%.2f | %.2f", median(s), s[len(s)-1])
	}
	vs := func(v, alone []float64) string {
		if len(v) == 0 || len(alone) == 0 {
			return "-"
		}
		return ratio(median(sorted(v)), median(sorted(alone)))
	}
	n := func(mode string) int {
		for _, r := range nb.Rows {
			if r.Mode == mode {
				return len(r.Seconds)
			}
		}
		return 0
	}
	fmt.Fprintf(w, "\n**A Kubernetes resize on the real node** (test/node `TestResizeBench`: the `make test-node` VM, kubelet %s, systemd cgroup driver, 1 vCPU under TCG): the same resize through `pods/resize` (CPU limit 500m ↔ 800m, request 100m ↔ 200m, memory limit 64Mi ↔ 96Mi, in place), as the kubelet does it alone (the agent's DaemonSet deleted; %d resizes), with the agent beside it (%d) and with the agent without its eBPF programs (`--bpf=off`, %d), in blocks %s, each block's first resize not counted; seconds from the patch being sent, on the host's clock.\n\n",
		nb.Kubelet, n(nodeAlone), n(nodeAgent), n(nodeAgentOff), strings.Join(nb.Blocks, ", "))
	w.WriteString("| measurement | alone p50 s | max s | with the agent p50 s | max s | vs alone | eBPF off p50 s | max s | vs alone |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, m := range nodeWhat {
		alone, with, off := get(nodeAlone, m.key), get(nodeAgent, m.key), get(nodeAgentOff, m.key)
		if len(alone) == 0 && len(with) == 0 && len(off) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", m.text, cell(alone), cell(with), vs(with, alone), cell(off), vs(off, alone))
	}
	return nil
}

// median of sorted values.
func median(s []float64) float64 {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
