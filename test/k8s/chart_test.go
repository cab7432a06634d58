package k8s_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/yaml"
)

// helmBinary is helm v4, built from the module proxy by test/tools.sh
// (test/k8s/run.sh sets RESIZE_AGENT_HELM). Without it the chart tests skip,
// unless RESIZE_AGENT_REQUIRE_HELM=1 (make test) makes that a failure.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RESIZE_AGENT_HELM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if os.Getenv("RESIZE_AGENT_REQUIRE_HELM") == "1" {
		t.Fatal("helm not found (RESIZE_AGENT_HELM unset, none on PATH); test/tools.sh helm builds it")
	}
	t.Skip("helm not found: test/k8s/run.sh builds it (test/tools.sh helm) and runs these tests")
	return ""
}

func chartDir(t *testing.T) string {
	return filepath.Join(repoRoot(t), "deploy", "helm", "resize-agent")
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stderr.String(), out)
	}
	return out
}

// objects decodes a multi-document YAML stream into maps keyed by
// kind/namespace/name, without the labels only Helm adds.
func objects(t *testing.T, what string, b []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(o) == 0 {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		if l, ok := md["labels"].(map[string]any); ok {
			delete(l, "helm.sh/chart")
			delete(l, "app.kubernetes.io/managed-by")
		}
		key := fmt.Sprintf("%s/%v/%v", o["kind"], md["namespace"], md["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s: %s twice", what, key)
		}
		out[key] = o
	}
	return out
}

// kustomized builds deploy/base, with the monitoring components when
// monitored, as YAML.
func kustomized(t *testing.T, monitored bool) []byte {
	t.Helper()
	fsys := deployFS(t)
	dir := "/deploy/base"
	if monitored {
		dir = "/deploy/overlays/chart-compare"
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n  - ../../components/servicemonitor\n  - ../../monitoring\n"
		if err := fsys.WriteFile(dir+"/kustomization.yaml", []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	b, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHelmChartMatchesKustomize: the chart's default output and deploy/base
// describe the same objects (namespace, service account, RBAC, policies,
// DaemonSet, Service), and with the monitoring toggles on, the same
// ServiceMonitor, PrometheusRule and dashboard as the kustomize components;
// so the two ways to install cannot drift apart.
func TestHelmChartMatchesKustomize(t *testing.T) {
	helm(t, "lint", "--strict", chartDir(t))
	for _, tc := range []struct {
		name      string
		set       []string
		monitored bool
	}{
		{"defaults", nil, false},
		{"monitoring on", []string{"--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true,dashboard.enabled=true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "resize-agent", chartDir(t), "--namespace", "resize-agent"}, tc.set...)
			got := objects(t, "helm template", helm(t, args...))
			want := objects(t, "kustomize", kustomized(t, tc.monitored))
			var keys []string
			for k := range want {
				keys = append(keys, k)
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					keys = append(keys, k)
				}
			}
			sort.Strings(keys)
			for _, k := range keys {
				g, w := got[k], want[k]
				switch {
				case g == nil:
					t.Errorf("%s: in deploy/ but not in the chart", k)
				case w == nil:
					t.Errorf("%s: in the chart but not in deploy/", k)
				case !reflect.DeepEqual(g, w):
					gb, _ := yaml.Marshal(g)
					wb, _ := yaml.Marshal(w)
					t.Errorf("%s differs:\n--- chart\n%s\n--- deploy/\n%s", k, gb, wb)
				}
			}
			if len(want) < 6 {
				t.Errorf("only %d objects compared", len(want))
			}
		})
	}
	// The chart carries copies of the rules and the dashboard (Helm reads
	// files inside the chart only): they must be the same bytes.
	for _, f := range []string{"rules.yaml", "dashboard.json"} {
		a, err1 := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "monitoring", f))
		b, err2 := os.ReadFile(filepath.Join(chartDir(t), "files", f))
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("deploy/helm/resize-agent/files/%s differs from deploy/monitoring/%s (copy it): %v %v", f, f, err1, err2)
		}
	}
}

// The values a user sets reach the DaemonSet.
func TestHelmChartValues(t *testing.T) {
	out := string(helm(t, "template", "resize-agent", chartDir(t), "--namespace", "ops",
		"--set", "image.repository=registry.local/ra,image.tag=dev,drift=report,reserved.cpu=500m,reserved.memory=1Gi,bpf=on,namespace.create=false",
		"--set", "extraArgs={--resync-interval=30s}"))
	for _, want := range []string{"image: \"registry.local/ra:dev\"", "- --drift=report", "- --cpu-reserved=500m", "- --memory-reserved=1Gi",
		"- --bpf=on", "- --resync-interval=30s", "namespace: ops"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm template lacks %q", want)
		}
	}
	if strings.Contains(out, "kind: Namespace") {
		t.Error("namespace.create=false still renders the Namespace")
	}
	// The kubelet's configuration elsewhere (EKS keeps a JSON file), or
	// not mounted at all.
	out = string(helm(t, "template", "resize-agent", chartDir(t), "--set", "kubeletConfig=/etc/kubernetes/kubelet/config.json"))
	if strings.Count(out, "/etc/kubernetes/kubelet/config.json") != 3 || strings.Contains(out, "/var/lib/kubelet") {
		t.Errorf("kubeletConfig elsewhere: want it in the flag, the mount and the volume:\n%s", out)
	}
	out = string(helm(t, "template", "resize-agent", chartDir(t), "--set", "kubeletConfig="))
	if !strings.Contains(out, "- --kubelet-config=\n") || strings.Contains(out, "name: kubelet-config") {
		t.Errorf("kubeletConfig empty: want the flag empty and no mount:\n%s", out)
	}
}
