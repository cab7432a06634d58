// Package boundaries holds the module's package boundaries with a test: each
// OS or cluster boundary is crossed by one package only, and the API client
// stays small. It reads the import graph with `go list`, so it needs the Go
// toolchain on PATH, as every test run has.
package boundaries

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/resizer/resize-agent/"

// A rule names the import prefixes of one boundary and the packages (module-
// relative prefixes) that may cross it. test/ may cross every one: its
// harnesses drive the real runtime and API server as peers.
type rule struct {
	what     string
	prefixes []string
	allowed  []string
}

var rules = []rule{
	{"the cgroup filesystem libraries (containerd/cgroups, dbus)",
		[]string{"github.com/containerd/cgroups", "github.com/godbus/dbus", "github.com/coreos/go-systemd"},
		[]string{"cgroup", "test"}},
	{"eBPF (cilium/ebpf)", []string{"github.com/cilium/ebpf"}, []string{"bpf", "test"}},
	{"the container runtime (CRI, gRPC, containerd's client)",
		[]string{"k8s.io/cri-api", "google.golang.org/grpc", "github.com/containerd/containerd"},
		[]string{"cri", "test"}},
	{"the Kubernetes API (client-go)", []string{"k8s.io/client-go"}, []string{"agent/kube", "cmd", "test"}},
}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Deps         []string
}

func list(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func within(rel string, dirs []string) bool {
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

func crosses(imp string, r rule) bool {
	for _, p := range r.prefixes {
		if imp == p || strings.HasPrefix(imp, p+"/") {
			return true
		}
	}
	return false
}

// violations returns "pkg imports imp" for each import of pkgs that crosses
// a boundary from a package not allowed to.
func violations(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		rel := strings.TrimPrefix(p.ImportPath, module)
		imports := append(append(append([]string(nil), p.Imports...), p.TestImports...), p.XTestImports...)
		for _, r := range rules {
			if within(rel, r.allowed) {
				continue
			}
			for _, imp := range imports {
				if crosses(imp, r) {
					out = append(out, rel+" imports "+imp+": only "+strings.Join(r.allowed, ", ")+" may reach "+r.what)
				}
			}
		}
	}
	return out
}

func TestBoundaries(t *testing.T) {
	pkgs := list(t, "./...")
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; expected the whole module", len(pkgs))
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// The rules must catch a crossing: a test that cannot fail proves nothing.
func TestBoundariesCatchCrossings(t *testing.T) {
	bad := []pkg{
		{ImportPath: module + "agent", Imports: []string{"github.com/cilium/ebpf/link"}},
		{ImportPath: module + "agent/intent", TestImports: []string{"github.com/containerd/cgroups/v3/cgroup2"}},
		{ImportPath: module + "cmd/resizectl", XTestImports: []string{"google.golang.org/grpc"}},
		{ImportPath: module + "agent", Imports: []string{"k8s.io/client-go/kubernetes"}},
	}
	if got := violations(bad); len(got) != len(bad) {
		t.Fatalf("violations = %q, want one for each of %d packages", got, len(bad))
	}
	good := []pkg{
		{ImportPath: module + "cgroup", Imports: []string{"github.com/godbus/dbus/v5"}},
		{ImportPath: module + "agent/kube", Imports: []string{"k8s.io/client-go/kubernetes"}},
		{ImportPath: module + "test/bench", Imports: []string{"k8s.io/cri-api/pkg/apis/runtime/v1"}},
	}
	if got := violations(good); len(got) != 0 {
		t.Fatalf("violations = %q, want none", got)
	}
}

// resizectl is a small HTTP client: it must not link the runtime, the
// kernel or BPF, even indirectly (it linked 448 packages before the API's
// wire types moved to a leaf package, 276 after).
func TestClientStaysSmall(t *testing.T) {
	for _, p := range list(t, "-deps", "./cmd/resizectl") {
		for _, r := range rules[:3] {
			if crosses(p.ImportPath, r) {
				t.Errorf("resizectl links %s (%s)", p.ImportPath, r.what)
			}
		}
	}
}
