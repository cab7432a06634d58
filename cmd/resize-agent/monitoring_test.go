package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// monitoringDir holds the dashboard and the rules, beside the manifests.
var monitoringDir = filepath.Join("..", "..", "deploy", "monitoring")

// external are the metrics the dashboard takes from elsewhere: Prometheus'
// own up, and kube-state-metrics' kube_pod_info for namespace and pod names.
var external = map[string]bool{"up": true, "kube_pod_info": true}

// TestMonitoringUsesExportedMetrics fails when a dashboard panel, a
// template variable or a rule names a metric the agent does not export. The
// metrics are what the daemon, wired by run, serves after a memory raise
// and a decrease, plus every metric the pressure collector can export
// (some need eBPF or PSI files).
func TestMonitoringUsesExportedMetrics(t *testing.T) {
	if _, err := os.Stat(monitoringDir); err != nil && os.Getenv("RESIZE_AGENT_REQUIRE_CGROUP2") == "1" {
		t.Skip("in the VM payload, without the repository's deploy/: the host run checks the dashboard")
	}
	exported := scrapeNames(t)
	// Kubernetes mode registers the prediction counter too (run.go); this
	// daemon runs without an API server, so take its names from a registry.
	kreg := prometheus.NewRegistry()
	metrics.NewVerdictPredictions(kreg)
	for n := range gatheredNames(t, kreg) {
		exported[n] = true
	}
	for _, n := range pressure.MetricNames() {
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			exported[n+s] = true
		}
	}
	used := map[string][]string{} // metric -> where
	dash, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	walk(d, "", func(path, key, v string) {
		switch key {
		case "expr":
			for _, n := range metricNames(v) {
				used[n] = append(used[n], "dashboard "+path)
			}
		case "definition":
			for _, m := range labelValues.FindAllStringSubmatch(v, -1) {
				used[m[1]] = append(used[m[1]], "dashboard variable "+path)
			}
		}
	})
	rules, err := os.ReadFile(filepath.Join(monitoringDir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r any
	if err := yaml.Unmarshal(rules, &r); err != nil {
		t.Fatalf("rules.yaml: %v", err)
	}
	recorded := map[string]bool{}
	walk(r, "", func(path, key, v string) {
		if key == "record" {
			recorded[v] = true
		}
	})
	walk(r, "", func(path, key, v string) {
		if key == "expr" {
			for _, n := range metricNames(v) {
				used[n] = append(used[n], "rules "+path)
			}
		}
	})
	if len(used) < 20 {
		t.Fatalf("found only %d metric names in the dashboard and rules: the extraction is broken", len(used))
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !exported[n] && !external[n] && !recorded[n] {
			t.Errorf("%s is not exported by the agent (used in %s)", n, strings.Join(used[n], ", "))
		}
	}
	// The check must be able to fail.
	if got := metricNames(`sum by (node) (rate(resize_agent_no_such_total{a="b"}[5m])) / on (node) up`); strings.Join(got, ",") != "resize_agent_no_such_total,up" {
		t.Errorf("metricNames = %v", got)
	}
}

var (
	labelValues = regexp.MustCompile(`label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	strLit      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	braces      = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	clauses     = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	ident       = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	keywords    = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges and grouping
// clauses are gone, that are not functions, aggregations or keywords.
func metricNames(expr string) []string {
	s := strLit.ReplaceAllString(expr, `""`)
	s = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m").Replace(s)
	for prev := ""; prev != s; {
		prev, s = s, braces.ReplaceAllString(s, " ")
	}
	s = clauses.ReplaceAllString(s, " ")
	var out []string
	seen := map[string]bool{}
	for _, m := range ident.FindAllStringSubmatch(s, -1) {
		name := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " ")
		if m[1] != "" || keywords[strings.ToLower(name)] || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// walk calls f for every string in a decoded JSON or YAML document.
func walk(v any, path string, f func(path, key, v string)) {
	switch x := v.(type) {
	case map[string]any:
		title, _ := x["title"].(string)
		if title == "" {
			title, _ = x["alert"].(string)
		}
		if title != "" {
			path += "/" + title
		}
		for k, c := range x {
			if s, ok := c.(string); ok {
				f(path, k, s)
			} else {
				walk(c, path, f)
			}
		}
	case []any:
		for _, c := range x {
			walk(c, path, f)
		}
	}
}

// gatheredNames returns the names of the metrics a registry holds.
func gatheredNames(t *testing.T, g prometheus.Gatherer) map[string]bool {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) == 0 {
		t.Fatal("nothing gathered: the metric registers no series before its first observation")
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// TestDashboardLayout fails when two panels share a place on the grid
// (Grafana then shuffles them on load) or an id.
func TestDashboardLayout(t *testing.T) {
	if _, err := os.Stat(monitoringDir); err != nil && os.Getenv("RESIZE_AGENT_REQUIRE_CGROUP2") == "1" {
		t.Skip("in the VM payload, without the repository's deploy/: the host run checks the dashboard")
	}
	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Panels) < 20 {
		t.Fatalf("only %d panels: the dashboard or its decoding is broken", len(d.Panels))
	}
	for _, e := range layoutErrors(d.Panels) {
		t.Error(e)
	}
	// The check must be able to fail.
	if e := layoutErrors([]panel{{ID: 1, Title: "a", Grid: grid{H: 8, W: 12}}, {ID: 1, Title: "b", Grid: grid{H: 1, W: 24, Y: 7}}}); len(e) != 2 {
		t.Errorf("layoutErrors on an overlap and a repeated id: %q", e)
	}
}

type grid struct{ H, W, X, Y int }

type panel struct {
	ID    int    `json:"id"`
	Title string `json:"title"`
	Grid  grid   `json:"gridPos"`
}

func layoutErrors(ps []panel) []string {
	var out []string
	ids := map[int]string{}
	for i, a := range ps {
		if prev, ok := ids[a.ID]; ok {
			out = append(out, fmt.Sprintf("panels %q and %q share id %d", prev, a.Title, a.ID))
		}
		ids[a.ID] = a.Title
		if a.Grid.W <= 0 || a.Grid.H <= 0 || a.Grid.X < 0 || a.Grid.X+a.Grid.W > 24 {
			out = append(out, fmt.Sprintf("panel %q: gridPos %+v outside the 24 columns", a.Title, a.Grid))
		}
		for _, b := range ps[i+1:] {
			g, h := a.Grid, b.Grid
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				out = append(out, fmt.Sprintf("panels %q %+v and %q %+v overlap", a.Title, g, b.Title, h))
			}
		}
	}
	return out
}

// scrapeNames runs the daemon on a fake tree, raises and then lowers a
// container's memory limit, and returns the names in /metrics.
func scrapeNames(t *testing.T) map[string]bool {
	t.Helper()
	root := cgrouptest.FakeTree(t, "/kubepods/pod1/web")
	o := DefaultOptions()
	o.StateDir = t.TempDir()
	o.CgroupRoot, o.skipFSCheck = root, true
	o.Socket = filepath.Join(t.TempDir(), "agent.sock")
	o.MetricsAddress = "127.0.0.1:0"
	o.CPUAllocatable, o.MemoryAllocatable = "2", "4Gi"
	addr := make(chan string, 1)
	o.onReady = func(a string) { addr <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, quiet) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var metricsAddr string
	select {
	case metricsAddr = <-addr:
	case err := <-done:
		t.Fatal(err)
	}
	c := api.NewClient(o.Socket)
	for _, mem := range []string{"256Mi", "128Mi"} {
		s := intent.Spec{Target: intent.Target{Name: "web", CgroupPath: "/kubepods/pod1/web"}, AllowMemoryBelowUsage: true}
		s.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)}
		s.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		it, _, err := c.Submit(wctx, s)
		if err == nil {
			it, err = c.WaitSettled(wctx, it.ID)
		}
		wcancel()
		if err != nil || it.Status.State != intent.Completed {
			t.Fatalf("resize to %s: %+v %v", mem, it.Status, err)
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.IndexAny(l, "{ "); i > 0 {
			names[l[:i]] = true
		}
	}
	io.Copy(io.Discard, resp.Body)
	return names
}

// TestEveryAlertHasARunbookAndTests fails when an alert of rules.yaml has
// no section in docs/runbook.md, a runbook_url that does not point at it,
// or no promtool case in rules_test.yaml where it fires and one where it
// stays quiet.
func TestEveryAlertHasARunbookAndTests(t *testing.T) {
	if _, err := os.Stat(monitoringDir); err != nil && os.Getenv("RESIZE_AGENT_REQUIRE_CGROUP2") == "1" {
		t.Skip("in the VM payload, without the repository's deploy/: the host run checks the rules")
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	for f, v := range map[string]any{"rules.yaml": &rules, "rules_test.yaml": &tests} {
		b, err := os.ReadFile(filepath.Join(monitoringDir, f))
		if err == nil {
			err = yaml.Unmarshal(b, v)
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	runbook, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, c := range tests.Tests {
		for _, a := range c.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !regexp.MustCompile(`(?m)^## ` + regexp.QuoteMeta(r.Alert) + `$`).Match(runbook) {
				t.Errorf("%s: no section \"## %s\" in docs/runbook.md", r.Alert, r.Alert)
			}
			if want := "docs/runbook.md#" + strings.ToLower(r.Alert); !strings.HasSuffix(r.Annotations["runbook_url"], want) {
				t.Errorf("%s: runbook_url %q does not end in %s", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: rules_test.yaml has it firing: %v, staying quiet: %v; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if n < 9 {
		t.Errorf("only %d alerts found in rules.yaml: the decoding is broken", n)
	}
}

// TestDashboardTakesContainerSeriesFromTheAgent fails when a panel reads a
// metric the agent names as cAdvisor does (container_*) without selecting
// the agent's job: where the kubelet's cAdvisor is scraped too, its series
// of the same name (without pod_uid, which "All" matches) would be summed
// in.
func TestDashboardTakesContainerSeriesFromTheAgent(t *testing.T) {
	if _, err := os.Stat(monitoringDir); err != nil && os.Getenv("RESIZE_AGENT_REQUIRE_CGROUP2") == "1" {
		t.Skip("in the VM payload, without the repository's deploy/: the host run checks the dashboard")
	}
	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	n := 0
	walk(d, "", func(path, key, v string) {
		if key != "expr" {
			return
		}
		for _, m := range cadvisorNamed.FindAllStringSubmatch(v, -1) {
			n++
			if !strings.Contains(m[2], `job=~".*resize-agent.*"`) {
				t.Errorf("%s: %s%s does not select job=~\".*resize-agent.*\"", path, m[1], m[2])
			}
		}
	})
	if n < 4 {
		t.Errorf("only %d container_* selectors found: the extraction is broken", n)
	}
}

var cadvisorNamed = regexp.MustCompile(`\b(container_[a-z_]+)(\{[^}]*\})?`)
