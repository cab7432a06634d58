package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// AnnotationPolicy names deploy/'s ValidatingAdmissionPolicy and its
// binding that let only a principal allowed to patch pods/resize of a pod
// set or change its AnnotationResources (deploy/base/annotationpolicy.yaml).
// Without them anyone who may patch a pod (the built-in edit role) could
// have the agent resize it with the agent's rights: the intake acts on no
// annotation until both are in force.
const AnnotationPolicy = "resize-agent-annotation"

// policyMarker is what the policy's validation must check: the pods/resize
// authorization of the request's user on the pod.
var policyMarker = []string{"subresource('resize')", "check('patch')", AnnotationResources}

// guard remembers whether the annotation policy is in force, and why not.
type guard struct {
	mu  sync.Mutex
	why string // "" when in force
}

func (g *guard) get() (ok bool, why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.why == "", g.why
}

// set records the outcome of a check; changed reports a change.
func (g *guard) set(why string) (changed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	changed, g.why = g.why != why, why
	return changed
}

// checkAnnotationPolicy returns "" when the policy and a binding of it that
// denies are in the API server, or why the intake must not act on
// annotations.
func checkAnnotationPolicy(ctx context.Context, c kubernetes.Interface) string {
	const fix = "; apply deploy/base (annotationpolicy.yaml) or the Helm chart: annotations are ignored until then"
	p, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, AnnotationPolicy, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("ValidatingAdmissionPolicy %s: %v%s", AnnotationPolicy, err, fix)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
		return fmt.Sprintf("ValidatingAdmissionPolicy %s: failurePolicy is not Fail%s", AnnotationPolicy, fix)
	}
	var exprs strings.Builder
	for _, v := range p.Spec.Validations {
		exprs.WriteString(v.Expression)
	}
	for _, v := range p.Spec.Variables {
		exprs.WriteString(v.Expression)
	}
	for _, m := range policyMarker {
		if !strings.Contains(exprs.String(), m) {
			return fmt.Sprintf("ValidatingAdmissionPolicy %s: no validation checks %s%s", AnnotationPolicy, m, fix)
		}
	}
	b, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, AnnotationPolicy, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("ValidatingAdmissionPolicyBinding %s: %v%s", AnnotationPolicy, err, fix)
	}
	if b.Spec.PolicyName != AnnotationPolicy || !slices.Contains(b.Spec.ValidationActions, admissionv1.Deny) {
		return fmt.Sprintf("ValidatingAdmissionPolicyBinding %s: does not bind %s with the Deny action%s", AnnotationPolicy, AnnotationPolicy, fix)
	}
	if b.Spec.MatchResources != nil && (b.Spec.MatchResources.NamespaceSelector != nil && len(b.Spec.MatchResources.NamespaceSelector.MatchLabels)+len(b.Spec.MatchResources.NamespaceSelector.MatchExpressions) > 0 ||
		b.Spec.MatchResources.ObjectSelector != nil && len(b.Spec.MatchResources.ObjectSelector.MatchLabels)+len(b.Spec.MatchResources.ObjectSelector.MatchExpressions) > 0) {
		return fmt.Sprintf("ValidatingAdmissionPolicyBinding %s: narrowed by a selector, so it may not cover every pod%s", AnnotationPolicy, fix)
	}
	return ""
}
