package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

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
// implements it.
type Runtime interface {
	Find(ctx context.Context, podUID, name string) (cri.Container, error)
	Get(ctx context.Context, id string) (cri.Container, error)
	Update(ctx context.Context, id string, r cri.Resources) error
	Restart(ctx context.Context, id string, r cri.Resources, stopTimeout time.Duration) (cri.Container, error)
}

// Option configures an Agent.
type Option func(*Agent)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }

// WithMetrics makes the agent record its metrics in m.
func WithMetrics(m *metrics.Metrics) Option { return func(a *Agent) { a.metrics = m } }

// WithCPUPeriod sets the cpu.max period in microseconds (default 100000).
func WithCPUPeriod(p uint64) Option { return func(a *Agent) { a.period = p } }

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
func WithExitWatcher(w ExitWatcher) Option { return func(a *Agent) { a.exits = w } }

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(a *Agent) { a.now = now } }

// Agent is safe for concurrent use.
type Agent struct {
	cg       Cgroups
	rt       Runtime
	pressure []pressure.Source
	exits    ExitWatcher
	drift    drifts  // drift.go
	journal  Journal // recover.go; nil: intents are not durable
	ledger   *admission.Ledger
	log      *slog.Logger
	metrics  *metrics.Metrics
	period   uint64
	history  int
	now      func() time.Time

	// shrinkTimeout is set by WithShrinkTimeout; 0 means DefaultShrinkTimeout.
	shrinkTimeout time.Duration

	hub     *hub
	workers sync.WaitGroup

	mu         sync.Mutex
	seq        uint64
	closing    bool
	intents    map[string]*record
	accepting  map[string]*record // being journaled, not yet acknowledged
	order      []string           // intent IDs in the order accepted
	containers map[string]*container
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
	ticket    journal.Ticket
	recovered bool
	// deferredAt is when the intent was first Deferred, which orders the
	// retries like the PodResizePending condition's transition time.
	deferredAt time.Time
	started    time.Time // when admitted, for the admission phase
	// restarting is the runtime container this intent began to restart
	// (journaled before the restart; see markRestarting).
	restarting string
}

// container is one container the agent manages, keyed by its cgroup path
// (a bare cgroup) or by pod UID and name (a runtime's container, whose ID and
// cgroup change when it is restarted).
type container struct {
	key, name, pod string
	cgroup         string // its cgroup now
	runtimeID      string // "" for a bare cgroup
	podUID         string
	// res is what the container was last given; for a resource no intent
	// has declared yet (cpu, mem false), the limit inferred from its cgroup.
	// The agent writes only the files of declared resources.
	res      intent.Resources
	cpu, mem bool
	pending  *record // the next intent to run: Proposed or Deferred
	running  bool
	last     string // ID of the last intent to reach a terminal state
	// newest is the newest intent accepted, which a late older one must
	// not supersede (recover.go).
	newest *record
	// admitted is an intent admitted by retryDeferredLocked, with its
	// reservation made, for the worker to apply.
	admitted *admittedIntent
	// exited is the cgroup reported emptied while the worker ran.
	exited string
}

// admittedIntent is an admitted intent and what it will apply.
type admittedIntent struct {
	r    *record
	want intent.Resources
}

