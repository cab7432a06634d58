package kube

import (
	"context"
	"encoding/json"
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
	// Follow and Report hold the intents whose resize the kubelet carries
	// out (agent/companion.go); Verify reads a container's cgroup files.
	Follow(intent.Origin, intent.Spec) (intent.Intent, bool, error)
	Report(id string, s intent.State, reason, msg string) (intent.Intent, error)
	Verify(ctx context.Context, podUID, name string, want intent.Resources) (bool, string, error)
	Get(id string) (intent.Intent, error)
	Watch(ctx context.Context, f agent.Filter) <-chan agent.Event
	List(f agent.Filter, state intent.State) []intent.Intent
}

var _ Agent = (*agent.Agent)(nil)

// FieldManager names the agent in the API server's records of who wrote
// what, and ReportingController in its Events.
const (
	FieldManager        = "resize-agent"
	ReportingController = "resize-agent"
)

// Event reasons, the agent's own: the kubelet's (ResizeStarted,
// ResizeCompleted, ResizeDeferred, ResizeInfeasible, ResizeError; kubelet
// pkg/kubelet/events/event.go) are the kubelet's to record, and
// deploy/base/nodescope.yaml refuses them from the agent.
const (
	// EventResizeRequested: the agent patched pods/resize for the
	// annotation.
	EventResizeRequested = "ResizeRequested"
	// EventResizeRefused: the annotation was refused, or the API server
	// refused the patch.
	EventResizeRefused = "ResizeRefused"
	// EventResizeVerified: the kubelet actuated the resize and the agent
	// read it back from the cgroup files.
	EventResizeVerified = "ResizeVerified"
	// EventResizeNotVerified: the kubelet reports the resources, the cgroup
	// files hold something else.
	EventResizeNotVerified = "ResizeNotVerified"
	// EventCgroupDrift is the agent's own: a container's cgroup values were
	// changed behind its back and it restored or adopted them (drift.go).
	EventCgroupDrift = "CgroupDrift"
)

// Options configure an Intake.
type Options struct {
	// NodeName is this node: only pods bound to it are watched.
	NodeName string
	// Predictor, when set, foresees the kubelet's verdict before each
	// patch (predict.go).
	Predictor Predictor
	// PolicyCheck is how often the annotation policy is looked up again
	// (default 1m).
	PolicyCheck time.Duration
	// VerifyRetry is how soon a resize the kubelet reports done but the
	// cgroup files do not show yet is checked again (default 2s).
	VerifyRetry time.Duration
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

// Intake watches the pods bound to this node, turns their annotations into
// pods/resize patches and follows the kubelet's verdicts in the agent's
// intents.
type Intake struct {
	client   kubernetes.Interface
	agent    Agent
	opts     Options
	log      *slog.Logger
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	policy   guard
	ready    chan struct{} // closed once the intake follows the agent's intents

	mu    sync.Mutex
	pods  map[types.UID]*podState
	byKey map[string]types.UID

	// emitted is the last state an Event was recorded for, per intent;
	// only the agent watcher touches it.
	emitted map[string]string

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
	// wrote is set once the intake has set its condition on the pod: it
	// then keeps it up to date, and removes it when there is nothing more
	// to say.
	wrote bool
}

type ctrState struct {
	fieldPath string
	// id is the intent last followed for the container, hash its spec's,
	// want its resources.
	id, hash string
	want     corev1.ResourceRequirements
	// wanted is the hash of what the pod asks for now ("" if nothing).
	wanted string
	// patched is the hash last patched into pods/resize (or refused by the
	// API server), gen the pod's generation the patch produced.
	patched string
	gen     int64
	// refusedMsg is the API server's refusal of the patch of hash patched.
	refusedMsg string
	// predicted is the Predictor's verdict before the patch, as said in the
	// intent's message ("" without a Predictor).
	predicted string
}

const uidIndex = "uid"

// New returns an Intake for the pods of opts.NodeName; Run starts it.
func New(client kubernetes.Interface, a Agent, opts Options) (*Intake, error) {
	if opts.NodeName == "" {
		return nil, errors.New("kube: the node name is required")
	}
	if opts.PolicyCheck == 0 {
		opts.PolicyCheck = time.Minute
	}
	if opts.VerifyRetry == 0 {
		opts.VerifyRetry = 2 * time.Second
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
		pods: map[types.UID]*podState{}, byKey: map[string]types.UID{}, emitted: map[string]string{},
		recorder: opts.Recorder,
	}
	in.policy.why = "not checked yet"
	in.ready = make(chan struct{})
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

// Ready is closed once the pods have been listed and the intake follows
// the agent's intents.
func (in *Intake) Ready() <-chan struct{} { return in.ready }

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
	in.log.Info("kubernetes intake starting", "node", in.opts.NodeName)
	in.checkPolicy(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), in.informer.HasSynced) {
		return nil
	}
	in.log.Info("kubernetes intake synced", "pods", len(in.informer.GetIndexer().ListKeys()))
	var wg sync.WaitGroup
	wg.Add(1)
	// Subscribed before any worker submits: an intent that ran its course
	// before the watcher goroutine got going had no Events.
	ch := in.agent.Watch(ctx, agent.Filter{})
	close(in.ready)
	go func() { defer wg.Done(); in.watchAgent(ctx, ch) }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		wait.UntilWithContext(ctx, func(ctx context.Context) {
			if in.checkPolicy(ctx) {
				in.enqueueAll()
			}
		}, in.opts.PolicyCheck)
	}()
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

