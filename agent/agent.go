package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// Cgroups is what the agent needs of the cgroup filesystem.
type Cgroups interface {
	Read(path string) (cgroup.State, error)
	Write(path string, r cgroup.Resources) error
	Exists(path string) (bool, error)
	PathOf(pid int) (string, error)
	PageSize() int64
}

// Runtime is what the agent needs of the container runtime; *cri.Client
// implements it. Version is how the agent asks whether the runtime answers
// (liveness.go).
type Runtime interface {
	Version(ctx context.Context) (string, error)
	Find(ctx context.Context, podUID, name string) (cri.Container, error)
	Get(ctx context.Context, id string) (cri.Container, error)
	Update(ctx context.Context, id string, r cri.Resources) error
	Restart(ctx context.Context, id string, r cri.Resources, stopTimeout time.Duration) (cri.Container, error)
}

// Option configures an Agent.
type Option func(*Agent)

// WithTargetScope confines the targets of submitted intents: check returns
// an error for a cgroup path they may not have (see intent.Scope).
func WithTargetScope(check func(field, cgroup string) error) Option {
	return func(a *Agent) { a.scope = check }
}

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }

// WithMetrics makes the agent record its metrics in m.
func WithMetrics(m *metrics.Metrics) Option { return func(a *Agent) { a.metrics = m } }

// WithCPUPeriod sets the cpu.max period in microseconds (default 100000).
func WithCPUPeriod(p uint64) Option { return func(a *Agent) { a.period = p } }

// WithMemoryThrottlingFactor is the kubelet's memoryThrottlingFactor: the
// memory.high a runtime update sends for a container whose runtime record
// holds the kubelet's (actuate.KubeletMemoryHigh); 0 keeps the default.
func WithMemoryThrottlingFactor(f float64) Option { return func(a *Agent) { a.throttling = f } }

// WithRuntime lets the agent resize containers of a runtime (targets by
// pod UID and name, or container ID) through it.
func WithRuntime(rt Runtime) Option { return func(a *Agent) { a.rt = rt } }

// WithPressure makes the container listing show the latest pressure from
// these sources, first source first.
func WithPressure(src ...pressure.Source) Option { return func(a *Agent) { a.pressure = src } }

// WithHistory sets how many terminal intents are kept for get and list.
func WithHistory(n int) Option { return func(a *Agent) { a.history = n } }

// WithExitWatcher makes the agent learn from w the moment a managed
// container's cgroup empties, and free what it held at once (see exits.go).
// *cgroup.Watcher implements it; call Run to handle its events.
func WithExitWatcher(w ExitWatcher) Option { return func(a *Agent) { a.exits.w = w } }

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(a *Agent) { a.now = now } }

// DefaultShrinkTimeout bounds how long a shrink waits for usage to come down.
const DefaultShrinkTimeout = actuate.DefaultShrinkTimeout

// WithShrinkTimeout sets how long a memory decrease below usage may spend
// bringing usage down before it fails and restores memory.high (default
// DefaultShrinkTimeout). d < 0 turns the procedure off: such a decrease is
// refused as it is on kernels without memory.reclaim.
func WithShrinkTimeout(d time.Duration) Option { return func(a *Agent) { a.shrinkTimeout = d } }

// Agent is safe for concurrent use.
type Agent struct {
	cg       Cgroups
	scope    func(field, cgroup string) error // nil: any cgroup
	rt       Runtime                          // gate, when there is a runtime
	gate     *runtimeGate                     // liveness.go
	pressure []pressure.Source
	exits    exitWatch // exits.go
	drift    drifts    // drift.go
	journal  Journal   // recover.go; nil: intents are not durable
	ledger   *admission.Ledger
	log      *slog.Logger
	metrics  *metrics.Metrics
	period   uint64
	// throttling is the kubelet's memoryThrottlingFactor (WithMemoryThrottlingFactor).
	throttling float64
	history    int
	now        func() time.Time

	// shrinkTimeout is set by WithShrinkTimeout; 0 means DefaultShrinkTimeout.
	shrinkTimeout time.Duration

	// kubeletOwnsPods is set by WithKubeletOwnsPods (companion.go).
	kubeletOwnsPods bool

	// act carries out admitted resizes (package actuate); ctx ends when
	// Close begins, which stops a reclaim in progress.
	act  *actuate.Actuator
	ctx  context.Context
	stop context.CancelCauseFunc

	hub     *hub
	workers sync.WaitGroup

	mu         sync.Mutex
	seq        uint64
	closing    bool
	hist       history            // the intents, in the order accepted (history.go)
	accepting  map[string]*record // being journaled, not yet acknowledged
	containers containers
	pods       pods // the pods of the managed containers (containers.go)
	// deferred holds the containers whose pending intent was Deferred (and
	// maybe some no longer), so that freeing capacity does not scan every
	// container (deferred.go).
	deferred map[*container]struct{}
	resyncs  uint64 // Resync calls, for fullResync
	specs    specs  // history.go
}