// New returns an Agent that writes through cg and admits against ledger.
func New(cg Cgroups, ledger *admission.Ledger, opts ...Option) *Agent {
	a := &Agent{
		cg: cg, ledger: ledger, log: slog.Default(), period: cgroup.DefaultPeriod, history: 10000,
		now: time.Now, hub: newHub(), intents: map[string]*record{}, containers: map[string]*container{},
		accepting: map[string]*record{},
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Submit validates and accepts an intent. It returns the intent as
// accepted, and created=false when the same ID and spec were accepted before
// (an idempotent retry). With a journal, the intent is on disk before
// Submit returns. Errors match intent.ErrInvalid, ErrNotFound, ErrConflict,
// ErrShuttingDown or ErrJournal.
func (a *Agent) Submit(spec intent.Spec) (intent.Intent, bool, error) {
	spec, change, err := intent.Validate(spec)
	if err != nil {
		return intent.Intent{}, false, err
	}
	// The stored spec must not share maps with the caller's.
	spec.Resources = *spec.Resources.DeepCopy()
	spec.ResizePolicy = slices.Clone(spec.ResizePolicy)
	res, err := a.resolve(spec.Target)
	if err != nil {
		return intent.Intent{}, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return intent.Intent{}, false, ErrShuttingDown
	}
	if spec.ID != "" {
		if old, ok := a.intents[spec.ID]; ok {
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
	r := &record{Intent: intent.Intent{ID: spec.ID, Spec: spec, Status: intent.Status{
		State: intent.Proposed, AcceptedAt: now, UpdatedAt: now,
	}}, change: change, seq: a.seq}
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

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102-150405-") + hex.EncodeToString(b[:])
}

// resolved is where a target is: its key, cgroup and runtime container.
type resolved struct {
	key, cgroup string
	pod         string // the kubelet's pod cgroup of a runtime container, if any
	ctr         *cri.Container
}

// resolve finds a target, asking the runtime for a runtime's container. It
// runs without the lock: the runtime may be slow.
func (a *Agent) resolve(t intent.Target) (resolved, error) {
	if !t.Runtime() {
		return resolved{key: t.CgroupPath, cgroup: t.CgroupPath}, nil
	}
	if a.rt == nil {
		return resolved{}, fmt.Errorf("%w: the target names a runtime container, but this agent has no container runtime (set --cri-endpoint)", intent.ErrInvalid)
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
	key := "container:" + ct.ID
	if ct.PodUID != "" {
		key = "pod:" + ct.PodUID + "/" + ct.Name
	}
	return resolved{key: key, cgroup: p, pod: podCgroupOf(p, ct.PodUID), ctr: &ct}, nil
}

// containerLocked finds or, on first sight, registers the target. A new
// container's limits are inferred from its cgroup; it holds nothing on the
// ledger until an intent declares its requests.
func (a *Agent) containerLocked(t intent.Target, res resolved) (*container, error) {
	if t.PodCgroupPath == "" && res.pod != "" {
		// The kubelet's pod cgroup, kept in step unless it cannot be read.
		if _, err := a.cg.Read(res.pod); err == nil {
			t.PodCgroupPath = res.pod
		}
	}
	if c, ok := a.containers[res.key]; ok {
		if c.name != t.Name && !t.Runtime() {
			return nil, fmt.Errorf("%w: cgroup %s is managed as container %q, not %q", ErrConflict, res.cgroup, c.name, t.Name)
		}
		if c.pod != t.PodCgroupPath {
			return nil, fmt.Errorf("%w: container %q is managed with pod cgroup %q, not %q", ErrConflict, c.name, c.pod, t.PodCgroupPath)
		}
		if res.ctr != nil && c.runtimeID != res.ctr.ID && !c.running {
			// Restarted behind the agent's back: follow the new one.
			old := c.cgroup
			c.runtimeID, c.cgroup = res.ctr.ID, res.cgroup
			a.watchLocked(c, old)
		}
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
	c := &container{key: res.key, name: t.Name, pod: t.PodCgroupPath, cgroup: res.cgroup, res: intent.FromCgroup(st)}
	if res.ctr != nil {
		c.runtimeID, c.podUID = res.ctr.ID, res.ctr.PodUID
		if c.name == "" {
			c.name = res.ctr.Name
		}
	}
	a.containers[c.key] = c
	a.watchLocked(c, "")
	a.ledger.Set(c.key, requests(c.res))
	a.log.Info("container registered", "container", c.name, "cgroup", c.cgroup, "runtimeID", c.runtimeID, "inferred", c.res.String())
	return c, nil
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
	want, err := ch.Apply(c.res, !c.cpu, !c.mem)
	if err != nil {
		return want, err
	}
	// The QoS class is known only once both resources are declared.
	if c.cpu && c.mem {
		before, after := a.podQOSLocked(c, c.res), a.podQOSLocked(c, want)
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

// podQOSLocked is the QoS class of c's pod (or of c alone) if c had res.
func (a *Agent) podQOSLocked(c *container, res intent.Resources) corev1.PodQOSClass {
	all := []intent.Resources{res}
	if c.pod != "" {
		for _, o := range a.containers {
			if o != c && o.pod == c.pod {
				all = append(all, o.res)
			}
		}
	}
	return intent.QOSClass(all...)
}

// podMembersLocked returns the resources of c's pod's containers, with want
// in place of c's, and those of the pod's running containers the agent does
// not manage (listed by the runtime).
func (a *Agent) podMembersLocked(c *container, want intent.Resources, others []cri.Container) []intent.Resources {
	var siblings []intent.Resources
	managed := map[string]bool{c.runtimeID: true}
	for _, o := range a.containers {
		if o != c && o.pod == c.pod {
			siblings = append(siblings, o.res)
			managed[o.runtimeID] = true
		}
	}
	return podMembers(want, siblings, others, managed, c.podUID)
}

// kickLocked starts c's worker unless it runs.
func (a *Agent) kickLocked(c *container) {
	if c.running {
		return
	}
	c.running = true
	a.workers.Add(1)
	go a.work(c)
}

// work runs c's intents one after another until none is ready.
func (a *Agent) work(c *container) {
	defer a.workers.Done()
	for {
		a.mu.Lock()
		if ad := c.admitted; ad != nil {
			// Admitted and reserved already: apply even when closing, as a
			// write in flight.
			c.admitted = nil
			a.mu.Unlock()
			a.apply(c, ad.r, ad.want)
			continue
		}
		r := c.pending
		if r == nil || a.closing || (r.Status.State == intent.Deferred && !r.retry) {
			c.running = false
			a.mu.Unlock()
			return
		}
		r.retry = false
		next, ok := a.admitLocked(c, r)
		a.mu.Unlock()
		if ok {
			a.apply(c, r, next)
		}
	}
}

// admitLocked moves r from Proposed or Deferred to InProgress, Deferred or
// Infeasible. It returns the resources to apply when r goes ahead.
func (a *Agent) admitLocked(c *container, r *record) (intent.Resources, bool) {
	want, err := a.admissibleLocked(c, r.Spec, r.change)
	if err != nil {
		a.finishLocked(c, r, intent.Failed, reasonOf(err), err.Error())
		return want, false
	}
	d := a.ledger.Reserve(c.key, requests(want))
	switch d.Verdict {
	case admission.Infeasible:
		a.finishLocked(c, r, intent.Infeasible, intent.ReasonInfeasible, d.Message)
		return want, false
	case admission.Deferred:
		first := r.Status.State != intent.Deferred
		if first || r.Status.Message != d.Message {
			a.setLocked(r, intent.Deferred, intent.ReasonDeferred, d.Message)
		}
		if first {
			r.deferredAt = a.now()
			a.log.Info("intent deferred", "intent", r.ID, "container", c.name, "message", d.Message)
			if a.metrics != nil {
				a.metrics.Resizes.WithLabelValues("deferred").Inc()
			}
		}
		return want, false
	}
	c.pending = nil
	r.Status.Attempts++
	r.started = a.now()
	a.setLocked(r, intent.InProgress, "", "")
	return want, true
}

func reasonOf(err error) string {
	if msg := err.Error(); strings.Contains(msg, intent.ReasonQoSChange) {
		return intent.ReasonQoSChange
	}
	return intent.ReasonInvalid
}

// apply writes want to c's cgroups and finishes r. It runs without the lock;
// c's worker is the only one touching c's cgroups.
func (a *Agent) apply(c *container, r *record, want intent.Resources) {
	a.mu.Lock()
	pod, podUID := c.pod, c.podUID
	a.mu.Unlock()
	var others []cri.Container
	if pod != "" {
		others = a.unmanagedMembers(podUID)
	}

	a.mu.Lock()
	old := c.res
	job := applyJob{
		r: r, want: want, old: old, runtimeID: c.runtimeID,
		cpu: c.cpu || r.change.Touches(corev1.ResourceCPU),
		mem: c.mem || r.change.Touches(corev1.ResourceMemory),
	}
	// A restart is not idempotent: an intent that restarted its container
	// before the agent stopped finds the next attempt running and is applied
	// to it in place, verified like any other.
	job.restartedBefore = r.restarting != "" && r.restarting != c.runtimeID
	job.restart = c.runtimeID != "" && needsRestart(r.Spec, old, want) && !job.restartedBefore
	job.ctr = level{path: c.cgroup, want: a.stored(c.cgroup, want.Cgroup(a.period, job.cpu, job.mem))}
	if c.pod != "" {
		pcpu, pmem := job.cpu, job.mem
		for _, o := range a.containers {
			if o != c && o.pod == c.pod {
				pcpu, pmem = pcpu || o.cpu, pmem || o.mem
			}
		}
		job.pod = &level{path: c.pod, want: a.stored(c.pod, podResources(a.podMembersLocked(c, want, others)).Cgroup(a.period, pcpu, pmem))}
	}
	a.mu.Unlock()

	out := a.write(&job)
	a.observePhases(r, &job, out.state)

	a.mu.Lock()
	defer a.mu.Unlock()
	if out.state == intent.Completed {
		c.res, c.cpu, c.mem = want, job.cpu, job.mem
		r.Status.Applied = out.applied
		r.Status.Via = out.via
	} else {
		a.ledger.Set(c.key, requests(old))
	}
	if job.restartedBefore {
		r.Status.Restarted, r.Status.ContainerID = true, c.runtimeID
		if out.state == intent.Completed {
			out.msg = fmt.Sprintf("container %s was restarted as %s before the agent stopped; %s", r.restarting, c.runtimeID, out.msg)
		}
	}
	if out.newCtr != nil {
		// Restarted, whatever else happened: follow the new container.
		old := c.cgroup
		c.runtimeID, c.cgroup = out.newCtr.ID, out.newCgroup
		a.watchLocked(c, old)
		r.Status.Restarted, r.Status.ContainerID = true, out.newCtr.ID
		r.Status.Via = "restart"
	}
	a.finishLocked(c, r, out.state, out.reason, out.msg)
	// Capacity freed, by a shrink or by handing back a reservation that
	// was not used: give Deferred intents their chance.
	now := requests(c.res)
	reserved := requests(want)
	if now.MilliCPU < max(reserved.MilliCPU, requests(old).MilliCPU) || now.Memory < max(reserved.Memory, requests(old).Memory) {
		a.retryDeferredLocked()
	}
	if c.exited != "" && c.exited == c.cgroup && c.pending == nil && c.admitted == nil {
		a.exitedLocked(c)
	}
}

// applyJob is a snapshot, taken under the lock, of what apply must do.
type applyJob struct {
	r         *record
	want, old intent.Resources
	cpu, mem  bool // which resources are managed
	runtimeID string
	restart   bool
	// restartedBefore: the intent restarted the container before the agent
	// stopped; the new attempt is resized in place instead.
	restartedBefore bool
	shrunk          bool // shrink.go reclaimed before this write
	ctr             level
	pod             *level
	took            phaseTimes
}

// phaseTimes is the time one apply spent in each phase after admission.
type phaseTimes struct{ reclaim, runtime, verify time.Duration }

// observePhases records the phases of an applied intent.
func (a *Agent) observePhases(r *record, j *applyJob, s intent.State) {
	if a.metrics == nil {
		return
	}
	outcome := strings.ToLower(string(s))
	h := a.metrics.ResizePhase
	h.WithLabelValues("admission", outcome).Observe(r.started.Sub(r.Status.AcceptedAt).Seconds())
	h.WithLabelValues("reclaim", outcome).Observe(j.took.reclaim.Seconds())
	h.WithLabelValues("runtime", outcome).Observe(j.took.runtime.Seconds())
	h.WithLabelValues("verify", outcome).Observe(j.took.verify.Seconds())
}

// timed runs f and adds its duration to *d.
func timed(d *time.Duration, f func()) {
	t := time.Now()
	f()
	*d += time.Since(t)
}

type applyResult struct {
	state     intent.State
	reason    string
	msg       string
	applied   map[string][]cgroup.Value
	via       string
	newCtr    *cri.Container
	newCgroup string
}

func failed(reason, format string, args ...any) applyResult {
	return applyResult{state: intent.Failed, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// runtimeTimeout bounds the runtime's part of one apply.
const runtimeTimeout = 30 * time.Second

// write does the cgroup and runtime part of apply and says how it ended.
func (a *Agent) write(j *applyJob) applyResult {
	var err error
	failedPath := j.ctr.path
	timed(&j.took.verify, func() {
		if j.ctr.cur, err = a.cg.Read(j.ctr.path); err == nil && j.pod != nil {
			failedPath = j.pod.path
			j.pod.cur, err = a.cg.Read(j.pod.path)
		}
	})
	if err != nil {
		return a.readFailed(failedPath, err)
	}
	// A decrease below usage: shrink.go brings usage down first, or refuses.
	var refused applyResult
	var stop bool
	timed(&j.took.reclaim, func() { refused, stop = a.memoryBelowUsage(j) })
	if stop {
		return refused
	}
	steps := plan(j.ctr, j.pod, a.cg.PageSize())
	if j.restart {
		return a.restart(j, steps)
	}
	if len(steps) == 0 {
		return applyResult{state: intent.Completed, reason: intent.ReasonNoChange, msg: "cgroup already holds the requested values"}
	}
	out := applyResult{state: intent.Completed, reason: intent.ReasonApplied, applied: map[string][]cgroup.Value{}, via: "cgroup"}
	var notes []string
	for i, s := range steps {
		how, note, err := a.writeStep(j, s)
		if note != "" {
			notes = append(notes, note)
		}
		if err != nil {
			rb := a.rollback(j, steps[:i])
			a.log.Warn("resize step failed", "intent", j.r.ID, "cgroup", s.path, "values", s.resource.Values(), "err", err, "rollback", rb)
			reason := intent.ReasonWriteFailed
			switch {
			case errors.Is(err, cri.ErrNotFound) || errors.Is(err, cgroup.ErrNotFound):
				reason = intent.ReasonContainerGone
			case errors.Is(err, cri.ErrUnavailable):
				reason = intent.ReasonRuntimeUnavailable
			}
			msg := fmt.Sprintf("writing %s %s: %v", s.path, s.group, err)
			if rb != nil {
				msg += "; rollback: " + rb.Error()
			} else if i > 0 {
				msg += fmt.Sprintf("; the %d step(s) done before were undone", i)
			}
			return failed(reason, "%s", msg)
		}
		if s.container && how != "cgroup" {
			out.via = how
		}
		out.applied[s.path] = append(out.applied[s.path], s.resource.Values()...)
	}
	out.msg = fmt.Sprintf("%d cgroup step(s) written and verified", len(steps))
	if out.via != "cgroup" {
		out.msg = fmt.Sprintf("%d step(s) applied, the container's through the runtime (CRI UpdateContainerResources), and verified on the cgroup files", len(steps))
	}
	if len(notes) > 0 {
		out.msg += "; " + strings.Join(notes, "; ")
	}
	return out
}

// writeStep writes one step. A container of a runtime is updated through
// the runtime, so that the runtime's record of its resources matches, and
// the files are then checked; where the runtime's update fails or does not
// hold, the files are written directly and the note says so.
func (a *Agent) writeStep(j *applyJob, s step) (how, note string, err error) {
	if !s.container || j.runtimeID == "" {
		timed(&j.took.verify, func() { err = a.cg.Write(s.path, s.resource) })
		a.countWrite(s.resource, err)
		return "cgroup", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), runtimeTimeout)
	defer cancel()
	timed(&j.took.runtime, func() {
		err = a.rt.Update(ctx, j.runtimeID, criResources(j.want, s.group == "cpu", s.group == "memory", a.period))
	})
	a.countRuntime(err)
	switch {
	case errors.Is(err, cri.ErrNotFound):
		return "runtime", "", err
	case errors.Is(err, cri.ErrUnavailable):
		// Not written behind its back: the runtime's record of the
		// container's resources would then be wrong when it returns.
		return "runtime", "", err
	case err != nil:
		note = fmt.Sprintf("the runtime refused the %s update (%v), so the agent wrote the cgroup itself", s.group, err)
	default:
		var st cgroup.State
		var rerr error
		timed(&j.took.verify, func() { st, rerr = a.cg.Read(s.path) })
		if rerr != nil {
			return "runtime", "", rerr
		}
		if st.Matches(s.resource, a.cg.PageSize()) {
			return "runtime", "", nil
		}
		note = fmt.Sprintf("after the runtime's %s update the cgroup held cpu.max=%q cpu.weight=%d memory.max=%d, so the agent wrote the cgroup itself",
			s.group, st.CPUMax, st.CPUWeight, st.MemoryMax)
	}
	timed(&j.took.verify, func() { err = a.cg.Write(s.path, s.resource) })
	a.countWrite(s.resource, err)
	return "runtime+cgroup", note, err
}

// restart applies a resize by restarting the container with its new
// resources: the pod cgroup grows first, the container restarts, and the
// pod cgroup shrinks after.
func (a *Agent) restart(j *applyJob, steps []step) applyResult {
	var before, after []step
	for _, s := range steps {
		switch {
		case s.container:
		case shrinks(j.ctr.cur, j.ctr.want, s.group):
			after = append(after, s)
		default:
			before = append(before, s)
		}
	}
	for i, s := range before {
		err := a.cg.Write(s.path, s.resource)
		a.countWrite(s.resource, err)
		if err != nil {
			a.rollback(j, before[:i])
			return failed(intent.ReasonWriteFailed, "writing pod cgroup %s before the restart: %v", s.path, err)
		}
	}
	if err := a.markRestarting(j); err != nil {
		a.rollback(j, before)
		return failed(intent.ReasonRestartFailed, "container %s not restarted: %v", j.runtimeID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), runtimeTimeout+10*time.Second)
	defer cancel()
	var ct cri.Container
	var err error
	timed(&j.took.runtime, func() {
		ct, err = a.rt.Restart(ctx, j.runtimeID, criResources(j.want, j.cpu, j.mem, a.period), 10*time.Second)
	})
	a.countRuntime(err)
	if err != nil {
		a.rollback(j, before)
		return failed(intent.ReasonRestartFailed, "restarting container %s: %v", j.runtimeID, err)
	}
	out := applyResult{state: intent.Completed, reason: intent.ReasonApplied, newCtr: &ct, applied: map[string][]cgroup.Value{}}
	if out.newCgroup, err = a.cg.PathOf(ct.PID); err != nil {
		out.newCgroup = j.ctr.path
		return applyResult{state: intent.Failed, reason: intent.ReasonRestartFailed, newCtr: &ct, newCgroup: out.newCgroup,
			msg: fmt.Sprintf("container restarted as %s but its cgroup cannot be found: %v", ct.ID, err)}
	}
	st, err := a.cg.Read(out.newCgroup)
	if err == nil && !st.Matches(j.ctr.want, a.cg.PageSize()) {
		err = a.cg.Write(out.newCgroup, j.ctr.want)
		a.countWrite(j.ctr.want, err)
	}
	if err != nil {
		return applyResult{state: intent.Failed, reason: intent.ReasonRestartFailed, newCtr: &ct, newCgroup: out.newCgroup,
			msg: fmt.Sprintf("container restarted as %s, but its cgroup %s does not hold the new values: %v", ct.ID, out.newCgroup, err)}
	}
	out.applied[out.newCgroup] = j.ctr.want.Values()
	for _, s := range after {
		err := a.cg.Write(s.path, s.resource)
		a.countWrite(s.resource, err)
		if err != nil {
			return applyResult{state: intent.Failed, reason: intent.ReasonWriteFailed, newCtr: &ct, newCgroup: out.newCgroup,
				msg: fmt.Sprintf("container restarted as %s, but shrinking pod cgroup %s failed: %v", ct.ID, s.path, err)}
		}
		out.applied[s.path] = append(out.applied[s.path], s.resource.Values()...)
	}
	out.msg = fmt.Sprintf("container restarted as %s (restart count %d) with the new resources, verified on %s", ct.ID, ct.RestartCount, out.newCgroup)
	return out
}

// criResources is what the kubelet sends the runtime for these resources:
// shares from the CPU request, quota and period from the limit (-1:
// unlimited), the memory limit (-1: unlimited). Fields of a resource not
// being changed are 0, which the runtime leaves as they are.
func criResources(r intent.Resources, cpu, mem bool, period uint64) cri.Resources {
	var out cri.Resources
	if cpu {
		out.CPUPeriod = int64(period)
		out.CPUQuota = cgroup.MilliCPUToQuota(r.CPULimit, period)
		out.CPUShares = int64(cgroup.MilliCPUToShares(r.CPURequest))
	}
	if mem {
		out.MemoryLimit = cgroup.Unlimited
		if r.MemoryLimit > 0 {
			out.MemoryLimit = r.MemoryLimit
		}
	}
	return out
}

func (a *Agent) readFailed(path string, err error) applyResult {
	reason := intent.ReasonWriteFailed
	if errors.Is(err, cgroup.ErrNotFound) {
		reason = intent.ReasonContainerGone
	}
	return failed(reason, "reading %s: %v", path, err)
}

// rollback undoes done steps, newest first: the files directly, and, for a
// runtime's container, the runtime's record too.
func (a *Agent) rollback(j *applyJob, done []step) error {
	var errs []error
	for _, s := range slices.Backward(done) {
		if s.container && j.runtimeID != "" {
			ctx, cancel := context.WithTimeout(context.Background(), runtimeTimeout)
			err := a.rt.Update(ctx, j.runtimeID, criResources(j.old, s.group == "cpu", s.group == "memory", a.period))
			cancel()
			a.countRuntime(err)
		}
		err := a.cg.Write(s.path, s.previous)
		if a.metrics != nil {
			for _, v := range s.previous.Values() {
				a.metrics.CgroupWrites.WithLabelValues(v.File, "rollback").Inc()
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (a *Agent) countRuntime(err error) {
	if a.metrics == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	a.metrics.RuntimeCalls.WithLabelValues(result).Inc()
}

func (a *Agent) countWrite(r cgroup.Resources, err error) {
	if a.metrics == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	for _, v := range r.Values() {
		a.metrics.CgroupWrites.WithLabelValues(v.File, result).Inc()
	}
}

// setLocked changes r's state and tells the watchers.
func (a *Agent) setLocked(r *record, s intent.State, reason, msg string) {
	r.Status.State, r.Status.Reason, r.Status.Message = s, reason, msg
	r.Status.UpdatedAt = a.now()
	a.hub.publish(Event{Type: "MODIFIED", Intent: r.Intent})
	a.journalLocked(r)
}

// finishLocked puts r in a terminal state and records its metrics.
func (a *Agent) finishLocked(c *container, r *record, s intent.State, reason, msg string) {
	if c.pending == r {
		c.pending = nil
	}
	if r.recovered {
		msg += " (queued again after an agent restart)"
	}
	now := a.now()
	r.Status.CompletedAt = &now
	a.setLocked(r, s, reason, msg)
	c.last = r.ID
	a.gauge(-1)
	level := slog.LevelInfo
	if s != intent.Completed {
		level = slog.LevelWarn
	}
	a.log.Log(context.Background(), level, "intent "+strings.ToLower(string(s)), "intent", r.ID, "container", c.name,
		"reason", reason, "message", msg, "duration", now.Sub(r.Status.AcceptedAt))
	if a.metrics == nil {
		return
	}
	outcome := strings.ToLower(string(s))
	a.metrics.Resizes.WithLabelValues(outcome).Inc()
	d := now.Sub(r.Status.AcceptedAt).Seconds()
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if r.change.Touches(res) {
			a.metrics.ResizeDuration.WithLabelValues(string(res), outcome).Observe(d)
		}
	}
}

func (a *Agent) gauge(delta float64) {
	if a.metrics != nil {
		a.metrics.InFlight.Add(delta)
	}
}

// evictLocked drops the oldest terminal intents beyond the history size.
func (a *Agent) evictLocked() {
	excess := len(a.order) - a.history
	if excess <= 0 {
		return
	}
	kept := a.order[:0]
	for _, id := range a.order {
		if excess > 0 && a.intents[id].Status.State.Terminal() {
			delete(a.intents, id)
			excess--
			continue
		}
		kept = append(kept, id)
	}
	a.order = kept
}

// Get returns an intent by ID.
func (a *Agent) Get(id string) (intent.Intent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.intents[id]
	if !ok {
		return intent.Intent{}, fmt.Errorf("%w: intent %q", ErrNotFound, id)
	}
	return r.Intent, nil
}

// List returns the intents that match f, oldest first, optionally only
// those in state.
func (a *Agent) List(f Filter, state intent.State) []intent.Intent {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []intent.Intent{}
	for _, id := range a.order {
		r := a.intents[id]
		if f.Match(&r.Intent) && (state == "" || r.Status.State == state) {
			out = append(out, r.Intent)
		}
	}
	return out
}

// Watch returns the events that match f, starting with the current state of
// every matching intent that is not terminal (or of the one named by
// f.IntentID, whatever its state). The channel closes when ctx ends, when
// the watcher falls too far behind, or when the agent closes.
func (a *Agent) Watch(ctx context.Context, f Filter) <-chan Event {
	a.mu.Lock()
	ch := a.hub.subscribe(f)
	var initial []Event
	if f.IntentID != "" {
		// One intent, whatever its state: no scan of the history, which
		// every client waiting for its resize would otherwise pay.
		if r, ok := a.intents[f.IntentID]; ok && f.Match(&r.Intent) {
			initial = append(initial, Event{Type: "ADDED", Intent: r.Intent})
		}
	} else {
		for _, id := range a.order {
			r := a.intents[id]
			if f.Match(&r.Intent) && !r.Status.State.Terminal() {
				initial = append(initial, Event{Type: "ADDED", Intent: r.Intent})
			}
		}
	}
	a.mu.Unlock()
	out := make(chan Event, watchBuffer)
	go func() {
		defer close(out)
		defer a.hub.unsubscribe(ch)
		for _, e := range initial {
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
		for {
			select {
			case e, ok := <-ch:
				if !ok {
					return
				}
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Containers lists the managed containers with their live cgroup values.
func (a *Agent) Containers() []ContainerInfo {
	a.mu.Lock()
	out := make([]ContainerInfo, 0, len(a.containers))
	for _, c := range a.containers {
		ci := ContainerInfo{Name: c.name, CgroupPath: c.cgroup, PodCgroupPath: c.pod, ContainerID: c.runtimeID, PodUID: c.podUID, Resources: c.res,
			ManagesCPU: c.cpu, ManagesMemory: c.mem, Allocated: a.ledger.Get(c.key), LastIntent: c.last, QOSClass: intent.QOSClass(c.res)}
		ci.Drift = a.driftInfoLocked(c)
		if c.pending != nil {
			ci.PendingIntent = c.pending.ID
		}
		out = append(out, ci)
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	for i := range out {
		s, err := a.cg.Read(out[i].CgroupPath)
		if err != nil {
			out[i].CgroupError = err.Error()
			continue
		}
		mem := "max"
		if s.MemoryMax != cgroup.Unlimited {
			mem = fmt.Sprint(s.MemoryMax)
		}
		out[i].Cgroup = &CgroupValues{CPUMax: s.CPUMax.String(), CPUWeight: s.CPUWeight, MemoryMax: mem, MemoryCurrent: s.MemoryCurrent}
		if len(a.pressure) > 0 {
			out[i].Pressure = pressure.Summarize(out[i].CgroupPath, a.pressure)
		}
	}
	return out
}

// Targets lists the managed containers for the pressure collector.
func (a *Agent) Targets() []pressure.Target {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]pressure.Target, 0, len(a.containers))
	for _, c := range a.containers {
		out = append(out, pressure.Target{Name: c.name, PodUID: c.podUID, Cgroup: c.cgroup})
	}
	return out
}

// Forget stops managing a container (by name or cgroup path), releases what
// it held on the ledger and fails its pending intent.
func (a *Agent) Forget(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.containers {
		if c.name == name || c.cgroup == name || c.key == name {
			a.forgetLocked(c, "container removed from the agent")
			return nil
		}
	}
	return fmt.Errorf("%w: container %q", ErrNotFound, name)
}

func (a *Agent) forgetLocked(c *container, why string) {
	if r := c.pending; r != nil {
		a.finishLocked(c, r, intent.Failed, intent.ReasonContainerGone, why)
	}
	if ad := c.admitted; ad != nil {
		c.admitted = nil
		a.finishLocked(c, ad.r, intent.Failed, intent.ReasonContainerGone, why)
	}
	if a.exits != nil {
		a.exits.Unwatch(c.cgroup)
	}
	delete(a.containers, c.key)
	a.journalForgetLocked(c)
	a.ledger.Release(c.key)
	a.log.Info("container forgotten", "container", c.name, "cgroup", c.cgroup, "why", why)
	a.retryDeferredLocked()
}

// Resync forgets containers whose cgroup has gone, which frees their
// capacity for Deferred intents.
func (a *Agent) Resync() {
	a.mu.Lock()
	var idle []*container
	for _, c := range a.containers {
		if !c.running {
			idle = append(idle, c)
		}
	}
	a.mu.Unlock()
	for _, c := range idle {
		ok, err := a.cg.Exists(c.cgroup)
		if err != nil || ok {
			continue
		}
		a.mu.Lock()
		if cur, still := a.containers[c.key]; still && cur == c && !c.running {
			a.forgetLocked(c, "cgroup "+c.cgroup+" no longer exists")
		}
		a.mu.Unlock()
	}
}

// Run resyncs every interval, and handles the exits the ExitWatcher
// reports as they come, until ctx ends.
func (a *Agent) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var exits <-chan cgroup.Event
	if a.exits != nil {
		exits = a.exits.Events()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Resync()
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

// Node gauges, for metrics.RegisterNode.
func (a *Agent) AllocatableMilliCPU() int64 { return a.ledger.Allocatable().MilliCPU }
func (a *Agent) AllocatableMemory() int64   { return a.ledger.Allocatable().Memory }
func (a *Agent) AllocatedMilliCPU() int64   { return a.ledger.Allocated().MilliCPU }
func (a *Agent) AllocatedMemory() int64     { return a.ledger.Allocated().Memory }
func (a *Agent) ManagedContainers() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.containers)
}

// Node returns the capacity account.
func (a *Agent) Node() NodeInfo {
	al, used := a.ledger.Allocatable(), a.ledger.Allocated()
	return NodeInfo{Allocatable: al, Allocated: used, Free: admission.Capacity{MilliCPU: al.MilliCPU - used.MilliCPU, Memory: al.Memory - used.Memory}}
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
