package k8s_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

const pluginNS = "plugin-e2e"

// buildPlugin builds cmd/kubectl-resize into a directory of its own and
// returns its path.
func buildPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-resize")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubectl-resize")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kubectl-resize: %v\n%s", err, out)
	}
	return bin
}

// userKubeconfig makes a service account, binds it to the cluster roles
// given (in the plugin's namespace), and writes a kubeconfig with a token
// the API server issues for it: the plugin then runs with that user's
// rights and nothing else.
func userKubeconfig(t *testing.T, cp *ControlPlane, admin kubernetes.Interface, name string, roles ...string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.CoreV1().ServiceAccounts(pluginNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, role := range roles {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: pluginNS}},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		}
		if _, err := admin.RbacV1().RoleBindings(pluginNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := admin.CoreV1().ServiceAccounts(pluginNS).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := os.WriteFile(path, []byte(cp.Kubeconfig(tr.Status.Token)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// aggregate fills an aggregated cluster role (edit, view, admin) with the
// rules of the roles its selectors pick, as kube-controller-manager's
// clusterrole-aggregation controller does: it does not run here, and the
// built-in roles are empty without it.
func aggregate(t *testing.T, admin kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	role, err := admin.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if role.AggregationRule == nil {
		t.Fatalf("cluster role %s is not aggregated", name)
	}
	var rules []rbacv1.PolicyRule
	for _, sel := range role.AggregationRule.ClusterRoleSelectors {
		l, err := admin.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&sel)})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.Items {
			if r.Name != name {
				rules = append(rules, r.Rules...)
			}
		}
	}
	role.Rules = rules
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster role %s: %d rules aggregated", name, len(rules))
}

type pluginRun struct {
	code           int
	stdout, stderr string
}