// record is an intent with what the agent derived from its spec.
type record struct {
	intent.Intent
	change intent.Change
	seq    uint64
	retry  bool // a Deferred intent to try again
	// key is the container's; ticket is the journaling of its acceptance;
	// recovered marks an intent queued again by Recover (recover.go).
	key       string
	shared    *sharedResources // keeps Spec.Resources' shared copy in the table (history.go)
	ticket    journal.Ticket
	recovered bool
	// deferredAt is when the intent was first Deferred, which orders the
	// retries like the PodResizePending condition's transition time.
	deferredAt time.Time
	started    time.Time // when admitted, for the admission phase
	// restarting is the runtime container this intent began to restart
	// (journaled before the restart; see markRestarting).
	restarting string
	// followed marks an intent the kubelet carries out (companion.go).
	followed bool
}

// New returns an Agent that writes through cg and admits against ledger.
func New(cg Cgroups, ledger *admission.Ledger, opts ...Option) *Agent {
	a := &Agent{
		cg: cg, ledger: ledger, log: slog.Default(), period: cgroup.DefaultPeriod, history: 10000,
		now: time.Now, hub: newHub(), hist: history{intents: map[string]*record{}}, containers: containers{},
		pods: pods{}, accepting: map[string]*record{}, deferred: map[*container]struct{}{},
	}
	for _, o := range opts {
		o(a)
	}
	a.ctx, a.stop = context.WithCancelCause(context.Background())
	a.act = &actuate.Actuator{Cgroups: cg, Period: a.period, ShrinkTimeout: a.shrinkTimeout, Metrics: a.metrics, MemoryThrottlingFactor: a.throttling}
	if a.rt != nil {
		a.gate = newRuntimeGate(a.rt)
		a.rt = a.gate
		a.act.Runtime = a.gate
	}
	a.drift.log, a.drift.metrics, a.exits.log = a.log, a.metrics, a.log
	return a
}

// Submit validates and accepts an intent from the API (SubmitFrom with
// intent.OriginAPI).
func (a *Agent) Submit(spec intent.Spec) (intent.Intent, bool, error) {
	return a.SubmitFrom(intent.OriginAPI, spec)
}

