package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/intent"
)

// Agent is what the intake needs of the agent; *agent.Agent implements it.
type Agent interface {
	SubmitFrom(intent.Origin, intent.Spec) (intent.Intent, bool, error)
	Get(id string) (intent.Intent, error)
	Watch(ctx context.Context, f agent.Filter) <-chan agent.Event
	ForgetContainer(agent.Key) error
	List(f agent.Filter, state intent.State) []intent.Intent
}

var _ Agent = (*agent.Agent)(nil)

// FieldManager names the agent in the API server's records of who wrote
// what, and ReportingController in its Events.
const (
	FieldManager        = "resize-agent"
	ReportingController = "resize-agent"
)

// Event reasons, the kubelet's for in-place resizes.
const (
	EventResizeStarted    = "ResizeStarted"
	EventResizeCompleted  = "ResizeCompleted"
	EventResizeDeferred   = "ResizeDeferred"
	EventResizeInfeasible = "ResizeInfeasible"
	EventResizeError      = "ResizeError"
	// EventCgroupDrift is the agent's own: a container's cgroup values were
	// changed behind its back and it restored or adopted them (drift.go).
	EventCgroupDrift = "CgroupDrift"
)

// Options configure an Intake.
type Options struct {
	// NodeName is this node: only pods bound to it are watched.
	NodeName string
	// Mode says where resize requests come from (default annotation).
	Mode Mode
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Resync is how often every pod is looked at again even if nothing
	// changed (default 5m).
	Resync time.Duration
	// RetryBase and RetryMax bound the backoff of a pod whose intents or
	// status could not be written (defaults 200ms, 30s).
	RetryBase, RetryMax time.Duration
	// Workers is how many pods are handled at once (default 2).
	Workers int
	// Recorder, when set, replaces the Events recorder that writes to the
	// API server through the client.
	Recorder record.EventRecorder
	// Now replaces time.Now, for tests.
	Now func() time.Time
}

// Intake watches the pods bound to this node, submits their resize
// requests to the agent and reports back on the pods.
type Intake struct {
	client   kubernetes.Interface
	agent    Agent
	opts     Options
	log      *slog.Logger
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder

	mu    sync.Mutex
	pods  map[types.UID]*podState
	byKey map[string]types.UID

	// emitted is the last state an Event was recorded for, per intent;
	// only the agent watcher touches it.
	emitted map[string]intent.State

	// noGeneration is set when the API server drops the conditions'
	// observedGeneration (its feature gate off): it is then neither sent
	// nor compared, or every sync would patch again.
	noGeneration atomic.Bool
}

// podState is what the intake knows of one pod. Only the worker handling
// the pod's key touches its fields (the queue hands a key to one worker at
// a time).
type podState struct {
	key        string
	uid        types.UID
	containers map[string]*ctrState
	// refusals are requests refused before they became intents, by
	// container ("" for the whole annotation).
	refusals map[string]string
	// warned is when a refusal was last logged; suppressed counts those
	// not logged since.
	warned     time.Time
	suppressed int
	// wrote is set once the intake has set a resize condition on the pod:
	// it then removes them too when the resize ends.
	wrote bool
}

type ctrState struct {
	fieldPath string
	// id is the intent last submitted for the container, hash its spec's.
	id, hash string
	// wanted is the hash of what the pod asks for now ("" if nothing).
	wanted string
	// refused is the agent's refusal of the spec with hash refusedHash.
	refused, refusedHash string
}

const uidIndex = "uid"

