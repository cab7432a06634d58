package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The dashboard's panels drawn from a real run (NODE_PROMETHEUS=DIR, set by
// `make dashboard-images`): Prometheus (RESIZE_AGENT_PROMETHEUS, built from
// the module proxy by test/tools.sh) runs on the host and scrapes the
// agent's pod every promScrape through a kubectl port-forward, as a
// ServiceMonitor would through the pod network; after the run each panel's
// queries, taken from deploy/monitoring/dashboard.json, are evaluated over
// the run with the HTTP API and written to DIR/<panel>.tsv, which
// docs/img/dashboard.sh draws with gnuplot.

const (
	promScrape = 2 * time.Second
	// promRate stands for Grafana's $__rate_interval: 15 scrapes, so that
	// a resize's counts show for a while rather than one step.
	promRate = "30s"
	promStep = 2 * time.Second
	// Local ports, in the test's network namespace.
	promPort    = "19090"
	forwardPort = "19847"
)

// promPanels are the dashboard panels drawn, by title, with the file each
// goes to.
var promPanels = []struct{ title, file string }{
	{"Kubernetes resize latency p50 / p99 by phase", "kube-resize-latency"},
	{"Kubernetes resizes by outcome", "kube-resizes-by-outcome"},
	{"CPU throttled time", "cpu-throttled"},
	{"CPU and memory pressure (PSI some)", "psi"},
	{"Limits in force (cgroup)", "limits"},
}

type promRun struct {
	dir, node, podUID string
	start             time.Time
	base              string
	mu                sync.Mutex
	marks             []promMark
}

type promMark struct {
	at    time.Time
	label string
}

func startPrometheus(t *testing.T, c *cluster, agent *corev1.Pod, node, dir string) *promRun {
	t.Helper()
	bin := os.Getenv("RESIZE_AGENT_PROMETHEUS")
	if bin == "" {
		t.Fatal("NODE_PROMETHEUS is set without RESIZE_AGENT_PROMETHEUS (test/tools.sh prometheus builds it; make dashboard-images sets both)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	// The port-forward, started again whenever it ends (the API server or
	// the kubelet may drop the stream).
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig, "-n", agentNS, "port-forward", "pod/"+agent.Name, forwardPort+":9847")
			out, err := cmd.CombinedOutput()
			if ctx.Err() == nil {
				t.Logf("prometheus: the port-forward ended (%v): %s; again", err, strings.TrimSpace(string(out)))
				time.Sleep(time.Second)
			}
		}
	}()

	work := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: %s
  scrape_timeout: %s
scrape_configs:
  - job_name: resize-agent
    static_configs:
      - targets: ["127.0.0.1:%s"]
        labels: {node: %q}
`, promScrape, promScrape, forwardPort, node)
	if err := os.WriteFile(filepath.Join(work, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(work, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(work, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(work, "data"), "--web.listen-address=127.0.0.1:"+promPort)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); cmd.Wait(); logf.Close() }()
	r := &promRun{dir: dir, node: node, start: time.Now(), base: "http://127.0.0.1:" + promPort}
	// Ready, and the agent scraped.
	poll(t, "Prometheus scraping the agent", time.Second, func() (bool, error) {
		v, err := r.query(`up{job="resize-agent"}`, time.Now())
		if err != nil {
			return false, err
		}
		return len(v) == 1 && v[0].value == 1, fmt.Errorf("up: %+v", v)
	})
	r.start = time.Now().Truncate(time.Second) // the range's points fall on whole seconds
	t.Logf("prometheus: scraping %s's agent %s every %s through a port-forward", node, agent.Name, promScrape)
	return r
}

func (r *promRun) mark(label string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marks = append(r.marks, promMark{time.Now(), label})
}

// extraResizes: four more CPU resizes of web, in place, 20 s apart, so
// that the latency and outcome panels hold more than the walkthrough's two.
func (r *promRun) extraResizes(t *testing.T, c *cluster) {
	for i, lim := range []string{"250m", "300m", "250m", "300m"} {
		time.Sleep(20 * time.Second)
		r.mark(fmt.Sprintf("cpu %s", lim))
		patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"web","resources":{"limits":{"cpu":%q}}}]}}`, lim)
		if _, err := c.try("patch", "pod", "web", "--subresource", "resize", "--patch", patch); err != nil {
			t.Errorf("extra resize %d: %v", i+1, err)
		}
	}
	time.Sleep(45 * time.Second) // the last one's after-window and a few scrapes
}

type promSample struct {
	metric map[string]string
	value  float64
}

type promSeries struct {
	metric map[string]string
	values [][2]float64 // unix seconds, value
}

func (r *promRun) api(path string, q url.Values, into any) error {
	resp, err := http.Get(r.base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %s: %s", path, q.Get("query"), body.Error)
	}
	return json.Unmarshal(body.Data, into)
}

func (r *promRun) query(q string, at time.Time) ([]promSample, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := r.api("/api/v1/query", url.Values{"query": {q}, "time": {unix(at)}}, &data); err != nil {
		return nil, err
	}
	var out []promSample
	for _, s := range data.Result {
		v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		out = append(out, promSample{s.Metric, v})
	}
	return out, nil
}

