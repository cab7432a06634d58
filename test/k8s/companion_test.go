package k8s_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/kube"
)

const (
	editor  = "alice" // the built-in edit role in ns: patch pods, not pods/resize
	resizer = "bob"   // edit, and patch pods/resize
)

// as is a client for user, impersonated by the administrator.
func (cp *ControlPlane) as(user string) kubernetes.Interface {
	c := cp.Config(cp.adminToken)
	c.Impersonate.UserName = user
	cl, err := kubernetes.NewForConfig(c)
	if err != nil {
		cp.t.Fatal(err)
	}
	return cl
}

// boundAgent is a client with a service-account token bound to an agent
// pod on node, as the kubelet mounts it: the node-name claim that
// deploy's node-scope policy checks.
func boundAgent(t *testing.T, cp *ControlPlane, name, node string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	pod := createPod(t, cp.Admin(), "resize-agent", name, node, "resize-agent")
	tr, err := cp.Admin().CoreV1().ServiceAccounts("resize-agent").CreateToken(ctx, "resize-agent", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600)),
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cp.client(tr.Status.Token)
}

func annotateAs(c kubernetes.Interface, p *corev1.Pod, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, kube.AnnotationResources, value)
	_, err := c.CoreV1().Pods(p.Namespace).Patch(context.Background(), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func resizeAs(c kubernetes.Interface, p *corev1.Pod, resources string) error {
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"web","resources":%s}]}}`, resources)
	_, err := c.CoreV1().Pods(p.Namespace).Patch(context.Background(), p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
	return err
}

// managers lists, for the pod, each field manager's operation and
// subresource with the fields it owns.
func managers(t *testing.T, c kubernetes.Interface, p *corev1.Pod) []string {
	t.Helper()
	got, err := c.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range got.ManagedFields {
		fields := ""
		if m.FieldsV1 != nil {
			fields = string(m.FieldsV1.Raw)
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", m.Manager, m.Operation, m.Subresource, fields))
	}
	return out
}

// The companion on a real API server with deploy/base's RBAC and both
// policies, the agent on a token bound to its node: who may resize through
// the annotation, what the API server refuses (LimitRange, ResourceQuota)
// refused for the agent's patch too, quantities meaning no limit refused,
// and only the agent's own condition written.
func TestCompanion(t *testing.T) {
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	cp := StartControlPlane(t)
	admin := cp.Admin()
	ctx := context.Background()
	for _, obj := range build(t, deployFS(t), "/deploy/base") {
		switch obj.(type) {
		case *corev1.Namespace, *corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding,
			*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding:
			createObject(t, admin, obj)
		}
	}
	// The built-in edit role is an aggregated ClusterRole, filled in by
	// kube-controller-manager, which does not run here: fill it in from
	// the bootstrap roles it aggregates, as the controller does.
	edit, err := admin.RbacV1().ClusterRoles().Get(ctx, "edit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, agg := range []string{"system:aggregate-to-edit", "system:aggregate-to-view"} {
		r, err := admin.RbacV1().ClusterRoles().Get(ctx, agg, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit.Rules = append(edit.Rules, r.Rules...)
	}
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, edit, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, "quota"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().ServiceAccounts(n).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// alice and bob edit the namespace; bob may also resize.
		for _, u := range []string{editor, resizer} {
			if _, err := admin.RbacV1().RoleBindings(n).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "edit-" + u},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
				Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: u}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := admin.RbacV1().Roles(n).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "resize"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/resize"}, Verbs: []string{"patch"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.RbacV1().RoleBindings(n).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "resize-" + resizer},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "resize"},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: resizer}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Capacity = rl("cpu", "8", "memory", "16Gi", "pods", "110")
		node.Status.Allocatable = node.Status.Capacity
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The premise: edit does not grant pods/resize (1.37), bob has it.
	for u, want := range map[string]bool{editor: false, resizer: true} {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: u,
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: "patch", Resource: "pods", Subresource: "resize"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != want {
			t.Fatalf("%s patch pods/resize: allowed %v, want %v", u, sar.Status.Allowed, want)
		}
	}

	alice, bob := cp.as(editor), cp.as(resizer)
	// The API server loads policies asynchronously: wait until it denies
	// alice, before any agent runs. (An agent started meanwhile would act
	// on an annotation the policy, present but not loaded yet, let
	// through: a window at install time, see docs/kubernetes.md.)
	probe := createPod(t, admin, ns, "probe", "node-b", "")
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; ; i++ {
		// Another value each time: an unchanged annotation is not checked.
		err := annotateAs(alice, probe, fmt.Sprintf(`{"web": {"limits": {"cpu": "%dm"}}}`, 1000+i))
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the annotation policy is not in force after 30 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	e := &env{t: t, cp: cp, admin: admin, node: "node-a", client: boundAgent(t, cp, "resize-agent-a1", "node-a"),
		ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 << 30})}
	e.startIntake()
	p1 := e.pod("p1", burstable, false)

	t.Run("an editor without pods/resize changes nothing", func(t *testing.T) {
		e.t = t
		err := annotateAs(alice, p1, `{"web": {"limits": {"cpu": "4"}}}`)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+kube.AnnotationPolicy+"'") {
			t.Errorf("editor's annotation: %v", err)
		}
		if err := resizeAs(alice, p1, `{"limits":{"cpu":"4"}}`); !apierrors.IsForbidden(err) {
			t.Errorf("editor's own resize: %v", err)
		}
		// Nor through pods/status, which can carry metadata.
		_, err = alice.CoreV1().Pods(ns).Patch(ctx, p1.Name, types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"{}"}}}`, kube.AnnotationResources)), metav1.PatchOptions{}, "status")
		if err == nil {
			t.Errorf("editor's annotation through pods/status accepted")
		}
		time.Sleep(2 * time.Second)
		got, _ := admin.CoreV1().Pods(ns).Get(ctx, p1.Name, metav1.GetOptions{})
		if l := got.Spec.Containers[0].Resources.Limits.Cpu().String(); l != "1" {
			t.Errorf("cpu limit %s after the editor's tries", l)
		}
		if its := e.ra.List(agentFilter(""), ""); len(its) != 0 {
			t.Errorf("intents: %+v", its)
		}
	})

	t.Run("a user with pods/resize resizes through the annotation", func(t *testing.T) {
		e.t = t
		if err := annotateAs(bob, p1, `{"web": {"limits": {"cpu": "2", "memory": "256Mi"}}}`); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the agent's pods/resize patch", func() string {
			got, _ := admin.CoreV1().Pods(ns).Get(ctx, p1.Name, metav1.GetOptions{})
			if l := got.Spec.Containers[0].Resources.Limits; l.Cpu().String() != "2" || l.Memory().String() != "256Mi" {
				return fmt.Sprintf("limits %v", l)
			}
			return ""
		})
		// The intent is Proposed from its submission, and Patched once the
		// agent has seen the API server take its patch: a moment after the
		// spec shows it (CI, under load, read it in between).
		var it intent.Intent
		eventually(t, 30*time.Second, "the intent Proposed and Patched", func() string {
			if it = e.intentOf(p1, "web"); it.Status.State != intent.Proposed || it.Status.Reason != kube.ReasonPatched {
				return fmt.Sprintf("%s is %s/%s (%s)", it.ID, it.Status.State, it.Status.Reason, it.Status.Message)
			}
			return ""
		})
		// The agent wrote no cgroup file: the kubelet actuates.
		if got := e.ra.File(t, cgroupOf(p1.UID, "web"), "cpu.max"); got != "max 100000" {
			t.Errorf("cpu.max %q: the agent wrote it", got)
		}
		// The agent's condition follows its patch: wait for its write.
		eventually(t, 30*time.Second, "the agent's status write", func() string {
			for _, m := range managers(t, admin, p1) {
				if strings.HasPrefix(m, kube.FieldManager+" Update status ") {
					return ""
				}
			}
			return "not yet"
		})
		var resize, status bool
		for _, m := range managers(t, admin, p1) {
			if strings.HasPrefix(m, kube.FieldManager+" Update resize ") {
				resize = true
			}
			if strings.HasPrefix(m, kube.FieldManager+" Update status ") {
				status = true
				if strings.Contains(m, "PodResizePending") || strings.Contains(m, "PodResizeInProgress") {
					t.Errorf("the agent owns a kubelet condition: %s", m)
				}
				if !strings.Contains(m, kube.ConditionType) {
					t.Errorf("the agent's status write: %s", m)
				}
			}
		}
		if !resize || !status {
			t.Errorf("managed fields: %q", managers(t, admin, p1))
		}
		// The kubelet's part, played by the administrator: actuated, and
		// the files hold it; the intent is Completed once the agent read
		// them back.
		want := corev1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "64Mi"), Limits: rl("cpu", "2", "memory", "256Mi")}
		updatePodStatus(t, admin, ns, p1.Name, func(got *corev1.Pod) {
			got.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Image: "busybox", ImageID: "x", ContainerID: "containerd://x", Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}, Resources: &want, AllocatedResources: want.Requests}}
		})
		for file, v := range map[string]string{"cpu.max": "200000 100000", "memory.max": fmt.Sprint(256 << 20), "cpu.weight": "59"} {
			if err := os.WriteFile(filepath.Join(e.ra.Root, cgroupOf(p1.UID, "web"), file), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		it = e.waitState(p1, "web", intent.Completed)
		if it.Status.Reason != kube.ReasonVerified {
			t.Errorf("intent %+v", it.Status)
		}
		e.waitEvent(p1, corev1.EventTypeNormal, kube.EventResizeVerified, "verified")
		e.settled(p1)
	})

	t.Run("quantities meaning no limit are refused", func(t *testing.T) {
		e.t = t
		p := e.pod("p2", burstable, false)
		for _, v := range []string{`{"web": {"limits": {"memory": "0"}}}`, `{"web": {"limits": {"memory": "1e18"}}}`, `{"web": {"limits": {"cpu": "1e99"}}}`} {
			if err := annotateAs(bob, p, v); err != nil {
				t.Fatal(err)
			}
			e.waitEvent(p, corev1.EventTypeWarning, kube.EventResizeRefused, "limit")
		}
		got, _ := admin.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if got.Generation != 1 || got.Spec.Containers[0].Resources.Limits.Memory().String() != "128Mi" {
			t.Errorf("resized: generation %d, limits %v", got.Generation, got.Spec.Containers[0].Resources.Limits)
		}
	})

	t.Run("LimitRange refuses the agent's patch as it refuses kubectl's", func(t *testing.T) {
		e.t = t
		if _, err := admin.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "max"},
			Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer, Max: rl("cpu", "3")}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := e.pod("p3", burstable, false)
		var direct error
		eventually(t, 10*time.Second, "LimitRange in force", func() string {
			if direct = resizeAs(bob, p, `{"limits":{"cpu":"4"}}`); direct == nil {
				return "bob's resize to 4 CPUs accepted"
			}
			return ""
		})
		if err := resizeAs(bob, p, `{"limits":{"cpu":"1"}}`); err != nil {
			t.Fatal(err)
		}
		if err := annotateAs(bob, p, `{"web": {"limits": {"cpu": "4"}}}`); err != nil {
			t.Fatal(err)
		}
		it := e.waitState(p, "web", intent.Failed)
		if it.Status.Reason != kube.ReasonPatchRefused || !strings.Contains(it.Status.Message, "maximum cpu usage per Container is 3") {
			t.Errorf("intent %+v; kubectl's refusal: %v", it.Status, direct)
		}
		e.waitEvent(p, corev1.EventTypeWarning, kube.EventResizeRefused, "maximum cpu usage")
	})

	t.Run("ResourceQuota refuses the agent's patch as it refuses kubectl's", func(t *testing.T) {
		e.t = t
		q, err := admin.CoreV1().ResourceQuotas("quota").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"},
			Spec: corev1.ResourceQuotaSpec{Hard: rl("requests.cpu", "2")}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No controller manager: the quota's status set as its controller would.
		q.Status = corev1.ResourceQuotaStatus{Hard: rl("requests.cpu", "2"), Used: rl("requests.cpu", "0")}
		if _, err := admin.CoreV1().ResourceQuotas("quota").UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "q1", Namespace: "quota"}, Spec: corev1.PodSpec{NodeName: "node-a",
			AutomountServiceAccountToken: new(false), Containers: []corev1.Container{{Name: "web", Image: "busybox", Resources: burstable}}}}
		if p, err = admin.CoreV1().Pods("quota").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.ra.AddContainer(t, string(p.UID), "web", cgroupOf(p.UID, "web"))
		direct := resizeAs(bob, p, `{"requests":{"cpu":"3"},"limits":{"cpu":"3"}}`)
		if direct == nil || !strings.Contains(direct.Error(), "exceeded quota") {
			t.Fatalf("bob's own resize past the quota: %v", direct)
		}
		if err := annotateAs(bob, p, `{"web": {"requests": {"cpu": "3"}, "limits": {"cpu": "3"}}}`); err != nil {
			t.Fatal(err)
		}
		it := e.waitState(p, "web", intent.Failed)
		if it.Status.Reason != kube.ReasonPatchRefused || !strings.Contains(it.Status.Message, "exceeded quota") {
			t.Errorf("intent %+v; kubectl's refusal: %v", it.Status, direct)
		}
	})

	t.Run("the agent's token cannot resize another node's pod", func(t *testing.T) {
		pb := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-b", Namespace: ns}, Spec: corev1.PodSpec{NodeName: "node-b",
			AutomountServiceAccountToken: new(false), Containers: []corev1.Container{{Name: "web", Image: "busybox", Resources: burstable}}}}
		pb, err := admin.CoreV1().Pods(ns).Create(ctx, pb, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := resizeAs(e.client, pb, `{"limits":{"cpu":"2"}}`); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not write resize of pod e2e/on-b on node node-b") {
			t.Errorf("node-a's agent resizing node-b's pod: %v", err)
		}
	})
	e.stopIntake()

	// Without the annotation policy the agent acts on no annotation, even
	// one that a user with pods/resize set.
	t.Run("no policy, no annotation", func(t *testing.T) {
		if err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, kube.AnnotationPolicy, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		d := &env{t: t, cp: cp, admin: admin, node: "node-a", client: boundAgent(t, cp, "resize-agent-a2", "node-a"),
			ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 << 30})}
		d.startIntake()
		p := d.pod("p4", burstable, false)
		if err := annotateAs(alice, p, `{"web": {"limits": {"cpu": "2"}}}`); err != nil {
			t.Logf("the editor's annotation: %v", err) // the API server may not have dropped the binding yet
		}
		if err := annotateAs(bob, p, `{"web": {"limits": {"cpu": "3"}}}`); err != nil {
			t.Fatal(err)
		}
		d.waitEvent(p, corev1.EventTypeWarning, kube.EventResizeRefused, "ValidatingAdmissionPolicyBinding "+kube.AnnotationPolicy)
		got, _ := admin.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if got.Generation != 1 {
			t.Errorf("resized without the policy: %v", got.Spec.Containers[0].Resources)
		}
		d.stopIntake()
	})
	t.Run("rbac is least privilege", func(t *testing.T) { checkRBAC(t, cp) })
}