// checkPolicy looks the annotation policy up and logs when its state
// changes; it reports whether it changed.
func (in *Intake) checkPolicy(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	why := checkAnnotationPolicy(cctx, in.client)
	if ctx.Err() != nil {
		return false
	}
	if !in.policy.set(why) {
		return false
	}
	if why == "" {
		in.log.Info("annotation policy in force: acting on annotations", "policy", AnnotationPolicy)
	} else {
		in.log.Warn("annotation policy not in force: no annotation is acted on", "policy", AnnotationPolicy, "why", why)
	}
	return true
}

func (in *Intake) enqueueAll() {
	for _, key := range in.informer.GetIndexer().ListKeys() {
		in.queue.Add(key)
	}
}

// sync makes the pod's resources follow its annotation through pods/resize
// and the agent's intents follow the kubelet's verdict.
func (in *Intake) sync(ctx context.Context, key string) error {
	obj, exists, err := in.informer.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		in.podGone(key, "the pod was deleted")
		return nil
	}
	pod := obj.(*corev1.Pod)
	if pod.Spec.NodeName != in.opts.NodeName || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		in.podGone(key, "the pod's containers have ended")
		return nil
	}
	ps := in.state(key, pod.UID)
	var errs []error
	for _, cs := range ps.containers {
		cs.wanted = ""
	}
	if _, annotated := pod.Annotations[AnnotationResources]; annotated && pod.DeletionTimestamp == nil {
		if ok, why := in.policy.get(); !ok {
			in.setRefusals(pod, ps, []Refusal{{Message: "annotation " + AnnotationResources + " ignored: " + why}})
		} else {
			desired, refusals := DesiredFor(pod)
			in.setRefusals(pod, ps, refusals)
			var todo []Desired
			for _, d := range desired {
				need, err := in.follow(pod, ps, d)
				if err != nil {
					errs = append(errs, err)
				}
				if need {
					todo = append(todo, d)
				}
			}
			if len(todo) > 0 {
				if err := in.patch(ctx, pod, ps, todo); err != nil {
					errs = append(errs, err)
				}
			}
		}
	} else {
		in.setRefusals(pod, ps, nil)
	}
	retry := in.followVerdicts(ctx, pod, ps)
	if err := in.syncStatus(ctx, pod, ps); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 && retry {
		in.queue.AddAfter(key, in.opts.VerifyRetry)
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
		in.podGone(key, "the pod was replaced by another of the same name")
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
// ended; its unfinished intents fail with why.
func (in *Intake) podGone(key, why string) {
	in.mu.Lock()
	uid, ok := in.byKey[key]
	ps := in.pods[uid]
	delete(in.byKey, key)
	delete(in.pods, uid)
	in.mu.Unlock()
	if !ok || ps == nil {
		return
	}
	for _, cs := range ps.containers {
		if cs.id == "" {
			continue
		}
		if it, err := in.agent.Get(cs.id); err == nil && !it.Status.State.Terminal() {
			_, _ = in.agent.Report(cs.id, intent.Failed, intent.ReasonContainerGone, why)
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
		in.event(pod, fieldPathOf(pod, c), corev1.EventTypeWarning, EventResizeRefused, printable(c), now[c])
	}
	// One line per pod and interval, cut short: what is refused is on the
	// pod (Events, the agent's condition) for whoever wants all of it.
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

// follow has the agent hold the intent for one container's desired
// resources, and reports whether they still need patching.
func (in *Intake) follow(pod *corev1.Pod, ps *podState, d Desired) (bool, error) {
	cs := ps.containers[d.Container]
	if cs == nil {
		cs = &ctrState{}
		ps.containers[d.Container] = cs
	}
	cs.fieldPath, cs.wanted = d.FieldPath, d.Hash
	if cs.hash == d.Hash && cs.id != "" {
		if _, err := in.agent.Get(cs.id); err == nil {
			return cs.patched != d.Hash, nil
		}
	}
	if cs.id == "" {
		// First sight since the intake started: the agent may hold this
		// container's intents from before (the intake alone restarted).
		cs.id = in.latestID(pod.UID, d.Container)
	}
	spec := d.Spec
	spec.ID = in.pickID(cs, d)
	prev := cs.id
	_, created, err := in.agent.Follow(intent.OriginKubernetes, spec)
	if err != nil {
		if errors.Is(err, agent.ErrShuttingDown) {
			return false, nil
		}
		ps.refusals[d.Container] = err.Error()
		return false, fmt.Errorf("following the resize of container %s: %w", d.Container, err)
	}
	if prev != "" && prev != spec.ID {
		if it, err := in.agent.Get(prev); err == nil && !it.Status.State.Terminal() {
			_, _ = in.agent.Report(prev, intent.Superseded, intent.ReasonSuperseded, "superseded by intent "+spec.ID+": the annotation asks for other resources")
		}
	}
	cs.id, cs.hash, cs.want = spec.ID, d.Hash, d.Spec.Resources
	if created {
		in.log.Info("resize requested", "pod", ps.key, "container", d.Container, "intent", spec.ID, "resources", describe(spec.Resources))
	}
	return cs.patched != d.Hash, nil
}

// resizePatch is the strategic merge patch of pods/resize that sets what
// the annotation's entries name, and nothing else; metadata.uid is a
// precondition, as in conditionPatch.
func resizePatch(uid types.UID, ds []Desired) []byte {
	type entry struct {
		Name         string                         `json:"name"`
		Resources    map[string]corev1.ResourceList `json:"resources"`
		ResizePolicy []corev1.ContainerResizePolicy `json:"resizePolicy,omitempty"`
	}
	var ctrs, inits []entry
	for _, d := range ds {
		e := entry{Name: d.Container, Resources: map[string]corev1.ResourceList{}, ResizePolicy: d.Request.ResizePolicy}
		if len(d.Request.Requests) > 0 {
			e.Resources["requests"] = d.Request.Requests
		}
		if len(d.Request.Limits) > 0 {
			e.Resources["limits"] = d.Request.Limits
		}
		if d.Init {
			inits = append(inits, e)
		} else {
			ctrs = append(ctrs, e)
		}
	}
	spec := map[string]any{}
	if len(ctrs) > 0 {
		spec["containers"] = ctrs
	}
	if len(inits) > 0 {
		spec["initContainers"] = inits
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid}, "spec": spec})
	if err != nil {
		panic(err) // plain maps and API types always marshal
	}
	return b
}

// patch asks the API server for the resize, through pods/resize with the
// agent's credentials: RBAC, ResourceQuota, LimitRange and
// PodResizeValidator apply, and the kubelet admits and actuates it. A
// refusal is final for these resources and said in the intents.
func (in *Intake) patch(ctx context.Context, pod *corev1.Pod, ps *podState, ds []Desired) error {
	predicted := ""
	if in.opts.Predictor != nil {
		want := pod.DeepCopy()
		for _, d := range ds {
			if c := findContainer(want, d.Container); c != nil {
				c.Resources = withRequest(c.Resources, d.Request)
			}
		}
		if p := in.opts.Predictor.Predict(want); p != nil {
			predicted = fmt.Sprintf("; predicted: %s", p.Verdict)
			if p.Message != "" {
				predicted += " (" + p.Message + ")"
			}
		}
	}
	body := resizePatch(pod.UID, ds)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got, err := in.client.CoreV1().Pods(pod.Namespace).Patch(pctx, pod.Name, types.StrategicMergePatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager}, "resize")
	var refused string
	switch {
	case err == nil:
	case apierrors.IsNotFound(err):
		return nil // deleted meanwhile; the informer says so next
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsConflict(err) && strings.Contains(err.Error(), "Precondition failed"):
		refused = err.Error()
	default:
		return fmt.Errorf("patching pods/resize of %s: %w", ps.key, err)
	}
	for _, d := range ds {
		cs := ps.containers[d.Container]
		cs.patched, cs.refusedMsg = d.Hash, refused
		if refused != "" {
			in.log.Warn("pods/resize patch refused", "pod", ps.key, "container", d.Container, "intent", cs.id, "err", refused)
			_, _ = in.agent.Report(cs.id, intent.Failed, ReasonPatchRefused, "the API server refused the pods/resize patch: "+refused)
			in.event(pod, d.FieldPath, corev1.EventTypeWarning, EventResizeRefused, d.Container, "the API server refused the pods/resize patch: "+refused)
			continue
		}
		cs.gen, cs.predicted = got.Generation, predicted
		msg := fmt.Sprintf("pods/resize patched (generation %d); waiting for the kubelet%s", got.Generation, predicted)
		_, _ = in.agent.Report(cs.id, intent.Proposed, ReasonPatched, msg)
		in.event(pod, d.FieldPath, corev1.EventTypeNormal, EventResizeRequested, d.Container, "pods/resize patched: "+describe(d.Spec.Resources)+predicted)
	}
	return nil
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, l := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}

