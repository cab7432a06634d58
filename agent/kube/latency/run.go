package latency

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// ReportingController names the agent in its Events.
const ReportingController = "resize-agent"

// Run watches the node's pods through client until ctx ends. It has its
// own informer rather than the intake's: the intake drops managedFields
// from its cache, and the time of the resize subresource's write is there.
func (t *Tracker) Run(ctx context.Context, client kubernetes.Interface) error {
	if t.opts.Recorder == nil {
		// Core v1 Events, as the intake records them (see intake.go): each
		// resize's line is its own note.
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
		defer b.Shutdown()
		t.mu.Lock()
		t.opts.Recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ReportingController, Host: t.opts.NodeName})
		t.mu.Unlock()
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", t.opts.NodeName).String()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.onPod(obj) },
		UpdateFunc: func(_, obj any) { t.onPod(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				t.gone(p.UID, time.Time{})
			}
		},
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	t.log.Info("resize latency tracking", "node", t.opts.NodeName, "poll", t.opts.Poll, "sampleEvery", t.opts.SampleEvery, "window", t.opts.Window)
	tk := time.NewTicker(t.opts.Poll)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			// Not the tick's own time, which a slow round before it makes
			// stale: the time under the lock (stamp).
			t.tick(time.Time{})
		}
	}
}

func (t *Tracker) onPod(obj any) {
	if p, ok := obj.(*corev1.Pod); ok {
		t.observe(p, time.Time{})
	}
}