// SubmitFrom validates and accepts an intent that origin asks for. It
// returns the intent as accepted, and created=false when the same ID and
// spec were accepted before (an idempotent retry). With a journal, the
// intent is on disk before SubmitFrom returns. Errors match
// intent.ErrInvalid, ErrNotFound, ErrConflict, ErrShuttingDown or
// ErrJournal.
func (a *Agent) SubmitFrom(origin intent.Origin, spec intent.Spec) (intent.Intent, bool, error) {
	spec, change, err := intent.Validate(spec)
	if err != nil {
		return intent.Intent{}, false, err
	}
	// The stored spec must not share maps with the caller's.
	var shared *sharedResources
	spec.Resources, shared = a.specs.intern(spec.Resources)
	spec.ResizePolicy = slices.Clone(spec.ResizePolicy)
	res, err := a.resolve(spec.Target)
	if err != nil {
		return intent.Intent{}, false, err
	}
	if a.kubeletOwnsPods && origin == intent.OriginAPI {
		if what, ok := kubeletPod(res); ok {
			return intent.Intent{}, false, fmt.Errorf("%w (%s): change it with kubectl patch --subresource resize, or the %s annotation, so that the API server authorizes it and the kubelet admits it", ErrKubeletOwned, what, "resize.resizer.io/resources")
		}
	}
	if a.scope != nil {
		// Where the container is, as resolved: a runtime's container too.
		for field, p := range map[string]string{"target cgroup": res.cgroup, "target.podCgroupPath": spec.Target.PodCgroupPath, "pod cgroup": res.pod} {
			if p == "" {
				continue
			}
			if err := a.scope(field, p); err != nil {
				return intent.Intent{}, false, err
			}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return intent.Intent{}, false, ErrShuttingDown
	}
	if spec.ID != "" {
		if old, ok := a.hist.intents[spec.ID]; ok {
			if !sameSpec(old.Spec, spec) {
				return intent.Intent{}, false, fmt.Errorf("%w: intent %s was accepted with another spec", ErrConflict, spec.ID)
			}
			return old.Intent, false, nil
		}
		if old, ok := a.accepting[spec.ID]; ok {
			if !sameSpec(old.Spec, spec) {
				return intent.Intent{}, false, fmt.Errorf("%w: intent %s was accepted with another spec", ErrConflict, spec.ID)
			}
			return a.awaitAcceptLocked(old)
		}
	}
	c, err := a.containerLocked(spec.Target, res)
	if err != nil {
		return intent.Intent{}, false, err
	}
	if _, err := a.admissibleLocked(c, spec, change); err != nil {
		return intent.Intent{}, false, err
	}

	now := a.now()
	a.seq++
	r := &record{Intent: intent.Intent{ID: spec.ID, Origin: origin, Spec: spec, Status: intent.Status{
		State: intent.Proposed, AcceptedAt: now, UpdatedAt: now,
	}}, change: change, seq: a.seq, shared: shared}
	if r.ID == "" {
		r.ID = newID()
		r.Spec.ID = r.ID
	}
	r.key = c.key
	if a.journal != nil {
		if err := a.journalAcceptLocked(c, r); err != nil {
			return intent.Intent{}, false, err
		}
	}
	a.acceptLocked(c, r)
	return r.Intent, true, nil
}

func sameSpec(a, b intent.Spec) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func newID() string { return intent.NewID() }

// resolved is where a target is: its key, cgroup and runtime container.
type resolved struct {
	key, cgroup string
	pod         string // the kubelet's pod cgroup of a runtime container, if any
	ctr         *cri.Container
	listed      []cri.Container // the running containers of ctr's pod, by the runtime
	marks       map[string]pressure.WriteMark
	markedAt    time.Time // marks: the pod cgroup's children's, taken before listed (podListing)
	known       bool      // from the agent's own record (known), not the runtime
}

// resolve finds a target, asking the runtime for a runtime's container. It
// runs without the lock: the runtime may be slow.
func (a *Agent) resolve(t intent.Target) (resolved, error) {
	if !t.Runtime() {
		return resolved{key: Key{Cgroup: t.CgroupPath}.String(), cgroup: t.CgroupPath}, nil
	}
	if a.rt == nil {
		return resolved{}, fmt.Errorf("%w: the target names a runtime container, but this agent has no container runtime (set --cri-endpoint)", intent.ErrInvalid)
	}
	if out, ok := a.known(t); ok {
		// Not asked for the container, but asked whether it answers: an
		// intent accepted while it hangs would be sent once it resumes.
		if err := a.gate.live(); err != nil {
			return resolved{}, fmt.Errorf("%w: %w", ErrRuntime, err)
		}
		return out, nil
	}
	// A runtime that did not answer last time is asked briefly first,
	// rather than waited for as long as a lookup may take.
	if err := a.gate.unlessDown(); err != nil {
		return resolved{}, fmt.Errorf("%w: %w", ErrRuntime, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var ct cri.Container
	var err error
	if t.PodUID != "" {
		ct, err = a.rt.Find(ctx, t.PodUID, t.Name)
	} else {
		ct, err = a.rt.Get(ctx, t.ContainerID)
	}
	switch {
	case errors.Is(err, cri.ErrNotFound):
		return resolved{}, fmt.Errorf("%w: %w", ErrNotFound, err)
	case err != nil:
		return resolved{}, fmt.Errorf("%w: %w", ErrRuntime, err)
	case !ct.Running():
		return resolved{}, fmt.Errorf("%w: container %s is %s, not running", ErrNotFound, ct.ID, ct.State)
	}
	p, err := a.cg.PathOf(ct.PID)
	if err != nil {
		return resolved{}, fmt.Errorf("%w: cgroup of container %s (pid %d): %w", ErrNotFound, ct.ID, ct.PID, err)
	}
	key := Key{ContainerID: ct.ID}
	if ct.PodUID != "" {
		key = Key{PodUID: ct.PodUID, Name: ct.Name}
	}
	out := resolved{key: key.String(), cgroup: p, pod: podCgroupOf(p, ct.PodUID), ctr: &ct}
	if ct.PodUID != "" {
		// For the pod's QoS class, which the containers the agent does
		// not manage count in too.
		if out.pod != "" {
			out.markedAt, out.marks = a.now(), a.podMarks(out.pod)
		}
		out.listed = podContainers(ctx, a.act, a.log, ct.PodUID)
	}
	return out, nil
}

// known resolves a runtime target the agent manages already from what the
// runtime reported when the agent last asked, without asking again: the
// kubelet, too, resizes a container it knows from its own pod cache
// rather than looking it up per resize (pkg/kubelet/kuberuntime,
// computePodResizeAction works from the cached podStatus). The record is
// dropped when it may be stale: the container exited or was restarted
// (exits.go), or a resize failed (apply), which also looks the container
// up again and retries when it was replaced behind the agent's back.
func (a *Agent) known(t intent.Target) (resolved, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var c *container
	switch {
	case t.PodUID != "":
		c = a.containers[Key{PodUID: t.PodUID, Name: t.Name}.String()]
	case t.ContainerID != "":
		if c = a.containers[Key{ContainerID: t.ContainerID}.String()]; c == nil {
			for _, o := range a.containers {
				if o.runtimeID == t.ContainerID {
					c = o
					break
				}
			}
		}
	}
	if c == nil || c.ctr == nil || c.ctr.ID != c.runtimeID || c.exited != "" {
		return resolved{}, false
	}
	ct := *c.ctr
	return resolved{key: c.key, cgroup: c.cgroup, pod: podCgroupOf(c.cgroup, ct.PodUID), ctr: &ct, known: true}, true
}

// containerLocked finds or, on first sight, registers the target. A new
// container's limits are inferred from its cgroup; it holds nothing on the
// ledger until an intent declares its requests.
func (a *Agent) containerLocked(t intent.Target, res resolved) (*container, error) {
	if t.PodCgroupPath == "" && res.pod != "" {
		// The kubelet's pod cgroup, kept in step unless it cannot be read
		// (read once: a container known with it keeps it).
		if c, ok := a.containers[res.key]; ok && c.podPath() == res.pod {
			t.PodCgroupPath = res.pod
		} else if _, err := a.cg.Read(res.pod); err == nil {
			t.PodCgroupPath = res.pod
		}
	}
	if c, ok := a.containers[res.key]; ok {
		if c.name != t.Name && !t.Runtime() {
			return nil, fmt.Errorf("%w: cgroup %s is managed as container %q, not %q", ErrConflict, res.cgroup, c.name, t.Name)
		}
		if c.podPath() != t.PodCgroupPath {
			return nil, fmt.Errorf("%w: container %q is managed with pod cgroup %q, not %q", ErrConflict, c.name, c.podPath(), t.PodCgroupPath)
		}
		if res.ctr != nil && c.runtimeID != res.ctr.ID && !c.running {
			// Restarted behind the agent's back: follow the new one.
			old := c.cgroup
			c.runtimeID, c.cgroup = res.ctr.ID, res.cgroup
			a.exits.follow(c, old)
			c.pod.staleListing()
		}
		a.learnRuntimeLocked(c, res)
		return c, nil
	}
	for _, c := range a.containers {
		if c.name == t.Name && c.podUID == res.podUID() {
			return nil, fmt.Errorf("%w: container name %q is already used for %s", ErrConflict, t.Name, c.cgroup)
		}
		if c.cgroup == res.cgroup {
			return nil, fmt.Errorf("%w: cgroup %s is already managed as container %q", ErrConflict, res.cgroup, c.name)
		}
	}
	st, err := a.cg.Read(res.cgroup)
	if err != nil {
		if errors.Is(err, cgroup.ErrNotFound) {
			return nil, fmt.Errorf("%w: target cgroup %s does not exist under the cgroup root", ErrNotFound, res.cgroup)
		}
		return nil, fmt.Errorf("read target cgroup %s: %w", res.cgroup, err)
	}
	if t.PodCgroupPath != "" {
		if !cgroup.IsUnder(res.cgroup, t.PodCgroupPath) {
			return nil, fmt.Errorf("%w: the container's cgroup %s is not below podCgroupPath %s", intent.ErrInvalid, res.cgroup, t.PodCgroupPath)
		}
		if _, err := a.cg.Read(t.PodCgroupPath); err != nil {
			return nil, fmt.Errorf("%w: pod cgroup %s: %w", ErrNotFound, t.PodCgroupPath, err)
		}
	}
	c := &container{key: res.key, name: t.Name, cgroup: res.cgroup, res: intent.FromCgroup(st)}
	if res.ctr != nil {
		c.runtimeID, c.podUID = res.ctr.ID, res.ctr.PodUID
		if c.name == "" {
			c.name = res.ctr.Name
		}
	}
	a.containers[c.key] = c
	c.pod = a.pods.join(t.PodCgroupPath, c)
	a.exits.follow(c, "")
	a.ledger.Set(c.key, requests(c.res))
	a.learnRuntimeLocked(c, res)
	a.log.Info("container registered", "container", c.name, "cgroup", c.cgroup, "runtimeID", c.runtimeID, "inferred", c.res.String(), "fromRuntime", c.reported)
	return c, nil
}

// learnRuntimeLocked takes what the runtime reported at resolve time for
// c's undeclared resources and for its pod's other containers. It holds
// nothing on the ledger until an intent is admitted.
func (a *Agent) learnRuntimeLocked(c *container, res resolved) {
	if res.ctr == nil || res.ctr.ID != c.runtimeID || res.known {
		return
	}
	if r, ok := reportedResources(res.ctr.Resources); ok {
		c.adoptReported(r)
	}
	c.kubeletHigh = res.ctr.Resources.MemoryHigh > 0
	ct := *res.ctr
	c.ctr = &ct
	if c.pod != nil && res.listed != nil {
		c.pod.setListing(res.listed)
		c.pod.marks, c.pod.markedAt = res.marks, res.markedAt
	}
}

func (r resolved) podUID() string {
	if r.ctr != nil {
		return r.ctr.PodUID
	}
	return ""
}

func requests(r intent.Resources) admission.Capacity {
	return admission.Capacity{MilliCPU: r.CPURequest, Memory: r.MemoryRequest}
}

// admissibleLocked checks what can be checked without the kernel or the
// ledger: the merged resources are valid, the QoS class stays the same, and
// no resource that changes needs a restart the agent cannot do.
func (a *Agent) admissibleLocked(c *container, spec intent.Spec, ch intent.Change) (intent.Resources, error) {
	freshCPU, freshMem := c.fresh()
	want, err := ch.Apply(c.res, freshCPU, freshMem)
	if err != nil {
		return want, err
	}
	if err := removals(c.res, ch); err != nil {
		return want, err
	}
	// The QoS class is judged once the container's resources are known:
	// reported by the runtime, or declared.
	if c.known() {
		before, after := c.qos(c.res), c.qos(want)
		if placed, ok := c.placedQOS(); ok && before == corev1.PodQOSBestEffort && placed == corev1.PodQOSBurstable {
			// The runtime's record cannot show a memory request: the
			// kubelet's placement says what the pod is.
			before = placed
		}
		if before != after {
			return want, fmt.Errorf("%w: %s: the resize would change the QoS class from %s to %s, which in-place resize does not allow",
				intent.ErrInvalid, intent.ReasonQoSChange, before, after)
		}
	}
	if c.runtimeID == "" && needsRestart(spec, c.res, want) {
		return want, fmt.Errorf("%w: resizePolicy is RestartContainer for a resource that changes, but %s is a bare cgroup with no runtime to restart it; use NotRequired or target the container through the runtime (podUID or containerID)",
			intent.ErrInvalid, c.cgroup)
	}
	return want, nil
}

// removals refuses what the Kubernetes API refuses of an in-place resize
// (pkg/apis/core/validation/validation.go, ValidatePodResize): a limit the
// container has cannot be removed (set to 0), nor can a request.
func removals(cur intent.Resources, ch intent.Change) error {
	var out []string
	removes := func(v *int64, had int64) bool { return v != nil && *v == 0 && had > 0 }
	if removes(ch.CPULimit, cur.CPULimit) {
		out = append(out, "limits.cpu: resource limits cannot be removed (it is "+intent.FormatCPU(cur.CPULimit)+")")
	}
	if removes(ch.MemoryLimit, cur.MemoryLimit) {
		out = append(out, "limits.memory: resource limits cannot be removed (it is "+intent.FormatMemory(cur.MemoryLimit)+")")
	}
	if removes(ch.CPURequest, cur.CPURequest) {
		out = append(out, "requests.cpu: resource requests cannot be removed (it is "+intent.FormatCPU(cur.CPURequest)+")")
	}
	if removes(ch.MemoryRequest, cur.MemoryRequest) {
		out = append(out, "requests.memory: resource requests cannot be removed (it is "+intent.FormatMemory(cur.MemoryRequest)+")")
	}
	if len(out) > 0 {
		return fmt.Errorf("%w: %s", intent.ErrInvalid, strings.Join(out, "; "))
	}
	return nil
}

// needsRestart reports whether a resource whose policy is RestartContainer
// changes, which is when the kubelet restarts a container to resize it.
func needsRestart(spec intent.Spec, from, to intent.Resources) bool {
	pol, _ := intent.Policies(spec.ResizePolicy)
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if pol[res] == corev1.RestartContainer && changes(from, to, res) {
			return true
		}
	}
	return false
}

func changes(a, b intent.Resources, res corev1.ResourceName) bool {
	if res == corev1.ResourceCPU {
		return a.CPURequest != b.CPURequest || a.CPULimit != b.CPULimit
	}
	return a.MemoryRequest != b.MemoryRequest || a.MemoryLimit != b.MemoryLimit
}

// Run resyncs every interval, and handles the exits the ExitWatcher
// reports as they come, until ctx ends.
func (a *Agent) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var exits <-chan cgroup.Event
	var lost <-chan error
	if a.exits.w != nil {
		exits, lost = a.exits.w.Events(), a.exits.w.Errors()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Resync()
		case err, ok := <-lost:
			if !ok {
				lost = nil
				continue
			}
			// Exits may have gone unreported: look at every container now
			// rather than at the next full round, minutes away.
			a.log.Warn("the exit watcher may have missed events; looking at every managed container", "err", err)
			a.resync(true)
		case e, ok := <-exits:
			if !ok {
				exits = nil
				continue
			}
			a.handleExit(ctx, e)
		}
	}
}