func runPlugin(t *testing.T, bin, kubeconfig string, args ...string) pluginRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig, "-n", pluginNS}, args...)...)
	// Only the kubeconfig given: not the one of whoever runs the test.
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := pluginRun{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("kubectl-resize %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("kubectl-resize %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// TestKubectlResizePlugin: the plugin against a real API server, as users
// with and without pods/resize, and the API server's admission refusing
// (PodResizeValidator, LimitRange, ResourceQuota). There is no kubelet
// here: the verdicts are the node tests' (test/node/plugin_test.go).
func TestKubectlResizePlugin(t *testing.T) {
	bin := buildPlugin(t)
	cp := StartControlPlane(t)
	admin := cp.Admin()
	ctx := context.Background()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pluginNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(pluginNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node, with what a kubelet would report: PodResizeValidator
	// checks a resize against its allocatable.
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plugin-node"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Capacity = rl("cpu", "4", "memory", "8Gi", "pods", "110")
	node.Status.Allocatable = node.Status.Capacity
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The users: "resizer" may edit and resize pods; "editor" has the
	// built-in edit role only, which does not grant pods/resize.
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-resizer"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/resize"}, Verbs: []string{"patch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// view first: it is labelled to be part of edit.
	aggregate(t, admin, "view")
	aggregate(t, admin, "edit")
	resizer := userKubeconfig(t, cp, admin, "resizer", "edit", "pod-resizer")
	editor := userKubeconfig(t, cp, admin, "editor", "edit")

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: pluginNS},
		Spec: corev1.PodSpec{
			NodeName:                      "plugin-node",
			AutomountServiceAccountToken:  new(false),
			TerminationGracePeriodSeconds: new(int64(0)),
			Containers: []corev1.Container{{Name: "app", Image: "busybox",
				Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "500m", "memory", "64Mi")}}},
		},
	}
	if pod, err = admin.CoreV1().Pods(pluginNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := func() corev1.ResourceRequirements {
		t.Helper()
		p, err := admin.CoreV1().Pods(pluginNS).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Spec.Containers[0].Resources
	}
	unchanged := func(before corev1.ResourceRequirements) {
		t.Helper()
		if after := spec(); !sameRequirements(after, before) {
			t.Errorf("the spec changed after a refused resize: %v -> %v", before, after)
		}
	}

	t.Run("a user with pods/resize resizes", func(t *testing.T) {
		r := runPlugin(t, bin, resizer, "web", "--cpu-limit", "800m", "--memory-limit", "96Mi", "--wait=false", "-o", "json")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		var res struct {
			Verdict    string
			Generation int64
		}
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Verdict != "Accepted" || res.Generation != pod.Generation+1 {
			t.Errorf("output %+v (%v), want Accepted at generation %d", res, err, pod.Generation+1)
		}
		want := corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "800m", "memory", "96Mi")}
		if got := spec(); !sameRequirements(got, want) {
			t.Errorf("spec %v, want %v (only the limits given changed)", got, want)
		}
	})

	t.Run("without a kubelet no verdict comes: exit 1 after the timeout", func(t *testing.T) {
		r := runPlugin(t, bin, resizer, "web", "--cpu-request", "200m", "--timeout", "2s")
		if r.code != 1 || !strings.Contains(r.stdout, ": Timeout (generation") || !strings.Contains(r.stdout, "no verdict from the kubelet within 2s") {
			t.Errorf("exit %d, output %q", r.code, r.stdout)
		}
		if got := spec(); got.Requests.Cpu().String() != "200m" {
			t.Errorf("cpu request %s, want 200m", got.Requests.Cpu())
		}
	})

	t.Run("a user with the edit role only is forbidden", func(t *testing.T) {
		before := spec()
		r := runPlugin(t, bin, editor, "web", "--cpu-limit", "1")
		if r.code != 1 || !strings.Contains(r.stderr, `the API server refused the resize (Forbidden): pods "web" is forbidden: User "system:serviceaccount:plugin-e2e:editor" cannot patch resource "pods/resize" in API group "" in the namespace "plugin-e2e"`) {
			t.Errorf("exit %d, stderr %q", r.code, r.stderr)
		}
		unchanged(before)
	})

	t.Run("PodResizeValidator refuses more CPU than the node has", func(t *testing.T) {
		before := spec()
		r := runPlugin(t, bin, resizer, "web", "--cpu-request", "5", "--cpu-limit", "5", "-o", "yaml")
		if r.code != 1 || !strings.Contains(r.stdout, "verdict: Refused") ||
			!strings.Contains(r.stderr, "node didn't have enough allocatable resources: cpu, requested: 5000, allocatable: 4000") {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		unchanged(before)
	})

	t.Run("LimitRange refuses", func(t *testing.T) {
		if _, err := admin.CoreV1().LimitRanges(pluginNS).Create(ctx, &corev1.LimitRange{
			ObjectMeta: metav1.ObjectMeta{Name: "max"},
			Spec:       corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer, Max: rl("cpu", "1")}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer admin.CoreV1().LimitRanges(pluginNS).Delete(ctx, "max", metav1.DeleteOptions{})
		before := spec()
		r := runPlugin(t, bin, resizer, "web", "--cpu-limit", "2")
		if r.code != 1 || !strings.Contains(r.stderr, "maximum cpu usage per Container is 1, but limit is 2") {
			t.Errorf("exit %d, stderr %q", r.code, r.stderr)
		}
		unchanged(before)
	})

	t.Run("ResourceQuota refuses", func(t *testing.T) {
		q, err := admin.CoreV1().ResourceQuotas(pluginNS).Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "mem"},
			Spec:       corev1.ResourceQuotaSpec{Hard: rl("limits.memory", "200Mi")},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No controller manager computes its usage here: set it as the
		// quota controller would (the pod's 96Mi).
		q.Status = corev1.ResourceQuotaStatus{Hard: rl("limits.memory", "200Mi"), Used: rl("limits.memory", "96Mi")}
		if _, err := admin.CoreV1().ResourceQuotas(pluginNS).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		before := spec()
		r := runPlugin(t, bin, resizer, "web", "--memory-limit", "256Mi")
		if r.code != 1 || !strings.Contains(r.stderr, "exceeded quota: mem, requested: limits.memory=160Mi, used: limits.memory=96Mi, limited: limits.memory=200Mi") {
			t.Errorf("exit %d, stderr %q", r.code, r.stderr)
		}
		unchanged(before)
		// Within the quota it passes.
		if r := runPlugin(t, bin, resizer, "web", "--memory-limit", "128Mi", "--wait=false"); r.code != 0 {
			t.Errorf("within the quota: exit %d, %s", r.code, r.stderr)
		}
	})

	// The plugin's patch names the UID it read: a pod made again under the
	// same name in between is not resized with values meant for the old.
	t.Run("a patch for another pod's UID is refused", func(t *testing.T) {
		before := spec()
		patch := `{"metadata":{"uid":"00000000-0000-0000-0000-000000000001"},"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"900m"}}}]}}`
		_, err := admin.CoreV1().Pods(pluginNS).Patch(ctx, "web", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
		if err == nil {
			t.Fatal("the API server took a resize patch with another UID")
		}
		t.Logf("refused: %v", err)
		unchanged(before)
	})

	t.Run("bad input sends nothing", func(t *testing.T) {
		before := spec()
		for _, args := range [][]string{
			{"web", "--cpu-request", "2"},     // above the 800m limit
			{"web", "--cpu-limit", "800m"},    // what it has
			{"web", "--memory-limit", "-1Mi"}, // negative
		} {
			if r := runPlugin(t, bin, resizer, args...); r.code != 2 {
				t.Errorf("%v: exit %d, want 2", args, r.code)
			}
		}
		unchanged(before)
	})
}

func sameRequirements(a, b corev1.ResourceRequirements) bool {
	eq := func(x, y corev1.ResourceList) bool {
		if len(x) != len(y) {
			return false
		}
		for k, v := range y {
			if q, ok := x[k]; !ok || q.Cmp(v) != 0 {
				return false
			}
		}
		return true
	}
	return eq(a.Requests, b.Requests) && eq(a.Limits, b.Limits)
}
