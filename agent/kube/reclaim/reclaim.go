// Package reclaim helps the kubelet carry out memory limit decreases.
//
// Since 1.34 the kubelet lowers a memory limit in place only when the
// container's (or, with pod-level resources, the pod's) usage is below the
// new limit; otherwise it leaves the resize undone, PodResizeInProgress with
// reason Error, and tries again at its next sync of the pod. It never
// reclaims (validateMemoryResizeAction in
// pkg/kubelet/kuberuntime/kuberuntime_manager.go, 1.34 to 1.37; usage is
// memory.current, page cache included). A Reclaimer watches the pods bound
// to this node and, for a decrease the kubelet has not carried out while
// usage is at or above the new limit, brings usage under it the way the
// agent's own shrink does (actuate.ReclaimBelow: memory.high, then
// memory.reclaim in chunks, watching usage and PSI), and holds memory.high
// there until the kubelet's status reports the new limit; then it puts back
// the memory.high it found, unless the kubelet has set its own meanwhile
// (MemoryQoS). It never writes memory.max: the decrease stays the
// kubelet's. When usage will not come down (anonymous memory without swap)
// it puts memory.high back at once, says so in an Event of its own, a log
// line and a metric, and leaves that decrease alone.
package reclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/cgroup"
)

// Host is what a Reclaimer needs of the agent; *agent.Agent has it.
type Host interface {
	ContainerCgroups(ctx context.Context, podUID, name string) (ctr, pod string, err error)
	MemoryCgroups() (actuate.MemoryCgroups, bool)
}

// Event reasons, the agent's own (the kubelet's resize events are its).
const (
	// EventMemoryReclaimed: usage was brought under a new limit for the
	// kubelet to apply it.
	EventMemoryReclaimed = "MemoryReclaimed"
	// EventMemoryReclaimFailed: usage would not come down (or the kubelet
	// did not apply the decrease in time); memory.high is back as it was.
	EventMemoryReclaimFailed = "MemoryReclaimFailed"
)

// DefaultHold bounds how long memory.high stays lowered waiting for the
// kubelet: it retries a failed resize at its next sync of the pod, after a
// back-off of 10 s or at the latest at its periodic resync (1 min).
const DefaultHold = 3 * time.Minute

// Options configure a Reclaimer.
type Options struct {
	// NodeName is this node: only pods bound to it are watched.
	NodeName string
	Logger   *slog.Logger
	// Recorder, when set, replaces the Events recorder writing to the API
	// server.
	Recorder record.EventRecorder
	// Timeout bounds one reclaim (default actuate.DefaultShrinkTimeout).
	Timeout time.Duration
	// Hold bounds how long memory.high is held lowered (default DefaultHold).
	Hold time.Duration
	// Registerer, when set, gets the metrics.
	Registerer prometheus.Registerer
	// Poll is how often a held decrease is looked at (default 1 s).
	Poll time.Duration
}

// Reclaimer watches the pods bound to this node and reclaims memory ahead
// of the kubelet's decreases.
type Reclaimer struct {
	client   kubernetes.Interface
	host     Host
	mem      actuate.MemoryCgroups
	opts     Options
	log      *slog.Logger
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	metrics  *metrics

	mu sync.Mutex
	// held are the decreases whose cgroup has memory.high lowered, by pod
	// key and target ("" for the pod's own limit).
	held map[string]map[string]*hold
	// gaveUp is the desired limit a reclaim failed for, by pod key, then
	// pod UID and
	// target: not tried again until the spec asks for another.
	gaveUp map[string]map[string]int64
}

type hold struct {
	uid     types.UID
	desired int64
	r       actuate.Reclaimed
	since   time.Time
	pod     *corev1.Pod // for Events
}

// New creates a Reclaimer; Run starts it.
func New(client kubernetes.Interface, h Host, o Options) (*Reclaimer, error) {
	if o.NodeName == "" {
		return nil, errors.New("reclaim: no node name")
	}
	mem, ok := h.MemoryCgroups()
	if !ok {
		return nil, errors.New("reclaim: the agent's cgroup filesystem cannot reclaim memory")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Hold <= 0 {
		o.Hold = DefaultHold
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	r := &Reclaimer{
		client: client, host: h, mem: mem, opts: o, log: o.Logger, recorder: o.Recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "resize-agent-reclaim"}),
		metrics: newMetrics(o.Registerer),
		held:    map[string]map[string]*hold{},
		gaveUp:  map[string]map[string]int64{},
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", o.NodeName).String()
	r.factory = informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.FieldSelector = selector }))
	r.informer = r.factory.Core().V1().Pods().Informer()
	add := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	if _, err := r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add,
	}); err != nil {
		return nil, err
	}
	return r, nil
}

