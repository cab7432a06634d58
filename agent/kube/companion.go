package kube

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/resizer/resize-agent/agent/kube/allocdrift"
	"github.com/resizer/resize-agent/agent/kube/capacity"
	"github.com/resizer/resize-agent/agent/kube/fit"
	"github.com/resizer/resize-agent/agent/kube/kubeletconfig"
	"github.com/resizer/resize-agent/agent/metrics"
)

// DriftConfig is the Kubernetes-mode drift check against the kubelet's
// allocation (agent/kube/allocdrift).
type DriftConfig struct {
	// Policy is report (default), restore or off.
	Policy allocdrift.Policy
	// Interval between checks (default 10s).
	Interval time.Duration
	// Runtime and Cgroups read the containers' cgroups and, under restore,
	// write the kubelet's values back; without them the check is off.
	Runtime allocdrift.Runtime
	Cgroups allocdrift.Cgroups
	// Period is the kubelet's CFS period (µs).
	Period uint64
	// Count counts a drift per resource and action
	// (resize_agent_drift_total).
	Count func(resource, action string)
	// Checked is called after every check (resize_agent_drift_checks_total).
	Checked func()
	// Writes and Sweep: allocdrift.Options's (reads follow the kernel's
	// limit writes where the eBPF hook is attached).
	Writes allocdrift.LimitWrites
	Sweep  time.Duration
}

// LivePredictor is the Predictor (predict.go) the capacity companion
// feeds: no prediction until its view has synced, or when the view cannot
// tell (an unsupported kubelet version).
type LivePredictor struct{ v atomic.Pointer[capacity.View] }

// Predict implements Predictor.
func (p *LivePredictor) Predict(desired *corev1.Pod) *fit.Prediction {
	v := p.v.Load()
	if v == nil || !v.Synced() {
		return nil
	}
	pr, err := v.Predict(desired)
	if err != nil {
		return nil
	}
	return &pr
}

var _ Predictor = (*LivePredictor)(nil)

// CapacityConfig configures the capacity companion.
type CapacityConfig struct {
	NodeName string
	// Predictions, when set, counts the capacity view's predictions
	// against the kubelet's verdicts.
	Predictions *metrics.VerdictPredictions
	// Drift is the drift check against the kubelet's allocation.
	Drift  DriftConfig
	Logger *slog.Logger
	// Predictor, when set, is fed the view (give the same to
	// Config.Predictor for the intake).
	Predictor *LivePredictor
	// Kubelet is the node's kubelet configuration file as read
	// (kubeletconfig.Load; the zero File: the kubelet's defaults): the
	// predictions take its CPU and memory manager policies, the drift
	// check its CPU quota and MemoryQoS settings, for the kubelet's
	// release the Node reports.
	Kubelet kubeletconfig.File
}

// Capacity is a companion (Config.Companions) that runs the kubelet's
// capacity view, the verdict observer and the allocation drift check
// until ctx ends.
func Capacity(c CapacityConfig) func(context.Context, kubernetes.Interface) error {
	return func(ctx context.Context, client kubernetes.Interface) error {
		_, stop, err := startCompanion(ctx, c, client)
		if err != nil {
			return err
		}
		<-ctx.Done()
		stop()
		return nil
	}
}

// startCompanion runs the capacity view, the verdict observer and the
// allocation drift check in the background; stop ends them and waits.
func startCompanion(ctx context.Context, c CapacityConfig, client kubernetes.Interface) (view *capacity.View, stop func(), err error) {
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	policies := c.Kubelet.Resolve(0) // the policies' defaults are the same in every release
	view, err = capacity.New(client, c.NodeName, capacity.Options{Kubelet: fit.Kubelet{
		CPUManagerPolicy: policies.CPUManagerPolicy, MemoryManagerPolicy: policies.MemoryManagerPolicy}})
	if err != nil {
		return nil, nil, err
	}
	if c.Predictor != nil {
		c.Predictor.v.Store(view)
	}
	var counter capacity.Counter
	if c.Predictions != nil {
		counter = c.Predictions
	}
	if _, err := capacity.NewObserver(view, counter, func(o capacity.Outcome) {
		log.Info("kubelet verdict on a resize", "pod", o.Pod.String(), "generation", o.Generation, "predicted", o.Prediction.Verdict,
			"actual", o.Actual, "agrees", o.Agrees(), "prediction", capacity.Summary(o.Prediction), "kubelet", o.Message)
	}, func(pod types.NamespacedName, err error) {
		log.Warn("resize not predicted", "pod", pod.String(), "err", err)
	}); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); view.Run(ctx) }()

	d := c.Drift
	if d.Policy != allocdrift.PolicyOff && d.Runtime != nil && d.Cgroups != nil {
		// Core v1 Events with the agent's own reason, as the intake's.
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
		rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ReportingController, Host: c.NodeName})
		checker, err := allocdrift.New(view.Pods, d.Runtime, d.Cgroups, allocdrift.Options{
			Policy: d.Policy, Period: d.Period, Count: d.Count, Checked: d.Checked, Recorder: rec, Writes: d.Writes, Sweep: d.Sweep,
			Kubelet: func() (allocdrift.Kubelet, bool) { return driftKubelet(view, c.Kubelet) },
			OnFinding: func(f allocdrift.Finding) {
				log.Warn("cgroup drift from the kubelet's allocation", "pod", f.Pod.String(), "container", f.Container, "cgroup", f.Cgroup,
					"action", f.Action, "files", f.Files, "message", f.Message, "after", time.Since(f.FirstSeen).Round(time.Millisecond))
			},
		})
		if err != nil {
			cancel()
			wg.Wait()
			b.Shutdown()
			return nil, nil, err
		}
		interval := d.Interval
		if interval <= 0 {
			interval = 10 * time.Second
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer b.Shutdown()
			if !view.WaitSynced(ctx) {
				return
			}
			log.Info("drift check against the kubelet's allocation", "policy", d.Policy, "interval", interval, "pods", len(view.Pods()))
			checker.Run(ctx, interval)
		}()
	}
	return view, func() { cancel(); wg.Wait() }, nil
}

// driftKubelet is what the drift check must know of the kubelet: its
// configuration for the release the Node reports, and the node's
// allocatable memory. ok false until the view has read the Node.
func driftKubelet(view *capacity.View, f kubeletconfig.File) (allocdrift.Kubelet, bool) {
	n, k, err := view.Node()
	if err != nil {
		return allocdrift.Kubelet{}, false
	}
	r := f.Resolve(k.Minor)
	return allocdrift.Kubelet{
		NoCPUQuota: !r.CPUQuota, MemoryHighFactor: r.ThrottlingFactor, PodLevelResources: r.PodLevelResources,
		// ApplyPodLevelMemoryHigh is in 1.37 (pkg/kubelet/cm/helpers_linux.go).
		PodMemoryHigh:     k.Minor >= 37,
		AllocatableMemory: n.Allocatable.Memory().Value(),
	}, true
}