func (r *promRun) queryRange(q string, from, to time.Time) ([]promSeries, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	}
	if err := r.api("/api/v1/query_range", url.Values{"query": {q}, "start": {unix(from)}, "end": {unix(to)},
		"step": {strconv.FormatFloat(promStep.Seconds(), 'f', -1, 64)}}, &data); err != nil {
		return nil, err
	}
	var out []promSeries
	for _, s := range data.Result {
		ps := promSeries{metric: s.Metric}
		for _, v := range s.Values {
			ts, _ := v[0].(float64)
			x, err := strconv.ParseFloat(fmt.Sprint(v[1]), 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			ps.values = append(ps.values, [2]float64{ts, x})
		}
		out = append(out, ps)
	}
	return out, nil
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 3, 64) }

// dashboardPanel is the part of a panel of dashboard.json drawn here.
type dashboardPanel struct {
	Title   string           `json:"title"`
	Type    string           `json:"type"`
	Panels  []dashboardPanel `json:"panels"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options string `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
}

func dashboardPanels(t *testing.T) map[string]dashboardPanel {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "monitoring", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]dashboardPanel{}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			out[p.Title] = p
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var legendRE = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// draw evaluates the panels' queries over the run and writes one TSV per
// panel: a header of comments (title, unit, the resizes' marks), the
// column names, then seconds into the run and one column per series.
func (r *promRun) draw(t *testing.T) {
	t.Helper()
	end := time.Now()
	panels := dashboardPanels(t)
	r.mu.Lock()
	marks := append([]promMark(nil), r.marks...)
	r.mu.Unlock()
	vars := strings.NewReplacer(`$node`, regexp.QuoteMeta(r.node), `$pod_uid`, regexp.QuoteMeta(r.podUID),
		`$__rate_interval`, promRate, `$__range`, fmt.Sprintf("%ds", int(end.Sub(r.start).Seconds())))
	for _, want := range promPanels {
		p, ok := panels[want.title]
		if !ok || len(p.Targets) == 0 {
			t.Errorf("dashboard.json has no panel %q with queries", want.title)
			continue
		}
		type col struct {
			name string
			at   map[int64]float64
		}
		var cols []col
		var queries []string
		for _, tg := range p.Targets {
			q := vars.Replace(tg.Expr)
			queries = append(queries, q)
			series, err := r.queryRange(q, r.start, end)
			if err != nil {
				t.Errorf("panel %q: %v", want.title, err)
				continue
			}
			sort.Slice(series, func(i, j int) bool { return fmt.Sprint(series[i].metric) < fmt.Sprint(series[j].metric) })
			for _, s := range series {
				name := legendRE.ReplaceAllStringFunc(tg.LegendFormat, func(m string) string {
					return s.metric[legendRE.FindStringSubmatch(m)[1]]
				})
				if name == "" {
					name = fmt.Sprint(s.metric)
				}
				if s.metric["pod_uid"] != "" {
					name = strings.TrimSpace(strings.ReplaceAll(name, s.metric["pod_uid"], ""))
				}
				// A restarted container is a second series of the same
				// name (its id label differs).
				for _, o := range cols {
					if o.name == name && s.metric["id"] != "" {
						name += " (" + shortID(s.metric["id"]) + ")"
						break
					}
				}
				c := col{name: name, at: map[int64]float64{}}
				for _, v := range s.values {
					c.at[int64(math.Round(v[0]))-r.start.Unix()] = v[1]
				}
				cols = append(cols, c)
			}
		}
		if len(cols) == 0 {
			t.Errorf("panel %q: no series over the run (queries %q)", want.title, queries)
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# title: %s\n# unit: %s\n", p.Title, p.FieldConfig.Defaults.Unit)
		// Series the dashboard puts on the right axis, with their unit.
		for _, o := range p.FieldConfig.Overrides {
			if o.Matcher.ID != "byRegexp" {
				continue
			}
			var right bool
			unit := ""
			for _, pr := range o.Properties {
				right = right || (pr.ID == "custom.axisPlacement" && pr.Value == "right")
				if pr.ID == "unit" {
					unit = fmt.Sprint(pr.Value)
				}
			}
			if right {
				fmt.Fprintf(&b, "# y2: %s %s\n", unit, o.Matcher.Options)
			}
		}
		for _, q := range queries {
			fmt.Fprintf(&b, "# query: %s\n", q)
		}
		for _, m := range marks {
			fmt.Fprintf(&b, "# mark: %.0f %s\n", m.at.Sub(r.start).Seconds(), m.label)
		}
		fmt.Fprintf(&b, "# source: test/node TestWalkthrough, NODE_PROMETHEUS; %s, %d s, one scrape every %s, $__rate_interval %s\n",
			r.start.UTC().Format("2006-01-02 15:04 MST"), int(end.Sub(r.start).Seconds()), promScrape, promRate)
		b.WriteString("seconds")
		for _, c := range cols {
			b.WriteString("\t" + c.name)
		}
		b.WriteString("\n")
		n := 0
		for s := int64(0); s <= int64(end.Sub(r.start).Seconds()); s += int64(promStep.Seconds()) {
			b.WriteString(strconv.FormatInt(s, 10))
			for _, c := range cols {
				if v, ok := c.at[s]; ok {
					b.WriteString("\t" + strconv.FormatFloat(v, 'g', 6, 64))
					n++
				} else {
					b.WriteString("\tNaN")
				}
			}
			b.WriteString("\n")
		}
		f := filepath.Join(r.dir, want.file+".tsv")
		if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("prometheus: panel %q: %d series, %d points -> %s", want.title, len(cols), n, f)
	}
}

func shortID(id string) string {
	if i := strings.LastIndexAny(id, "/:-"); i >= 0 {
		id = id[i+1:]
	}
	if len(id) > 8 {
		id = id[:8]
	}
	return id
}