// Companion is a Reclaimer as a companion of the Kubernetes intake
// (kube.Config.Companions): created with the intake's client, run until
// the intake stops. Its metrics are registered once.
func Companion(h Host, o Options) func(context.Context, kubernetes.Interface) error {
	return func(ctx context.Context, client kubernetes.Interface) error {
		r, err := New(client, h, o)
		if err != nil {
			return err
		}
		return r.Run(ctx)
	}
}

// Run runs the Reclaimer until ctx ends, then puts back every memory.high
// it holds lowered.
func (r *Reclaimer) Run(ctx context.Context) error {
	defer r.queue.ShutDown()
	if r.recorder == nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.client.CoreV1().Events("")})
		defer b.Shutdown()
		r.recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "resize-agent", Host: r.opts.NodeName})
	}
	r.factory.Start(ctx.Done())
	defer r.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), r.informer.HasSynced) {
		return fmt.Errorf("reclaim: pods not listed: %w", context.Cause(ctx))
	}
	r.log.Info("memory reclaim for the kubelet's decreases starting", "node", r.opts.NodeName)
	go func() { <-ctx.Done(); r.queue.ShutDown() }()
	for {
		key, quit := r.queue.Get()
		if quit {
			break
		}
		if err := r.sync(ctx, key); err != nil {
			r.log.Warn("reclaim: pod not handled; retrying", "pod", key, "err", err)
			r.queue.AddRateLimited(key)
		} else {
			r.queue.Forget(key)
		}
		r.queue.Done(key)
	}
	r.releaseAll("the agent is stopping")
	return nil
}

// Decrease is a memory limit decrease the kubelet has not carried out: the
// pod's spec (desired) asks for less than its status reports (actuated).
type Decrease struct {
	// Container is the container's name; "" for the pod's own limit
	// (pod-level resources).
	Container         string
	Desired, Actuated int64
}

// Pending lists p's memory limit decreases the kubelet has not carried out
// yet: its containers' and sidecars' (restartable init containers, which
// the kubelet resizes in place too), then the pod's (whose usage holds
// theirs, so that reclaiming for them first may be all it takes). Only
// running pods with a status reporting the limits are judged.
func Pending(p *corev1.Pod) []Decrease {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return nil
	}
	desired, actuated := limits(p)
	var out []Decrease
	for _, c := range resizable(p) {
		if d, a := desired[c.Name], actuated[c.Name]; d > 0 && a > d {
			out = append(out, Decrease{Container: c.Name, Desired: d, Actuated: a})
		}
	}
	if d, a := desired[""], actuated[""]; d > 0 && a > d {
		out = append(out, Decrease{Desired: d, Actuated: a})
	}
	return out
}

// resizable are p's containers the kubelet resizes in place: its
// containers and its sidecars.
func resizable(p *corev1.Pod) []*corev1.Container {
	var out []*corev1.Container
	for i := range p.Spec.InitContainers {
		if c := &p.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			out = append(out, c)
		}
	}
	for i := range p.Spec.Containers {
		out = append(out, &p.Spec.Containers[i])
	}
	return out
}

// limits are the memory limits p's spec asks for (desired) and its status
// reports (actuated), by running container or sidecar and, under "", for
// the pod cgroup. The pod's is its own with pod-level resources;
// otherwise, as the kubelet's validateMemoryResizeAction judges it, the
// pod cgroup's memory.max (ResourceConfigForPod,
// pkg/kubelet/cm/helpers_linux.go, through agent/kube/podcgroup: every
// container's limit, sidecars and init containers counted the kubelet's
// way, overhead added; none unless all of them have one) over the spec
// and over what the status reports: lowering a container's limit lowers
// the pod's, and the kubelet refuses that too while the pod's usage (the
// pause container's included) is not under it. The pod's is judged only
// while every container and sidecar runs with its limits reported.
func limits(p *corev1.Pod) (desired, actuated map[string]int64) {
	limit := func(rr *corev1.ResourceRequirements) int64 {
		if rr == nil {
			return 0
		}
		q := rr.Limits[corev1.ResourceMemory]
		return q.Value()
	}
	desired, actuated = map[string]int64{}, map[string]int64{}
	status := map[string]*corev1.ContainerStatus{}
	for _, l := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range l {
			status[l[i].Name] = &l[i]
		}
	}
	reported := true
	for _, c := range resizable(p) {
		cs := status[c.Name]
		if cs == nil || cs.State.Running == nil || limit(cs.Resources) == 0 {
			reported = false
			continue
		}
		desired[c.Name], actuated[c.Name] = limit(&c.Resources), limit(cs.Resources)
	}
	switch {
	case p.Spec.Resources != nil && limit(p.Spec.Resources) > 0:
		desired[""], actuated[""] = limit(p.Spec.Resources), limit(p.Status.Resources)
	case reported:
		d, a := podcgroup.ForPod(p).MemoryLimit, podcgroup.ForPod(podcgroup.Allocated(p)).MemoryLimit
		if d > 0 && a > 0 {
			desired[""], actuated[""] = d, a
		}
	}
	return desired, actuated
}