// Close stops accepting intents, lets the writes in flight finish (until
// ctx ends), fails every intent still queued or Deferred with
// AgentShutdown, and closes the watch streams.
func (a *Agent) Close(ctx context.Context) error {
	a.mu.Lock()
	a.closing = true
	a.mu.Unlock()
	a.stop(errClosing)
	done := make(chan struct{})
	go func() { a.workers.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("writes still in flight at shutdown: %w", ctx.Err())
	}
	a.mu.Lock()
	for _, c := range a.containers {
		if r := c.pending; r != nil {
			a.finishLocked(c, r, intent.Failed, intent.ReasonShutdown, "the agent shut down before this intent could be applied")
		}
	}
	a.mu.Unlock()
	a.hub.closeAll()
	return err
}

func describe(c intent.Change) string {
	var parts []string
	add := func(name string, v *int64, f func(int64) string) {
		if v != nil {
			parts = append(parts, name+"="+f(*v))
		}
	}
	add("requests.cpu", c.CPURequest, intent.FormatCPU)
	add("limits.cpu", c.CPULimit, intent.FormatCPU)
	add("requests.memory", c.MemoryRequest, intent.FormatMemory)
	add("limits.memory", c.MemoryLimit, intent.FormatMemory)
	return strings.Join(parts, " ")
}
