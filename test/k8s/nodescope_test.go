package k8s_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/resizer/resize-agent/agent/kube"
)

const policyName = "resize-agent-node-scope"

// The agent's writes are scoped to its node by deploy/base's
// ValidatingAdmissionPolicy, on the node-name claim of a service-account
// token bound to the agent's pod: proven on the real API server with such a
// token (TokenRequest), as the kubelet would mount it.
func TestNodeScopedWrites(t *testing.T) {
	cp := StartControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()

	// deploy/base as kustomize builds it: namespace, service account,
	// RBAC and the policy with its binding (no DaemonSet: no controller).
	for _, obj := range build(t, deployFS(t), "/deploy/base") {
		switch obj.(type) {
		case *corev1.Namespace, *corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding,
			*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding:
			createObject(t, admin, obj)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelOSStable: "linux"}}}
		node, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Allocatable = rl("cpu", "4", "memory", "8Gi", "pods", "110")
		node.Status.Capacity = node.Status.Allocatable
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The agent's pod on node-a and a token bound to it, as the kubelet
	// asks for one for the pod's projected volume.
	agentPod := createPod(t, admin, "resize-agent", "resize-agent-xyz", "node-a", "resize-agent")
	tr, err := admin.CoreV1().ServiceAccounts("resize-agent").CreateToken(ctx, "resize-agent", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600)),
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent := cp.client(tr.Status.Token)
	// The API server puts the pod's node in the token's user (1.30+).
	ssr, err := agent.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := ssr.Status.UserInfo; u.Username != AgentUser || !slices.Equal(u.Extra["authentication.kubernetes.io/node-name"], []string{"node-a"}) {
		t.Fatalf("the bound token's user: %+v", u)
	}

	podA := createPod(t, admin, ns, "on-a", "node-a", "")
	podB := createPod(t, admin, ns, "on-b", "node-b", "")

	resize := func(c kubernetes.Interface, p *corev1.Pod, cpu string) error {
		patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"web","resources":{"requests":{"cpu":%q}}}]}}`, cpu)
		_, err := c.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}, "resize")
		return err
	}
	status := func(c kubernetes.Interface, p *corev1.Pod, patch string) error {
		_, err := c.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}, "status")
		return err
	}
	cond := func(typ, st string) string {
		return fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":"Verified","message":"cgroup files checked"}]}}`, typ, st)
	}
	// denied: Forbidden by this policy, with the message wanted.
	denied := func(what string, err error, msg string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policyName+"'") || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v; want Forbidden by %s with %q", what, err, policyName, msg)
		}
	}
	// The API server loads policies asynchronously: wait until it denies.
	deadline := time.Now().Add(30 * time.Second)
	for err := resize(agent, podB, "200m"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), policyName); err = resize(agent, podB, "200m") {
		if time.Now().After(deadline) {
			t.Fatalf("the policy is not in force after 30 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// pods/resize: on its node, admitted (and applied: nothing else
	// objects); on another node, denied with the policy's message.
	if err := resize(agent, podA, "200m"); err != nil {
		t.Errorf("resize of a pod on the agent's node: %v", err)
	} else if got, _ := admin.CoreV1().Pods(ns).Get(ctx, podA.Name, metav1.GetOptions{}); got.Spec.Containers[0].Resources.Requests.Cpu().String() != "200m" {
		t.Errorf("resize admitted but the spec says %v", got.Spec.Containers[0].Resources.Requests)
	}
	denied("resize on node-b", resize(agent, podB, "300m"), "resize-agent on node node-a may not write resize of pod e2e/on-b on node node-b")

	// pods/status: the agent's own condition type on its node, and
	// nothing else anywhere.
	if err := status(agent, podA, cond(kube.ConditionType, "True")); err != nil {
		t.Errorf("own condition on node-a: %v", err)
	}
	if err := status(agent, podA, cond(kube.ConditionType, "False")); err != nil {
		t.Errorf("own condition changed on node-a: %v", err)
	}
	only := "resize-agent may change only its own condition type " + kube.ConditionType + " in the status of pod e2e/on-a"
	denied("Ready", status(agent, podA, cond("Ready", "True")), only)
	denied("PodResizePending", status(agent, podA, `{"status":{"conditions":[{"type":"PodResizePending","status":"True","reason":"Infeasible"}]}}`), only)
	denied("podIP", status(agent, podA, `{"status":{"podIP":"10.0.0.9","podIPs":[{"ip":"10.0.0.9"}]}}`), only)
	denied("phase", status(agent, podA, `{"status":{"phase":"Failed"}}`), only)
	denied("labels through status", status(agent, podA, `{"metadata":{"labels":{"x":"y"}}}`), only)
	denied("annotations through status", status(agent, podA, `{"metadata":{"annotations":{"`+kube.AnnotationResources+`":"web:cpu=4"}}}`), only)
	denied("own condition on node-b", status(agent, podB, cond(kube.ConditionType, "True")), "may not write status of pod e2e/on-b on node node-b")
	got, err := admin.CoreV1().Pods(ns).Get(ctx, podA.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var conds []string
	for _, c := range got.Status.Conditions {
		conds = append(conds, string(c.Type)+"="+string(c.Status))
	}
	if !slices.Equal(conds, []string{kube.ConditionType + "=False"}) || got.Status.PodIP != "" || len(got.Labels) != 0 {
		t.Errorf("pod on node-a after the denied writes: conditions %v, podIP %q, labels %v", conds, got.Status.PodIP, got.Labels)
	}

	// Events: about a pod, as resize-agent from its node, its own reasons.
	event := func(component, host, reason string) error {
		e := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "on-a.", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: podA.Name, UID: podA.UID, APIVersion: "v1"},
			Reason:         reason, Message: "checked", Type: corev1.EventTypeNormal,
			Source:         corev1.EventSource{Component: component, Host: host},
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
		}
		_, err := agent.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{})
		return err
	}
	if err := event("resize-agent", "node-a", "ResizeVerified"); err != nil {
		t.Errorf("the agent's own Event: %v", err)
	}
	const evMsg = "may record Events only about pods, as source resize-agent on its own node"
	denied("Event as the kubelet", event("kubelet", "node-a", "ResizeVerified"), evMsg)
	denied("Event with the kubelet's reason", event("resize-agent", "node-a", "ResizeStarted"), evMsg)
	denied("Event from another node", event("resize-agent", "node-b", "ResizeVerified"), evMsg)

	// A token without the node claim (the static token: like a legacy
	// Secret token) writes nothing, even where RBAC allows it.
	denied("unbound token", status(cp.Agent(), podA, cond(kube.ConditionType, "True")), "the token has no node-name claim")

	// The policy binds the agent alone: the administrator (or the kubelet)
	// is not affected.
	if err := status(admin, podB, cond("Ready", "True")); err != nil {
		t.Errorf("the administrator's status write: %v", err)
	}

	// Reads: cluster-wide, as rbac.yaml explains (admission never sees
	// them); writes beyond the rules stay refused by RBAC.
	if l, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 3 {
		t.Errorf("cluster-wide pod list: %v (%d pods)", err, len(l.Items))
	}
	if _, err := agent.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("get its Node: %v", err)
	}
	for what, err := range map[string]error{
		"delete pod": agent.CoreV1().Pods(ns).Delete(ctx, podB.Name, metav1.DeleteOptions{}),
		"patch pod":  patchErr(agent.CoreV1().Pods(ns).Patch(ctx, podB.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})),
		"patch node": patchErr(agent.CoreV1().Nodes().Patch(ctx, "node-b", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
	checkPolicyCoversPodStatus(t, cp)
}

func patchErr[T any](_ T, err error) error { return err }

func createPod(t *testing.T, c kubernetes.Interface, namespace, name, node, sa string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "web", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "64Mi")}}}},
	}
	p, err := c.CoreV1().Pods(namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkPolicyCoversPodStatus: the policy compares every field of this API
// server's PodStatus (its OpenAPI schema) but conditions, so that a field
// added in a later version fails here instead of being writable.
func checkPolicyCoversPodStatus(t *testing.T, cp *ControlPlane) {
	t.Helper()
	body, err := cp.Admin().CoreV1().RESTClient().Get().AbsPath("/openapi/v3/api/v1").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	props := doc.Components.Schemas["io.k8s.api.core.v1.PodStatus"].Properties
	if len(props) < 20 {
		t.Fatalf("PodStatus has %d properties in the OpenAPI schema", len(props))
	}
	var vap *admissionv1.ValidatingAdmissionPolicy
	for _, o := range build(t, deployFS(t), "/deploy/base") {
		if v, ok := o.(*admissionv1.ValidatingAdmissionPolicy); ok && v.Name == policyName {
			vap = v
		}
	}
	var all string
	for _, v := range vap.Spec.Validations {
		all += v.Expression
	}
	for p := range props {
		if p == "conditions" {
			continue
		}
		if want := fmt.Sprintf("object.status.?%s == oldObject.status.?%s", p, p); !strings.Contains(all, want) {
			t.Errorf("PodStatus.%s is not compared by the policy (%q)", p, want)
		}
	}
}