// New returns an Intake for the pods of opts.NodeName; Run starts it.
func New(client kubernetes.Interface, a Agent, opts Options) (*Intake, error) {
	if opts.NodeName == "" {
		return nil, errors.New("kube: the node name is required")
	}
	if opts.Mode == "" {
		opts.Mode = ModeAnnotation
	}
	if _, err := ParseMode(string(opts.Mode)); err != nil || opts.Mode == ModeOff {
		return nil, fmt.Errorf("kube: mode %q", opts.Mode)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Resync == 0 {
		opts.Resync = 5 * time.Minute
	}
	if opts.RetryBase == 0 {
		opts.RetryBase = 200 * time.Millisecond
	}
	if opts.RetryMax == 0 {
		opts.RetryMax = 30 * time.Second
	}
	if opts.Workers == 0 {
		opts.Workers = 2
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	in := &Intake{
		client: client, agent: a, opts: opts, log: opts.Logger,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.RetryBase, opts.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "resize-agent-pods"}),
		pods: map[types.UID]*podState{}, byKey: map[string]types.UID{}, emitted: map[string]intent.State{},
		recorder: opts.Recorder,
	}
	// Only this node's pods: the API server filters, so a node's agent
	// never lists or watches the whole cluster's pods.
	selector := fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
	in.factory = informers.NewSharedInformerFactoryWithOptions(client, opts.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
	in.informer = in.factory.Core().V1().Pods().Informer()
	if err := in.informer.SetTransform(stripPod); err != nil {
		return nil, err
	}
	if err := in.informer.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	if _, err := in.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    in.enqueue,
		UpdateFunc: func(_, obj any) { in.enqueue(obj) },
		DeleteFunc: in.enqueue,
	}); err != nil {
		return nil, err
	}
	if err := in.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		// The reflector lists again with backoff; say so once per failure.
		in.log.Warn("pod watch interrupted; listing again with backoff", "err", err)
	}); err != nil {
		return nil, err
	}
	return in, nil
}

// stripPod drops what the intake never reads from the cached pods. It
// caches a shallow copy rather than clearing the field in place: the object
// handed in may be shared with its source (client-go's fake clientset keeps
// the same pod in its tracker, and the race detector caught the write), and
// the copy costs one struct, the rest being shared read-only as any cached
// object is.
func stripPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok && p.ManagedFields != nil {
		q := *p
		q.ManagedFields = nil
		return &q, nil
	}
	return obj, nil
}

func (in *Intake) enqueue(obj any) {
	if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != in.opts.NodeName {
		return
	}
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	in.queue.Add(key)
}

// HasSynced reports whether the pods have been listed once.
func (in *Intake) HasSynced() bool { return in.informer.HasSynced() }

// Run runs the intake until ctx ends. It waits for the first list of pods
// (however long the API server takes to answer), then handles them.
func (in *Intake) Run(ctx context.Context) error {
	defer in.queue.ShutDown()
	if in.recorder == nil {
		// Core v1 Events, as the kubelet records its resize events. Not
		// events.k8s.io/v1: its recorder folds every event with the same
		// reason about the same object into one series that keeps the
		// first note, so a second resize of a container would never show
		// its own message. This one counts only identical events together.
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: in.client.CoreV1().Events("")})
		defer b.Shutdown()
		in.recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ReportingController, Host: in.opts.NodeName})
	}
	in.factory.Start(ctx.Done())
	defer in.factory.Shutdown()
	in.log.Info("kubernetes intake starting", "node", in.opts.NodeName, "mode", in.opts.Mode)
	if !cache.WaitForCacheSync(ctx.Done(), in.informer.HasSynced) {
		return nil
	}
	in.log.Info("kubernetes intake synced", "pods", len(in.informer.GetIndexer().ListKeys()))
	var wg sync.WaitGroup
	wg.Add(1)
	// Subscribed before any worker submits: an intent that ran its course
	// before the watcher goroutine got going had no Events.
	ch := in.agent.Watch(ctx, agent.Filter{})
	go func() { defer wg.Done(); in.watchAgent(ctx, ch) }()
	for range in.opts.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); wait.UntilWithContext(ctx, in.work, time.Second) }()
	}
	<-ctx.Done()
	in.queue.ShutDown()
	wg.Wait()
	return nil
}

func (in *Intake) work(ctx context.Context) {
	for {
		key, quit := in.queue.Get()
		if quit {
			return
		}
		err := in.sync(ctx, key)
		var w waiting
		switch {
		case err == nil:
			in.queue.Forget(key)
		case errors.As(err, &w):
			in.log.Debug("pod waits", "pod", key, "why", err)
			in.queue.AddRateLimited(key)
		default:
			in.log.Warn("pod not synced; retrying with backoff", "pod", key, "err", err, "retries", in.queue.NumRequeues(key))
			in.queue.AddRateLimited(key)
		}
		in.queue.Done(key)
	}
}

// waiting is an error that only means "not yet": the container is not
// running in the runtime yet, for instance.
type waiting struct{ error }

func (w waiting) Unwrap() error { return w.error }

