package capacity

import (
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/resizer/resize-agent/agent/kube/fit"
)

// Counter is where the Observer counts a prediction against the verdict
// (agent/metrics VerdictPredictions).
type Counter interface {
	Observe(predicted, actual string)
}

// Outcome is one resize the kubelet decided on.
type Outcome struct {
	Pod        types.NamespacedName
	UID        types.UID
	Generation int64
	Prediction fit.Prediction
	// Actual is the kubelet's verdict: Deferred, Infeasible, or Fit for a
	// resize it accepted (PodResizeInProgress, or the status shows the
	// new resources).
	Actual fit.Verdict
	// Message is the kubelet's PodResizePending message, if any.
	Message string
}

// Agrees reports whether the prediction was the kubelet's verdict.
func (o Outcome) Agrees() bool { return o.Prediction.Verdict == o.Actual }

// Observer predicts every resize of a pod on the node when its spec
// generation changes and, once the kubelet has decided, counts the
// prediction against the verdict.
type Observer struct {
	view    *View
	counter Counter
	// onOutcome, when set, is called for every outcome (the daemon logs
	// them); onError for a resize that could not be predicted.
	onOutcome func(Outcome)
	onError   func(types.NamespacedName, error)

	mu      sync.Mutex
	pending map[types.UID]*watched
}

type watched struct {
	gen  int64
	pred fit.Prediction
}

// NewObserver makes an observer of v's pods; it registers itself with v,
// so call it before v.Run. counter may be nil.
func NewObserver(v *View, counter Counter, onOutcome func(Outcome), onError func(types.NamespacedName, error)) (*Observer, error) {
	o := &Observer{view: v, counter: counter, onOutcome: onOutcome, onError: onError, pending: map[types.UID]*watched{}}
	err := v.AddPodHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			op, ok1 := old.(*corev1.Pod)
			np, ok2 := cur.(*corev1.Pod)
			if ok1 && ok2 {
				o.Update(op, np)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				o.mu.Lock()
				delete(o.pending, p.UID)
				o.mu.Unlock()
			}
		},
	})
	return o, err
}

// Pending is how many resizes wait for the kubelet's verdict.
func (o *Observer) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending)
}

// Update handles one update of a pod of the node. It is the informer's
// handler, exported for tests that feed it pods by hand.
func (o *Observer) Update(old, cur *corev1.Pod) {
	key := types.NamespacedName{Namespace: cur.Namespace, Name: cur.Name}
	o.mu.Lock()
	w := o.pending[cur.UID]
	o.mu.Unlock()
	if cur.Generation > old.Generation && resized(old, cur) {
		// Predicted now, against the other pods as they are when the API
		// server accepted the spec: what the kubelet sees when it admits.
		p, err := o.view.Predict(cur)
		if err != nil {
			if o.onError != nil {
				o.onError(key, err)
			}
			w = nil
		} else {
			w = &watched{gen: cur.Generation, pred: p}
		}
		o.mu.Lock()
		if w == nil {
			delete(o.pending, cur.UID)
		} else {
			o.pending[cur.UID] = w
		}
		o.mu.Unlock()
	}
	if w == nil {
		return
	}
	actual, msg, ok := Verdict(cur, w.gen)
	if !ok {
		return
	}
	o.mu.Lock()
	if o.pending[cur.UID] != w {
		o.mu.Unlock()
		return // replaced by a newer resize meanwhile
	}
	delete(o.pending, cur.UID)
	o.mu.Unlock()
	if o.counter != nil {
		o.counter.Observe(string(w.pred.Verdict), string(actual))
	}
	if o.onOutcome != nil {
		o.onOutcome(Outcome{Pod: key, UID: cur.UID, Generation: w.gen, Prediction: w.pred, Actual: actual, Message: msg})
	}
}

// resized reports whether the spec change between old and cur changes
// resources (of a container, an init container or the pod): a resize,
// whoever asked for it.
func resized(old, cur *corev1.Pod) bool {
	if !equality.Semantic.DeepEqual(old.Spec.Resources, cur.Spec.Resources) {
		return true
	}
	differ := func(a, b []corev1.Container) bool {
		if len(a) != len(b) {
			return true
		}
		for i := range a {
			if !equality.Semantic.DeepEqual(a[i].Resources, b[i].Resources) {
				return true
			}
		}
		return false
	}
	return differ(old.Spec.Containers, cur.Spec.Containers) || differ(old.Spec.InitContainers, cur.Spec.InitContainers)
}

// Verdict reads the kubelet's verdict on the resize of generation gen from
// the pod's status: PodResizePending (Deferred or Infeasible) or
// PodResizeInProgress observed at gen or later, or a status that holds
// the desired resources (a resize done between two status updates leaves
// no condition). The kubelet sets the conditions
// (pkg/kubelet/status/status_manager.go SetPodResizePendingCondition,
// SetPodResizeInProgressCondition) with the pod's generation as their
// observedGeneration from 1.34 (PodObservedGenerationTracking); before, a
// condition without one is taken as the answer.
func Verdict(p *corev1.Pod, gen int64) (fit.Verdict, string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue || (c.ObservedGeneration != 0 && c.ObservedGeneration < gen) {
			continue
		}
		switch c.Type {
		case corev1.PodResizePending:
			switch c.Reason {
			case corev1.PodReasonDeferred:
				return fit.Deferred, c.Message, true
			case corev1.PodReasonInfeasible:
				return fit.Infeasible, c.Message, true
			}
		case corev1.PodResizeInProgress:
			return fit.Fit, c.Message, true
		}
	}
	if slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress
	}) {
		return "", "", false // an older verdict still stands
	}
	if (p.Status.ObservedGeneration == 0 || p.Status.ObservedGeneration >= gen) && actuated(p) {
		return fit.Fit, "", true
	}
	return "", "", false
}

// actuated reports whether every running container's status shows its
// spec: allocated requests and actuated limits (what the kubelet reports
// once a resize is done; kubelet_pods.go convertToAPIContainerStatuses).
func actuated(p *corev1.Pod) bool {
	sts := slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
	check := func(c corev1.Container) bool {
		i := slices.IndexFunc(sts, func(s corev1.ContainerStatus) bool { return s.Name == c.Name })
		if i < 0 || sts[i].State.Running == nil {
			return true // not running: nothing to actuate
		}
		st := sts[i]
		var lim corev1.ResourceList
		if st.Resources != nil {
			lim = st.Resources.Limits
		}
		return sameList(c.Resources.Requests, st.AllocatedResources) && sameList(c.Resources.Limits, lim)
	}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways && !check(c) {
			return false
		}
	}
	for _, c := range p.Spec.Containers {
		if !check(c) {
			return false
		}
	}
	return true
}

// sameList compares the cpu and memory of two lists (the resources a
// resize changes).
func sameList(a, b corev1.ResourceList) bool {
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		x, okx := a[r]
		y, oky := b[r]
		if okx != oky || (okx && !x.Equal(y)) {
			return false
		}
	}
	return true
}
