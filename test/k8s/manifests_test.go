package k8s_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/kube"
)

func agentFilter(ctr string) agent.Filter { return agent.Filter{Container: ctr} }

// strictScheme is client-go's scheme plus the Prometheus operator's types.
var strictScheme = func() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// decodeStrict decodes every document of a YAML stream into its typed
// object; unknown and duplicate fields are errors.
func decodeStrict(t testing.TB, name string, data []byte) []k8sruntime.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(strictScheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []k8sruntime.Object
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: strict decoding: %v", name, err)
		}
		if gvk.Version == "" || gvk.Kind == "" {
			t.Fatalf("%s: no apiVersion or kind", name)
		}
		out = append(out, obj)
	}
	return out
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func loadManifests(t testing.TB, dir string, files ...string) []k8sruntime.Object {
	t.Helper()
	var out []k8sruntime.Object
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decodeStrict(t, f, b)...)
	}
	return out
}

func createObject(t testing.TB, c kubernetes.Interface, obj k8sruntime.Object) {
	t.Helper()
	ctx, o := context.Background(), metav1.CreateOptions{}
	var err error
	switch v := obj.(type) {
	case *corev1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, v, o)
	case *corev1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(v.Namespace).Create(ctx, v, o)
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, v, o)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, v, o)
	case *admissionv1.ValidatingAdmissionPolicy:
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, v, o)
	case *admissionv1.ValidatingAdmissionPolicyBinding:
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, v, o)
	default:
		t.Fatalf("createObject: %T", obj)
	}
	if err != nil {
		t.Fatalf("create %T: %v", obj, err)
	}
}

// Every manifest under deploy/ decodes strictly into its typed object.
func TestManifestsDecodeStrictly(t *testing.T) {
	root := filepath.Join(repoRoot(t), "deploy")
	var n int
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if fi != nil && fi.IsDir() && fi.Name() == "helm" {
			return filepath.SkipDir // templates, not manifests: chart_test.go renders them
		}
		if err != nil || fi.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case filepath.Base(p) == "kustomization.yaml":
			var k kusttypes.Kustomization
			if err := yaml.UnmarshalStrict(b, &k); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
			if k.Kind != kusttypes.KustomizationKind && k.Kind != kusttypes.ComponentKind {
				t.Errorf("%s: kind %q", rel, k.Kind)
			}
		case rel == filepath.Join("monitoring", "rules.yaml"):
			var f promRules
			if err := yaml.UnmarshalStrict(b, &f); err != nil || len(f.Groups) == 0 {
				t.Errorf("%s: %+v %v", rel, f, err)
			}
		case rel == filepath.Join("monitoring", "rules_test.yaml"):
			var f struct {
				RuleFiles          []string `json:"rule_files"`
				EvaluationInterval string   `json:"evaluation_interval"`
				Tests              []any    `json:"tests"`
			}
			if err := yaml.UnmarshalStrict(b, &f); err != nil || !slices.Equal(f.RuleFiles, []string{"rules.yaml"}) || len(f.Tests) == 0 {
				t.Errorf("%s: %+v %v", rel, f, err)
			}
		case rel == filepath.Join("kind", "cluster.yaml"):
			var c kindCluster
			if err := yaml.UnmarshalStrict(b, &c); err != nil || c.Kind != "Cluster" || c.APIVersion != "kind.x-k8s.io/v1alpha4" || len(c.Nodes) == 0 {
				t.Errorf("%s: %+v %v", rel, c, err)
			}
		default:
			if objs := decodeStrict(t, rel, b); len(objs) == 0 {
				t.Errorf("%s: no object", rel)
			}
		}
		n++
		return nil
	})
	if err != nil || n < 9 {
		t.Fatalf("walked %d files: %v", n, err)
	}
	// Strictness is real: a misspelt field fails.
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {selecter: {}}\n")
	dec := serializer.NewCodecFactory(strictScheme, serializer.EnableStrict).UniversalDeserializer()
	if _, _, err := dec.Decode(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "selecter") {
		t.Errorf("a misspelt field decoded: %v", err)
	}
}

// promRules is a Prometheus rules file, as promtool reads it.
type promRules struct {
	Groups []monitoringv1.RuleGroup `json:"groups"`
}

// kindCluster is the part of kind's v1alpha4 Cluster that
// deploy/kind/cluster.yaml uses (kind's own Go types are not a dependency
// of this module); strict decoding catches a field it does not have.
type kindCluster struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Name       string `json:"name"`
	Nodes      []struct {
		Role   string            `json:"role"`
		Labels map[string]string `json:"labels,omitempty"`
	} `json:"nodes"`
}

