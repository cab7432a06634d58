package capacity

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/resizer/resize-agent/agent/kube/fit"
)

var (
	// ErrNotSynced is returned while the view has not listed the node's
	// pods or read its Node once: a prediction then would count too little.
	ErrNotSynced = errors.New("capacity view not synced yet")
	// ErrNotOnNode is returned for a pod bound to another node (or none).
	ErrNotOnNode = errors.New("pod is not bound to this node")
)

// Options configure a View.
type Options struct {
	// Kubelet is what the API does not tell of the kubelet (its CPU and
	// memory manager policies, whether PodResizeValidator is off). Minor,
	// when 0, is read from the Node's status.nodeInfo.kubeletVersion.
	Kubelet fit.Kubelet
	// NodeEvery is how often the Node is read again (default 10s, the
	// kubelet's nodeStatusUpdateFrequency). The Node is read with get, not
	// watched: the agent's RBAC grants get on nodes only.
	NodeEvery time.Duration
	// Resync of the pod informer (default 5m).
	Resync time.Duration
}

// View is the kubelet's capacity view of one node. Its methods are safe for
// concurrent use.
type View struct {
	client   kubernetes.Interface
	node     string
	opts     Options
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer

	mu      sync.RWMutex
	nodeObj *corev1.Node
	nodeErr error
}

// New makes the view of node's pods and Node; Run starts it.
func New(client kubernetes.Interface, node string, opts Options) (*View, error) {
	if node == "" {
		return nil, errors.New("capacity: the node name is required")
	}
	if opts.NodeEvery <= 0 {
		opts.NodeEvery = 10 * time.Second
	}
	if opts.Resync <= 0 {
		opts.Resync = 5 * time.Minute
	}
	v := &View{client: client, node: node, opts: opts}
	// Only this node's pods: the API server filters on spec.nodeName, as
	// the kubelet's own pod source does.
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	v.factory = informers.NewSharedInformerFactoryWithOptions(client, opts.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
	v.informer = v.factory.Core().V1().Pods().Informer()
	if err := v.informer.SetTransform(strip); err != nil {
		return nil, err
	}
	return v, nil
}

// strip drops the managed fields, which the view never reads, from a
// shallow copy (the object handed in may be shared with its source).
func strip(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok && p.ManagedFields != nil {
		q := *p
		q.ManagedFields = nil
		return &q, nil
	}
	return obj, nil
}

// AddPodHandler registers h for the pod informer's events (the Observer,
// the drift check). Call it before Run.
func (v *View) AddPodHandler(h cache.ResourceEventHandler) error {
	_, err := v.informer.AddEventHandler(h)
	return err
}

// Run keeps the view until ctx ends.
func (v *View) Run(ctx context.Context) {
	v.factory.Start(ctx.Done())
	defer v.factory.Shutdown()
	t := time.NewTicker(v.opts.NodeEvery)
	defer t.Stop()
	for {
		v.readNode(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (v *View) readNode(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := v.client.CoreV1().Nodes().Get(ctx, v.node, metav1.GetOptions{})
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			v.nodeErr = fmt.Errorf("reading node %s: %w", v.node, err)
		}
		return // the last Node read stays the view's
	}
	v.nodeObj, v.nodeErr = n, nil
}

// Synced reports whether the pods have been listed and the Node read.
func (v *View) Synced() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.nodeObj != nil && v.informer.HasSynced()
}

// WaitSynced waits until the view is synced or ctx ends.
func (v *View) WaitSynced(ctx context.Context) bool {
	for !v.Synced() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// Pods is the pods bound to the node, as cached (read only).
func (v *View) Pods() []*corev1.Pod {
	objs := v.informer.GetStore().List()
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName == v.node {
			out = append(out, p)
		}
	}
	return out
}

// Node is the node's fit input now and the kubelet it is predicted for.
func (v *View) Node() (fit.Node, fit.Kubelet, error) {
	v.mu.RLock()
	n, nerr := v.nodeObj, v.nodeErr
	v.mu.RUnlock()
	if n == nil || !v.informer.HasSynced() {
		if nerr != nil {
			return fit.Node{}, fit.Kubelet{}, fmt.Errorf("%w: %w", ErrNotSynced, nerr)
		}
		return fit.Node{}, fit.Kubelet{}, ErrNotSynced
	}
	k := v.opts.Kubelet
	if k.Minor == 0 {
		m, err := KubeletMinor(n.Status.NodeInfo.KubeletVersion)
		if err != nil {
			return fit.Node{}, fit.Kubelet{}, err
		}
		k.Minor = m
	}
	return fit.Node{Allocatable: n.Status.Allocatable, Pods: v.Pods()}, k, nil
}

// Predict tells what the kubelet will do with desired, a pod of this node
// with the spec a pods/resize patch gives it (or has just given it) and
// the status the API server shows now.
func (v *View) Predict(desired *corev1.Pod) (fit.Prediction, error) {
	if desired == nil || desired.Spec.NodeName != v.node {
		return fit.Prediction{}, ErrNotOnNode
	}
	n, k, err := v.Node()
	if err != nil {
		return fit.Prediction{}, err
	}
	return fit.Predict(k, n, desired)
}

// KubeletMinor reads the minor version of a kubeletVersion such as
// "v1.37.2" or "v1.36.0-eks-1".
func KubeletMinor(version string) (int, error) {
	s := strings.TrimPrefix(version, "v")
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 || parts[0] != "1" {
		return 0, fmt.Errorf("%w: kubelet version %q", fit.ErrInvalid, version)
	}
	m, err := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err != nil {
		return 0, fmt.Errorf("%w: kubelet version %q", fit.ErrInvalid, version)
	}
	return m, nil
}

// Summary is a prediction in one line with its numbers, for a message:
// "Deferred: cpu needed 3000m, free 350m of 3700m allocatable".
func Summary(p fit.Prediction) string {
	s := p.Shortfall
	if s == nil {
		if p.Message != "" {
			return string(p.Verdict) + ": " + p.Message
		}
		return string(p.Verdict)
	}
	f := func(v int64) string {
		switch s.Resource {
		case corev1.ResourceCPU:
			return strconv.FormatInt(v, 10) + "m"
		case corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
			return strconv.FormatInt(v, 10) + "B"
		}
		return strconv.FormatInt(v, 10)
	}
	if s.Used == 0 && p.Verdict != fit.Deferred {
		return fmt.Sprintf("%s: %s needed %s, %s allocatable", p.Verdict, s.Resource, f(s.Requested), f(s.Capacity))
	}
	return fmt.Sprintf("%s: %s needed %s, free %s of %s allocatable", p.Verdict, s.Resource, f(s.Requested), f(s.Free()), f(s.Capacity))
}