func (r *Reclaimer) sync(ctx context.Context, key string) error {
	obj, exists, err := r.informer.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	var pod *corev1.Pod
	if exists {
		pod = obj.(*corev1.Pod)
	}
	var decs []Decrease
	pending := map[string]Decrease{}
	if pod != nil {
		decs = Pending(pod)
		for _, d := range decs {
			pending[d.Container] = d
		}
	}
	// Holds first: a decrease the kubelet has carried out, or that the spec
	// no longer asks for, or held too long, gets its memory.high back.
	r.mu.Lock()
	holds := r.held[key]
	r.mu.Unlock()
	for target, h := range holds {
		d, ok := pending[target]
		switch {
		case pod == nil || pod.UID != h.uid:
			r.release(key, target, h, "the pod is gone", false)
		case !ok:
			why, act := "the kubelet applied the decrease", actuatedLimit(pod, target)
			if act != h.desired {
				why = fmt.Sprintf("the spec no longer asks for %s (the kubelet reports %s)", intent.FormatMemory(h.desired), intent.FormatMemory(act))
			}
			r.release(key, target, h, why, act == h.desired)
		case d.Desired != h.desired:
			r.release(key, target, h, fmt.Sprintf("the spec now asks for %s", intent.FormatMemory(d.Desired)), false)
		case time.Since(h.since) > r.opts.Hold:
			r.release(key, target, h, fmt.Sprintf("the kubelet did not apply the decrease within %s", r.opts.Hold), false)
			r.giveUp(key, h.uid, target, h.desired)
		}
	}
	if pod == nil {
		r.mu.Lock()
		delete(r.gaveUp, key)
		r.mu.Unlock()
		return nil
	}
	var errs []error
	containerFailed := false
	for _, d := range decs {
		target := d.Container
		r.mu.Lock()
		_, isHeld := r.held[key][target]
		failed, gave := r.gaveUp[key][string(pod.UID)+"/"+target]
		r.mu.Unlock()
		if gave && failed == d.Desired && target != "" {
			containerFailed = true
		}
		// The pod's usage holds its containers': when theirs will not come
		// down, the pod's will not either, and one message says so.
		if isHeld || (gave && failed == d.Desired) || (target == "" && containerFailed) {
			continue
		}
		if err := r.reclaim(ctx, key, pod, d); err != nil {
			errs = append(errs, err)
		}
		r.mu.Lock()
		if failed, gave := r.gaveUp[key][string(pod.UID)+"/"+target]; gave && failed == d.Desired && target != "" {
			containerFailed = true
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	n := len(r.held[key])
	r.mu.Unlock()
	if n > 0 {
		r.queue.AddAfter(key, r.opts.Poll)
	}
	return errors.Join(errs...)
}

// actuatedLimit is the memory limit p's status reports for target.
func actuatedLimit(p *corev1.Pod, target string) int64 {
	_, a := limits(p)
	return a[target]
}

func what(pod *corev1.Pod, target string) string {
	if target == "" {
		return "pod " + pod.Namespace + "/" + pod.Name
	}
	return "container " + target + " of pod " + pod.Namespace + "/" + pod.Name
}

// reclaim brings the usage of d's cgroup under d.Desired when it is at or
// above it (the kubelet refuses a limit at or below usage).
func (r *Reclaimer) reclaim(ctx context.Context, key string, pod *corev1.Pod, d Decrease) error {
	name := d.Container
	if name == "" {
		if len(pod.Spec.Containers) == 0 {
			return nil
		}
		name = pod.Spec.Containers[0].Name
	}
	ctr, podCg, err := r.host.ContainerCgroups(ctx, string(pod.UID), name)
	if err != nil {
		return fmt.Errorf("finding the cgroup of %s: %w", what(pod, d.Container), err)
	}
	path := ctr
	if d.Container == "" {
		if path = podCg; path == "" {
			return fmt.Errorf("%s has no pod cgroup", what(pod, ""))
		}
	}
	m, err := r.mem.ReadMemory(path)
	if err != nil {
		return fmt.Errorf("reading the memory of %s: %w", what(pod, d.Container), err)
	}
	// Within 1% of the new limit is close enough to lose the kubelet's
	// race (kubernetes/kubernetes#135670): reclaim then too.
	if m.Current < d.Desired-d.Desired/100 {
		return nil
	}
	log := r.log.With("pod", key, "container", d.Container, "cgroup", path)
	log.Info("memory limit decrease below usage pending at the kubelet; reclaiming",
		"desired", d.Desired, "actuated", d.Actuated, "usage", m.Current)
	rec := actuate.ReclaimBelow(ctx, r.mem, path, d.Desired, r.opts.Timeout)
	r.metrics.observe(rec)
	if rec.Err != nil {
		r.giveUp(key, pod.UID, d.Container, d.Desired)
		msg := fmt.Sprintf("cannot bring %s under its new memory limit %s for the kubelet to apply it: %s; the container is left running as it was, and the kubelet keeps the resize in progress until usage falls",
			what(pod, d.Container), intent.FormatMemory(d.Desired), rec.Message)
		log.Warn("memory reclaim for a kubelet decrease failed", "err", rec.Err, "reclaimed", rec.Amount(), "took", rec.Took,
			"memoryHigh", actuate.HighText(rec.Set), "detail", rec.Message)
		r.recorder.Event(pod, corev1.EventTypeWarning, EventMemoryReclaimFailed, msg)
		return nil
	}
	h := &hold{uid: pod.UID, desired: d.Desired, r: rec, since: time.Now(), pod: pod}
	r.mu.Lock()
	if r.held[key] == nil {
		r.held[key] = map[string]*hold{}
	}
	r.held[key][d.Container] = h
	r.mu.Unlock()
	msg := fmt.Sprintf("reclaimed %s of %s in %s for the kubelet to lower its memory limit to %s (usage %s -> %s); memory.high held at %s until it does (was %s)",
		mib(rec.Amount()), what(pod, d.Container), rec.Took.Round(time.Millisecond), intent.FormatMemory(d.Desired),
		mib(rec.Before.Current), mib(rec.After.Current), actuate.HighText(rec.Set), actuate.HighText(rec.Found))
	log.Info("memory reclaimed for a kubelet decrease", "reclaimed", rec.Amount(), "took", rec.Took,
		"memoryHigh", rec.Set, "found", actuate.HighText(rec.Found), "detail", rec.Message)
	r.recorder.Event(pod, corev1.EventTypeNormal, EventMemoryReclaimed, msg)
	return nil
}

// release puts back the memory.high a hold found (see actuate.RestoreHigh)
// and forgets the hold.
func (r *Reclaimer) release(key, target string, h *hold, why string, applied bool) {
	r.mu.Lock()
	delete(r.held[key], target)
	if len(r.held[key]) == 0 {
		delete(r.held, key)
	}
	r.mu.Unlock()
	now, wrote, err := actuate.RestoreHigh(r.mem, h.r)
	held := time.Since(h.since)
	log := r.log.With("pod", key, "container", target, "cgroup", h.r.Path, "why", why, "held", held)
	switch {
	case err != nil && !errors.Is(err, cgroup.ErrNotFound):
		log.Warn("reclaim: cannot restore memory.high", "err", err)
	case err != nil:
		log.Info("reclaim: cgroup gone; nothing to restore")
	case wrote:
		log.Info("reclaim: memory.high restored", "memoryHigh", actuate.HighText(now))
	default:
		log.Info("reclaim: memory.high left as another writer set it (the kubelet, under MemoryQoS)", "memoryHigh", actuate.HighText(now), "found", actuate.HighText(h.r.Found))
	}
	if applied {
		r.metrics.applied.Observe(held.Seconds())
		return
	}
	if h.pod != nil && why != "the pod is gone" && why != "the agent is stopping" {
		r.recorder.Event(h.pod, corev1.EventTypeWarning, EventMemoryReclaimFailed,
			fmt.Sprintf("memory.high of %s back to %s after %s: %s", what(h.pod, target), actuate.HighText(now), held.Round(time.Second), why))
	}
}

// giveUp records that a reclaim for target's desired limit failed: it is
// not tried again until the spec asks for another limit.
func (r *Reclaimer) giveUp(key string, uid types.UID, target string, desired int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gaveUp[key] == nil {
		r.gaveUp[key] = map[string]int64{}
	}
	r.gaveUp[key][string(uid)+"/"+target] = desired
}

func (r *Reclaimer) releaseAll(why string) {
	r.mu.Lock()
	var all []func()
	for key, hs := range r.held {
		for target, h := range hs {
			all = append(all, func() { r.release(key, target, h, why, false) })
		}
	}
	r.mu.Unlock()
	for _, f := range all {
		f()
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