// withRequest is rr with what the annotation's entry names set, as the
// strategic merge patch sets it.
func withRequest(rr corev1.ResourceRequirements, e ContainerResize) corev1.ResourceRequirements {
	out := *rr.DeepCopy()
	for res, q := range e.Requests {
		if out.Requests == nil {
			out.Requests = corev1.ResourceList{}
		}
		out.Requests[res] = q
	}
	for res, q := range e.Limits {
		if out.Limits == nil {
			out.Limits = corev1.ResourceList{}
		}
		out.Limits[res] = q
	}
	return out
}

// followVerdicts reports the kubelet's verdict on each patched container
// in its intent. It returns true when a container is to be looked at again
// soon: the kubelet reports it done but the cgroup files do not show it
// yet.
func (in *Intake) followVerdicts(ctx context.Context, pod *corev1.Pod, ps *podState) (retry bool) {
	for name, cs := range ps.containers {
		if cs.id == "" || cs.patched == "" || cs.patched != cs.hash || cs.refusedMsg != "" {
			continue
		}
		it, err := in.agent.Get(cs.id)
		if err != nil || it.Status.State == intent.Superseded || it.Status.State == intent.Completed {
			// Done with: a later change of the pod is another resize (or
			// drift, which is not the intake's to judge).
			continue
		}
		if spec, ok := specOf(pod, name); !ok || toResources(spec) != toResources(cs.want) {
			if cs.gen > 0 && pod.Generation >= cs.gen {
				_, _ = in.agent.Report(cs.id, intent.Superseded, ReasonSpecChanged, "the pod's spec no longer asks for these resources: "+describe(spec))
			}
			continue
		}
		v := kubeletVerdict(pod, name, cs.want, cs.gen)
		if v.Actuated {
			vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ok, held, err := in.agent.Verify(vctx, string(pod.UID), name, toResources(cs.want))
			cancel()
			switch {
			case err != nil:
				v = verdict{State: intent.InProgress, Reason: ReasonNotVerified, Message: "the kubelet reports the resources; reading the cgroup files failed: " + err.Error()}
				retry = true
			case !ok:
				v = verdict{State: intent.InProgress, Reason: ReasonNotVerified, Message: "the kubelet reports " + describe(cs.want) + ", but " + held}
				retry = true
			default:
				v = verdict{State: intent.Completed, Reason: ReasonVerified, Message: "actuated by the kubelet and verified: " + held}
			}
		}
		if v.State != intent.Completed {
			v.Message += cs.predicted
		}
		if it.Status.State != v.State || it.Status.Reason != v.Reason || it.Status.Message != v.Message {
			_, _ = in.agent.Report(cs.id, v.State, v.Reason, v.Message)
		}
	}
	return retry
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

// latestID is the newest intent the intake followed for the container
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

// syncStatus sets the agent's own condition on the pod from its
// containers' intents. The kubelet's conditions are never written.
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
	want := desiredCondition(states, gen)
	_, annotated := pod.Annotations[AnnotationResources]
	owned := annotated || ps.wrote
	patch := conditionPatch(pod, map[corev1.PodConditionType]*corev1.PodCondition{ConditionType: want}, in.opts.Now(), owned)
	if patch == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got, err := in.client.CoreV1().Pods(pod.Namespace).Patch(pctx, pod.Name, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager}, "status")
	switch {
	case err == nil:
		if want != nil {
			ps.wrote = true
			if c := findCondition(got, ConditionType); gen != 0 && got != nil && c != nil && c.ObservedGeneration == 0 && !in.noGeneration.Swap(true) {
				in.log.Info("the API server does not keep the conditions' observedGeneration; not sending it")
			}
		}
		in.log.Debug("pod condition patched", "pod", ps.key, "patch", string(patch))
		return nil
	case apierrors.IsNotFound(err):
		return nil // deleted meanwhile; the informer says so next
	}
	return fmt.Errorf("patching the condition %s of pod %s: %w", ConditionType, ps.key, err)
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
	objs, _ := in.informer.GetIndexer().ByIndex(uidIndex, it.Spec.Target.PodUID)
	if len(objs) == 0 {
		if st.Terminal() {
			delete(in.emitted, it.ID)
		}
		return
	}
	pod := objs[0].(*corev1.Pod)
	// Only what the agent alone knows gets an Event; the kubelet records
	// its own for Deferred, Infeasible, started, completed and errors.
	mark := string(st) + "/" + it.Status.Reason
	if in.emitted[it.ID] != mark {
		in.emitted[it.ID] = mark
		name, fp := it.Spec.Target.Name, fieldPathOf(pod, it.Spec.Target.Name)
		switch {
		case st == intent.Completed && it.Status.Reason == ReasonVerified:
			in.event(pod, fp, corev1.EventTypeNormal, EventResizeVerified, name, it.Status.Message)
		case it.Status.Reason == ReasonNotVerified:
			in.event(pod, fp, corev1.EventTypeWarning, EventResizeNotVerified, name, it.Status.Message)
		}
	}
	if st.Terminal() && st != intent.Failed && st != intent.Infeasible {
		delete(in.emitted, it.ID)
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
