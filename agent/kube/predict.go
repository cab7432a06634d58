package kube

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/kube/fit"
)

// Predictor foresees the kubelet's verdict on a resize: given the pod as it
// will be once patched (its spec with the desired resources), what the
// kubelet will say, or nil when it cannot tell (no capacity view yet). The
// intake calls it before every pods/resize patch and puts the prediction in
// the intent's message; agent/kube/capacity implements it from the Node's
// allocatable and the node's pods (fit.Predict).
type Predictor interface {
	Predict(desired *corev1.Pod) *fit.Prediction
}