// build runs kustomize (the krusty library, what kubectl apply -k uses) on
// a directory of fsys and decodes the result strictly.
func build(t *testing.T, fsys filesys.FileSystem, dir string) []k8sruntime.Object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	b, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decodeStrict(t, dir, b)
}

// deployFS is deploy/ copied into an in-memory file system at /deploy,
// where the test can add an overlay without writing to the work tree.
func deployFS(t *testing.T) filesys.FileSystem {
	t.Helper()
	fsys := filesys.MakeFsInMemory()
	root := filepath.Join(repoRoot(t), "deploy")
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		return fsys.WriteFile(filepath.Join("/deploy", rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

func TestKustomizeBuildsAndAgreesWithTheDaemon(t *testing.T) {
	flags := daemonFlags(t)

	fsys := deployFS(t)
	base := build(t, fsys, "/deploy/base")
	kind := build(t, fsys, "/deploy/overlays/kind")
	// With the ServiceMonitor component, as an overlay for a cluster with
	// the Prometheus operator would use it.
	kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n  - ../../components/servicemonitor\n  - ../../monitoring\n"
	if err := fsys.WriteFile("/deploy/overlays/monitored/kustomization.yaml", []byte(kust)); err != nil {
		t.Fatal(err)
	}
	monitored := build(t, fsys, "/deploy/overlays/monitored")

	for name, objs := range map[string][]k8sruntime.Object{"base": base, "overlays/kind": kind, "with servicemonitor": monitored} {
		t.Run(name, func(t *testing.T) {
			checkDeployment(t, objs, flags)
		})
	}

	ds := find[*appsv1.DaemonSet](t, kind)
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != "resize-agent:dev" || c.ImagePullPolicy != corev1.PullNever || !slices.Contains(c.Args, "--log-format=text") {
		t.Errorf("kind overlay: image %s pull %s args %v", c.Image, c.ImagePullPolicy, c.Args)
	}
	if c := find[*appsv1.DaemonSet](t, base).Spec.Template.Spec.Containers[0]; c.Image != "ghcr.io/resizer/resize-agent:0.1.0" {
		t.Errorf("base image %s", c.Image)
	}
	sm := find[*monitoringv1.ServiceMonitor](t, monitored)
	svc := find[*corev1.Service](t, monitored)
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" ||
		sm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != svc.Labels["app.kubernetes.io/name"] {
		t.Errorf("ServiceMonitor %+v does not select the metrics Service %+v", sm.Spec, svc.ObjectMeta)
	}
	if rl := sm.Spec.Endpoints[0].RelabelConfigs; len(rl) == 0 || rl[0].TargetLabel != "node" {
		t.Errorf("ServiceMonitor does not label series with the node (the dashboard and alerts group by it): %+v", rl)
	}
	// The monitoring component: the PrometheusRule holds rules.yaml's groups,
	// and the dashboard's ConfigMap the dashboard, for Grafana's sidecar.
	var plain promRules
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "monitoring", "rules.yaml"))
	if err == nil {
		err = yaml.UnmarshalStrict(b, &plain)
	}
	if err != nil {
		t.Fatal(err)
	}
	pr := find[*monitoringv1.PrometheusRule](t, monitored)
	if !reflect.DeepEqual(pr.Spec.Groups, plain.Groups) {
		t.Errorf("the PrometheusRule's groups differ from deploy/monitoring/rules.yaml:\n%+v\n%+v", pr.Spec.Groups, plain.Groups)
	}
	var dash *corev1.ConfigMap
	for _, o := range monitored {
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Labels["grafana_dashboard"] == "1" {
			dash = cm
		}
	}
	if dash == nil || !json.Valid([]byte(dash.Data["resize-agent.json"])) || dash.Namespace != "resize-agent" {
		t.Errorf("no dashboard ConfigMap for Grafana's sidecar: %+v", dash)
	}
}

func find[T k8sruntime.Object](t *testing.T, objs []k8sruntime.Object) T {
	t.Helper()
	var zero T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			return v
		}
	}
	t.Fatalf("no %T among %d objects", zero, len(objs))
	return zero
}

func findNamed[T interface {
	k8sruntime.Object
	GetName() string
}](t *testing.T, objs []k8sruntime.Object, name string) T {
	t.Helper()
	var zero T
	for _, o := range objs {
		if v, ok := o.(T); ok && v.GetName() == name {
			return v
		}
	}
	t.Fatalf("no %T named %s among %d objects", zero, name, len(objs))
	return zero
}