// sync makes the agent's intents and the pod's conditions follow the pod.
func (in *Intake) sync(ctx context.Context, key string) error {
	obj, exists, err := in.informer.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		in.podGone(key)
		return nil
	}
	pod := obj.(*corev1.Pod)
	if pod.Spec.NodeName != in.opts.NodeName || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		// Its containers are gone: what they held is free again.
		in.podGone(key)
		return nil
	}
	ps := in.state(key, pod.UID)
	var errs []error
	for _, cs := range ps.containers {
		cs.wanted = ""
	}
	if pod.DeletionTimestamp == nil {
		desired, refusals := DesiredFor(pod, in.opts.Mode)
		in.setRefusals(pod, ps, refusals)
		for _, d := range desired {
			if err := in.submit(pod, ps, d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := in.syncStatus(ctx, pod, ps); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// state returns the pod's state, forgetting an older pod of the same name.
func (in *Intake) state(key string, uid types.UID) *podState {
	in.mu.Lock()
	old, ok := in.byKey[key]
	in.mu.Unlock()
	if ok && old != uid {
		in.podGone(key)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	ps := in.pods[uid]
	if ps == nil {
		ps = &podState{key: key, uid: uid, containers: map[string]*ctrState{}, refusals: map[string]string{}}
		in.pods[uid] = ps
		in.byKey[key] = uid
	}
	return ps
}

// podGone forgets a pod that was deleted or whose containers have all
// ended, and has the agent forget its containers, which frees their
// capacity for Deferred resizes.
func (in *Intake) podGone(key string) {
	in.mu.Lock()
	uid, ok := in.byKey[key]
	ps := in.pods[uid]
	delete(in.byKey, key)
	delete(in.pods, uid)
	in.mu.Unlock()
	if !ok || ps == nil {
		return
	}
	for name, cs := range ps.containers {
		if cs.id == "" {
			continue
		}
		err := in.agent.ForgetContainer(agent.Key{PodUID: string(uid), Name: name})
		if err != nil && !errors.Is(err, agent.ErrNotFound) {
			in.log.Warn("forgetting container of a gone pod", "pod", key, "container", name, "err", err)
		} else if err == nil {
			in.log.Info("container of a gone pod forgotten", "pod", key, "container", name)
		}
	}
}

func (in *Intake) setRefusals(pod *corev1.Pod, ps *podState, refusals []Refusal) {
	now := map[string]string{}
	for _, r := range refusals {
		if m, ok := now[r.Container]; ok {
			now[r.Container] = m + "; " + r.Message
		} else {
			now[r.Container] = r.Message
		}
	}
	var changed []string
	for c, m := range now {
		if ps.refusals[c] != m {
			changed = append(changed, c)
		}
	}
	ps.refusals = now
	if len(changed) == 0 {
		return
	}
	sort.Strings(changed)
	for _, c := range changed {
		in.event(pod, fieldPathOf(pod, c), corev1.EventTypeWarning, EventResizeError, printable(c), now[c])
	}
	// One line per pod and interval, cut short: what is refused is on the
	// pod (Events, conditions) for whoever wants all of it.
	ps.suppressed += len(changed)
	if t := time.Now(); t.Sub(ps.warned) >= refusalLogInterval {
		var b strings.Builder
		for i, c := range changed {
			if i > 0 {
				b.WriteString("; ")
			}
			if c != "" {
				b.WriteString("container " + printable(c) + ": ")
			}
			b.WriteString(now[c])
			if b.Len() > maxRefusalLog {
				break
			}
		}
		in.log.Warn("resize request refused", "pod", ps.key, "refusals", ps.suppressed, "message", truncate(b.String(), maxRefusalLog))
		ps.warned, ps.suppressed = t, 0
	}
}

// printable is a container name from an annotation as a message may show
// it: quoted when it holds control characters, and cut short.
func printable(name string) string {
	if intent.CheckPrintable("", name) != nil {
		name = strconv.Quote(name)
	}
	return truncate(name, maxNameInMessage)
}

// Refusals of a pod's requests are logged at most once per
// refusalLogInterval, in at most maxRefusalLog bytes.
const (
	refusalLogInterval = time.Minute
	maxRefusalLog      = 1024
)

// submit hands one container's desired resources to the agent, unless the
// agent already has that intent.
func (in *Intake) submit(pod *corev1.Pod, ps *podState, d Desired) error {
	cs := ps.containers[d.Container]
	if cs == nil {
		cs = &ctrState{}
		ps.containers[d.Container] = cs
	}
	cs.fieldPath, cs.wanted = d.FieldPath, d.Hash
	if cs.refusedHash == d.Hash {
		return nil // refused; only another request can change that
	}
	if cs.id == "" {
		// First sight since the intake started: the agent may have this
		// container's intents from before (the intake alone restarted).
		cs.id = in.latestID(pod.UID, d.Container)
	}
	if cs.hash == d.Hash && cs.id != "" {
		if _, err := in.agent.Get(cs.id); err == nil {
			return nil
		}
	}
	spec := d.Spec
	spec.ID = in.pickID(cs, d)
	_, created, err := in.agent.SubmitFrom(intent.OriginKubernetes, spec)
	switch {
	case err == nil:
		cs.id, cs.hash, cs.refused, cs.refusedHash = spec.ID, d.Hash, "", ""
		if created {
			in.log.Info("resize submitted", "pod", ps.key, "container", d.Container, "intent", spec.ID, "source", d.Source, "resources", describe(spec.Resources))
		}
		return nil
	case errors.Is(err, intent.ErrInvalid) || errors.Is(err, agent.ErrConflict):
		cs.refused, cs.refusedHash = err.Error(), d.Hash
		in.log.Warn("resize refused by the agent", "pod", ps.key, "container", d.Container, "intent", spec.ID, "err", err)
		in.event(pod, d.FieldPath, corev1.EventTypeWarning, EventResizeError, d.Container, err.Error())
		return nil
	case errors.Is(err, agent.ErrNotFound):
		return waiting{fmt.Errorf("container %s: %w", d.Container, err)}
	case errors.Is(err, agent.ErrShuttingDown):
		return nil
	}
	return fmt.Errorf("submitting the resize of container %s: %w", d.Container, err)
}

// pickID is the ID for d: the plain one, unless the agent holds an intent
// of that ID that is not the container's latest (the same resources were
// asked for before, then others): then the next free one. The sequence is
// the same on every pass, so a re-list lands on the ID already used.
func (in *Intake) pickID(cs *ctrState, d Desired) string {
	for n := 0; ; n++ {
		id := IntentID(d, n)
		if id == cs.id {
			return id
		}
		if _, err := in.agent.Get(id); errors.Is(err, agent.ErrNotFound) || n >= 1000 {
			return id
		}
	}
}

// latestID is the newest intent the intake submitted for the container
// that the agent still holds, "" if none.
func (in *Intake) latestID(uid types.UID, name string) string {
	its := in.agent.List(agent.Filter{Container: name}, "")
	for i := len(its) - 1; i >= 0; i-- {
		if t := its[i].Spec.Target; its[i].Origin == intent.OriginKubernetes && t.PodUID == string(uid) && t.Name == name {
			return its[i].ID
		}
	}
	return ""
}

// syncStatus sets the pod's resize conditions from its containers' intents.
func (in *Intake) syncStatus(ctx context.Context, pod *corev1.Pod, ps *podState) error {
	var states []containerState
	for c, m := range ps.refusals {
		states = append(states, containerState{Container: c, Message: m, Refused: true})
	}
	names := make([]string, 0, len(ps.containers))
	for name := range ps.containers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cs := ps.containers[name]
		if cs.wanted != "" && cs.refusedHash == cs.wanted {
			states = append(states, containerState{Container: name, Message: cs.refused, Refused: true})
			continue
		}
		if cs.id == "" {
			continue
		}
		it, err := in.agent.Get(cs.id)
		if err != nil {
			continue // dropped from the agent's history: nothing to report
		}
		if cs.wanted == "" && it.Status.State.Terminal() {
			// No longer asked for and done with: forget it.
			delete(ps.containers, name)
			continue
		}
		states = append(states, containerState{Container: name, State: it.Status.State, Reason: it.Status.Reason, Message: it.Status.Message})
	}
	gen := pod.Generation
	if in.noGeneration.Load() {
		gen = 0
	}
	pending, progress := desiredConditions(states, gen)
	_, annotated := pod.Annotations[AnnotationResources]
	owned := in.opts.Mode.spec() || annotated || ps.wrote
	patch := conditionPatch(pod, map[corev1.PodConditionType]*corev1.PodCondition{
		corev1.PodResizePending: pending, corev1.PodResizeInProgress: progress,
	}, in.opts.Now(), owned)
	if patch == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got, err := in.client.CoreV1().Pods(pod.Namespace).Patch(pctx, pod.Name, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager}, "status")
	switch {
	case err == nil:
		if pending != nil || progress != nil {
			ps.wrote = true
		}
		for _, w := range []*corev1.PodCondition{pending, progress} {
			if w == nil || gen == 0 || got == nil {
				continue
			}
			if c := findCondition(got, w.Type); c != nil && c.ObservedGeneration == 0 && !in.noGeneration.Swap(true) {
				in.log.Info("the API server does not keep the conditions' observedGeneration; not sending it")
			}
		}
		in.log.Debug("pod resize conditions patched", "pod", ps.key, "patch", string(patch))
		return nil
	case apierrors.IsNotFound(err):
		return nil // deleted meanwhile; the informer says so next
	}
	return fmt.Errorf("patching the resize conditions of pod %s: %w", ps.key, err)
}

// watchAgent follows the agent's intents: it records an Event on the pod
// for every step of an intent the intake submitted and has the pod's
// conditions brought up to date. If the stream ends (the watcher fell
// behind) it watches again and looks at every pod it tracks.
func (in *Intake) watchAgent(ctx context.Context, ch <-chan agent.Event) {
	for {
		for e := range ch {
			in.onIntent(e.Intent)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		ch = in.agent.Watch(ctx, agent.Filter{})
		in.enqueueTracked()
	}
}

func (in *Intake) enqueueTracked() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for key := range in.byKey {
		in.queue.Add(key)
	}
}

func (in *Intake) onIntent(it intent.Intent) {
	if it.Origin == intent.OriginDrift {
		in.onDrift(it)
		return
	}
	if it.Origin != intent.OriginKubernetes || it.Spec.Target.PodUID == "" {
		return
	}
	st := it.Status.State
	if st.Terminal() {
		defer delete(in.emitted, it.ID)
	}
	objs, _ := in.informer.GetIndexer().ByIndex(uidIndex, it.Spec.Target.PodUID)
	if len(objs) == 0 {
		return
	}
	pod := objs[0].(*corev1.Pod)
	if in.emitted[it.ID] != st {
		in.emitted[it.ID] = st
		name, msg := it.Spec.Target.Name, it.Status.Message
		fp := fieldPathOf(pod, name)
		switch {
		case st == intent.InProgress:
			in.event(pod, fp, corev1.EventTypeNormal, EventResizeStarted, name, "resizing to "+describe(it.Spec.Resources))
		case st == intent.Completed && it.Status.Reason != intent.ReasonNoChange:
			in.event(pod, fp, corev1.EventTypeNormal, EventResizeCompleted, name, msg)
		case st == intent.Deferred:
			in.event(pod, fp, corev1.EventTypeWarning, EventResizeDeferred, name, msg)
		case st == intent.Infeasible:
			in.event(pod, fp, corev1.EventTypeWarning, EventResizeInfeasible, name, msg)
		case st == intent.Failed:
			in.event(pod, fp, corev1.EventTypeWarning, EventResizeError, name, msg)
		}
	}
	key, err := cache.MetaNamespaceKeyFunc(pod)
	if err == nil {
		in.queue.Add(key)
	}
}

// onDrift records a Warning Event on the pod when the agent has restored or
// adopted a container's drifted cgroup values, or failed to restore them.
func (in *Intake) onDrift(it intent.Intent) {
	if !it.Status.State.Terminal() || it.Spec.Target.PodUID == "" {
		return
	}
	objs, _ := in.informer.GetIndexer().ByIndex(uidIndex, it.Spec.Target.PodUID)
	if len(objs) == 0 {
		return
	}
	pod := objs[0].(*corev1.Pod)
	name := it.Spec.Target.Name
	msg := "cgroup values changed behind the agent's back were restored: " + it.Status.Message
	switch {
	case it.Status.Reason == agent.ReasonDriftAdopted:
		msg = it.Status.Message
	case it.Status.State != intent.Completed:
		msg = "restoring cgroup values changed behind the agent's back failed: " + it.Status.Message
	}
	in.event(pod, fieldPathOf(pod, name), corev1.EventTypeWarning, EventCgroupDrift, name, msg)
}

// event records an Event about the pod (about the container when fieldPath
// is set); its note is the agent's message, naming the container.
func (in *Intake) event(pod *corev1.Pod, fieldPath, eventtype, reason, ctr, msg string) {
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, FieldPath: fieldPath}
	note := msg
	if ctr != "" {
		note = "container " + ctr + ": " + msg
	}
	in.recorder.Event(ref, eventtype, reason, truncate(note, 1024))
}
