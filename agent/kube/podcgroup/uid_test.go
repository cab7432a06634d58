package podcgroup_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resizer/resize-agent/agent/kube/podcgroup"
)

func TestUID(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "0b9a1d6e-1111-4222-8333-944455556666"}}
	if got := podcgroup.UID(p); got != p.UID || podcgroup.Mirror(p) {
		t.Errorf("a plain pod: UID %q, mirror %v", got, podcgroup.Mirror(p))
	}
	// A mirror pod: the API server's UID is its own; the kubelet's (the
	// static pod's, the manifest's hash) names its cgroups.
	p.Annotations = map[string]string{podcgroup.MirrorAnnotation: "6d8cb1b8f5a3b1c0e0f2a9d4c7e6b5a4"}
	if got := podcgroup.UID(p); got != "6d8cb1b8f5a3b1c0e0f2a9d4c7e6b5a4" || !podcgroup.Mirror(p) {
		t.Errorf("a mirror pod: UID %q, mirror %v", got, podcgroup.Mirror(p))
	}
}