// daemonFlags runs the daemon's -h and returns its flags with their
// defaults ("" when none is printed).
func daemonFlags(t *testing.T) map[string]string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "resize-agent")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/resize-agent")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd = exec.Command(bin, "-h")
	cmd.Env = append(os.Environ(), "NODE_NAME=")
	out, _ := cmd.CombinedOutput()
	flags := map[string]string{}
	re := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	def := regexp.MustCompile(`\(default "?([^")]*)"?\)`)
	last := ""
	for _, l := range strings.Split(string(out), "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			last = m[1]
			flags[last] = ""
		}
		if m := def.FindStringSubmatch(l); m != nil && last != "" {
			flags[last] = m[1]
		}
	}
	if len(flags) < 10 {
		t.Fatalf("could not read the daemon's flags from -h:\n%s", out)
	}
	return flags
}

func checkDeployment(t *testing.T, objs []k8sruntime.Object, flags map[string]string) {
	ds := find[*appsv1.DaemonSet](t, objs)
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("containers %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args {
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("arg %q: write --flag=value", a)
			continue
		}
		if _, known := flags[k]; !known {
			t.Errorf("arg %q: the daemon has no flag %q", a, k)
		}
		args[k] = v
	}
	// The paths and ports the manifest spells out are the daemon's defaults.
	for _, f := range []string{"cgroup-root", "socket", "metrics-address", "cri-endpoint", "kube-intake", "state-dir"} {
		if args[f] != flags[f] {
			t.Errorf("--%s=%s in the DaemonSet, but the daemon's default is %q", f, args[f], flags[f])
		}
	}
	if _, err := kube.ParseMode(args["kube-intake"]); err != nil {
		t.Error(err)
	}
	// Each path is a mount of the same host path.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	host := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath", v.Name)
			continue
		}
		host[v.Name] = v.HostPath
	}
	wantMount := func(path string, typ corev1.HostPathType, ro bool) {
		t.Helper()
		m, ok := mounts[path]
		if !ok {
			t.Errorf("no mount at %s", path)
			return
		}
		hp := host[m.Name]
		if hp == nil || hp.Path != path || hp.Type == nil || *hp.Type != typ || m.ReadOnly != ro {
			t.Errorf("mount %s: %+v from %+v, want the host's %s (%s, readOnly %v)", path, m, hp, path, typ, ro)
		}
	}
	wantMount(args["cgroup-root"], corev1.HostPathDirectory, false)
	wantMount(filepath.Dir(args["socket"]), corev1.HostPathDirectoryOrCreate, false)
	wantMount(args["state-dir"], corev1.HostPathDirectoryOrCreate, false)
	wantMount(strings.TrimPrefix(args["cri-endpoint"], "unix://"), corev1.HostPathSocket, false)
	wantMount("/sys/kernel/btf", corev1.HostPathDirectory, true)
	wantMount("/sys/fs/bpf", corev1.HostPathDirectoryOrCreate, false)
	wantMount("/sys/kernel/tracing", corev1.HostPathDirectoryOrCreate, true)
	wantMount("/run/systemd", corev1.HostPathDirectoryOrCreate, false)
	// The kubelet's configuration: the file alone, read-only (the rest of
	// /var/lib/kubelet holds the pods' secrets).
	wantMount(args["kubelet-config"], corev1.HostPathFileOrCreate, true)
	if len(mounts) != 9 || len(host) != 9 {
		t.Errorf("%d mounts, %d volumes: every host path must be listed here with its reason", len(mounts), len(host))
	}
	// The metrics port.
	port := strings.TrimPrefix(args["metrics-address"], ":")
	if len(c.Ports) != 1 || fmt.Sprint(c.Ports[0].ContainerPort) != port || c.Ports[0].Name != "metrics" {
		t.Errorf("ports %+v, want metrics on %s", c.Ports, port)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("probe %+v", p)
		}
	}
	svc := find[*corev1.Service](t, objs)
	if len(svc.Spec.Ports) != 1 || fmt.Sprint(svc.Spec.Ports[0].Port) != port || svc.Spec.Ports[0].TargetPort.String() != "metrics" ||
		svc.Annotations["prometheus.io/scrape"] != "true" || svc.Annotations["prometheus.io/port"] != port || svc.Annotations["prometheus.io/path"] != "/metrics" {
		t.Errorf("metrics Service %+v %+v", svc.Annotations, svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, the pods are %v", k, v, ds.Spec.Template.Labels)
		}
	}
	// The node name from the downward API, the host's PIDs, privileged.
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || (e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName")
	}
	if _, ok := flags["node-name"]; !nodeName || !ok {
		t.Error("NODE_NAME is not set from spec.nodeName, or the daemon has no --node-name")
	}
	if !pod.HostPID || pod.HostNetwork || pod.HostIPC || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged ||
		c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("host namespaces and security context: hostPID %v hostNetwork %v hostIPC %v %+v", pod.HostPID, pod.HostNetwork, pod.HostIPC, c.SecurityContext)
	}
	// RBAC: the service account the pods run as gets exactly the rules
	// the intake needs.
	sa := find[*corev1.ServiceAccount](t, objs)
	crb := find[*rbacv1.ClusterRoleBinding](t, objs)
	cr := find[*rbacv1.ClusterRole](t, objs)
	if pod.ServiceAccountName != sa.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Kind != "ServiceAccount" ||
		crb.Subjects[0].Name != sa.Name || crb.Subjects[0].Namespace != sa.Namespace || crb.RoleRef.Name != cr.Name || ds.Namespace != sa.Namespace {
		t.Errorf("service account %s/%s, pods run as %s, binding %+v", sa.Namespace, sa.Name, pod.ServiceAccountName, crb)
	}
	if AgentUser != "system:serviceaccount:"+sa.Namespace+":"+sa.Name {
		t.Errorf("the integration test's agent user %s is not the service account %s/%s", AgentUser, sa.Namespace, sa.Name)
	}
	got, _ := json.Marshal(cr.Rules)
	want := `[{"verbs":["get","list","watch"],"apiGroups":[""],"resources":["pods"]},` +
		`{"verbs":["get"],"apiGroups":[""],"resources":["nodes"]},` +
		`{"verbs":["patch"],"apiGroups":[""],"resources":["pods/resize"]},` +
		`{"verbs":["patch"],"apiGroups":[""],"resources":["pods/status"]},` +
		`{"verbs":["create","patch"],"apiGroups":[""],"resources":["events"]},` +
		`{"verbs":["get"],"apiGroups":["admissionregistration.k8s.io"],"resources":["validatingadmissionpolicies","validatingadmissionpolicybindings"],"resourceNames":["` + kube.AnnotationPolicy + `"]}]`
	if string(got) != want {
		t.Errorf("ClusterRole rules\n%s\nwant\n%s", got, want)
	}
	// Node scoping: the policy is bound, denies, and matches the service
	// account the pods run as; its own condition type is the agent's.
	vap := findNamed[*admissionv1.ValidatingAdmissionPolicy](t, objs, "resize-agent-node-scope")
	vapb := findNamed[*admissionv1.ValidatingAdmissionPolicyBinding](t, objs, "resize-agent-node-scope")
	// The annotation policy, named as the agent looks it up, bound, denying.
	ap := findNamed[*admissionv1.ValidatingAdmissionPolicy](t, objs, kube.AnnotationPolicy)
	apb := findNamed[*admissionv1.ValidatingAdmissionPolicyBinding](t, objs, kube.AnnotationPolicy)
	if apb.Spec.PolicyName != ap.Name || !slices.Equal(apb.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
		ap.Spec.FailurePolicy == nil || *ap.Spec.FailurePolicy != admissionv1.Fail || apb.Spec.MatchResources != nil {
		t.Errorf("annotation policy %s, binding %+v", ap.Name, apb.Spec)
	}
	if vapb.Spec.PolicyName != vap.Name || !slices.Equal(vapb.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
		vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionv1.Fail {
		t.Errorf("policy %s, binding %+v, failure policy %v", vap.Name, vapb.Spec, vap.Spec.FailurePolicy)
	}
	if len(vap.Spec.MatchConditions) != 1 || vap.Spec.MatchConditions[0].Expression != "request.userInfo.username == '"+AgentUser+"'" {
		t.Errorf("the policy does not match the agent's service account %s: %+v", AgentUser, vap.Spec.MatchConditions)
	}
	var own bool
	for _, v := range vap.Spec.Variables {
		own = own || (v.Name == "ownCondition" && v.Expression == "'"+kube.ConditionType+"'")
	}
	if !own {
		t.Errorf("the policy's ownCondition is not agent/kube's ConditionType %q", kube.ConditionType)
	}
	ns := find[*corev1.Namespace](t, objs)
	if ns.Name != ds.Namespace || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %+v", ns.ObjectMeta)
	}
}
