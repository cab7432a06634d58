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
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup"
)

// Cgroups is what the agent needs of the cgroup filesystem.
type Cgroups interface {
	Read(path string) (cgroup.State, error)
	Write(path string, r cgroup.Resources) error
	Exists(path string) (bool, error)
	PageSize() int64
}

// Option configures an Agent.
type Option func(*Agent)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }

// WithMetrics makes the agent record its metrics in m.
func WithMetrics(m *metrics.Metrics) Option { return func(a *Agent) { a.metrics = m } }

// WithCPUPeriod sets the cpu.max period in microseconds (default 100000).
func WithCPUPeriod(p uint64) Option { return func(a *Agent) { a.period = p } }

// WithHistory sets how many terminal intents are kept for get and list.
func WithHistory(n int) Option { return func(a *Agent) { a.history = n } }

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(a *Agent) { a.now = now } }

// Agent is safe for concurrent use.
type Agent struct {
	cg      Cgroups
	ledger  *admission.Ledger
	log     *slog.Logger
	metrics *metrics.Metrics
	period  uint64
	history int
	now     func() time.Time

	hub     *hub
	workers sync.WaitGroup

	mu         sync.Mutex
	seq        uint64
	closing    bool
	intents    map[string]*record
	order      []string // intent IDs in the order accepted
	containers map[string]*container
}

// record is an intent with what the agent derived from its spec.
type record struct {
	intent.Intent
	change intent.Change
	seq    uint64
	retry  bool // a Deferred intent to try again
}

// container is one container the agent manages, keyed by cgroup path.
type container struct {
	key, name, pod string
	// res is what the container was last given; for a resource no intent
	// has declared yet (cpu, mem false), the limit inferred from its cgroup.
	// The agent writes only the files of declared resources.
	res      intent.Resources
	cpu, mem bool
	pending  *record // the next intent to run: Proposed or Deferred
	running  bool
	last     string // ID of the last intent to reach a terminal state
}

// New returns an Agent that writes through cg and admits against ledger.
func New(cg Cgroups, ledger *admission.Ledger, opts ...Option) *Agent {
	a := &Agent{
		cg: cg, ledger: ledger, log: slog.Default(), period: cgroup.DefaultPeriod, history: 10000,
		now: time.Now, hub: newHub(), intents: map[string]*record{}, containers: map[string]*container{},
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Submit validates and accepts an intent. It returns the intent as
// accepted, and created=false when the same ID and spec were accepted before
// (an idempotent retry). Errors match intent.ErrInvalid, ErrNotFound,
// ErrConflict or ErrShuttingDown.
func (a *Agent) Submit(spec intent.Spec) (intent.Intent, bool, error) {
	spec, change, err := intent.Validate(spec)
	if err != nil {
		return intent.Intent{}, false, err
	}
	// The stored spec must not share maps with the caller's.
	spec.Resources = *spec.Resources.DeepCopy()
	spec.ResizePolicy = slices.Clone(spec.ResizePolicy)
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
	}
	c, err := a.containerLocked(spec.Target)
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
	a.intents[r.ID] = r
	a.order = append(a.order, r.ID)
	a.gauge(1)
	a.hub.publish(Event{"ADDED", r.Intent})
	a.log.Info("intent accepted", "intent", r.ID, "container", c.name, "cgroup", c.key, "resources", describe(change))

	if old := c.pending; old != nil {
		old.Status.SupersededBy = r.ID
		a.finishLocked(c, old, intent.Superseded, intent.ReasonSuperseded, "superseded by intent "+r.ID+" for the same container")
	}
	c.pending = r
	a.kickLocked(c)
	a.evictLocked()
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

// containerLocked finds or, on first sight, registers the target. A new
// container's resources are inferred from its cgroup and its inferred CPU
// request is put on the ledger: it is already running and holds them.
func (a *Agent) containerLocked(t intent.Target) (*container, error) {
	if c, ok := a.containers[t.CgroupPath]; ok {
		if c.name != t.Name {
			return nil, fmt.Errorf("%w: cgroup %s is managed as container %q, not %q", ErrConflict, t.CgroupPath, c.name, t.Name)
		}
		if c.pod != t.PodCgroupPath {
			return nil, fmt.Errorf("%w: cgroup %s is managed with pod cgroup %q, not %q", ErrConflict, t.CgroupPath, c.pod, t.PodCgroupPath)
		}
		return c, nil
	}
	for _, c := range a.containers {
		if c.name == t.Name {
			return nil, fmt.Errorf("%w: container name %q is already used for cgroup %s", ErrConflict, t.Name, c.key)
		}
	}
	st, err := a.cg.Read(t.CgroupPath)
	if err != nil {
		if errors.Is(err, cgroup.ErrNotFound) {
			return nil, fmt.Errorf("%w: target cgroup %s does not exist under the cgroup root", ErrNotFound, t.CgroupPath)
		}
		return nil, fmt.Errorf("read target cgroup %s: %w", t.CgroupPath, err)
	}
	if t.PodCgroupPath != "" {
		if _, err := a.cg.Read(t.PodCgroupPath); err != nil {
			return nil, fmt.Errorf("%w: pod cgroup %s: %w", ErrNotFound, t.PodCgroupPath, err)
		}
	}
	c := &container{key: t.CgroupPath, name: t.Name, pod: t.PodCgroupPath, res: intent.FromCgroup(st)}
	a.containers[c.key] = c
	a.ledger.Set(c.key, requests(c.res))
	a.log.Info("container registered", "container", c.name, "cgroup", c.key, "inferred", c.res.String())
	return c, nil
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
	pol, _ := intent.Policies(spec.ResizePolicy)
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if pol[res] == corev1.RestartContainer && changes(c.res, want, res) {
			return want, fmt.Errorf("%w: resizePolicy for %s is RestartContainer, but %s is a bare cgroup with no runtime to restart it; use NotRequired or target the container through the runtime",
				intent.ErrInvalid, res, c.key)
		}
	}
	return want, nil
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
// in place of c's.
func (a *Agent) podMembersLocked(c *container, want intent.Resources) []intent.Resources {
	all := []intent.Resources{want}
	for _, o := range a.containers {
		if o != c && o.pod == c.pod {
			all = append(all, o.res)
		}
	}
	return all
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
		a.setLocked(r, intent.Deferred, intent.ReasonDeferred, d.Message)
		if first && a.metrics != nil {
			a.metrics.Resizes.WithLabelValues("deferred").Inc()
			a.log.Info("intent deferred", "intent", r.ID, "container", c.name, "message", d.Message)
		}
		return want, false
	}
	c.pending = nil
	r.Status.Attempts++
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
	old := c.res
	cpu := c.cpu || r.change.Touches(corev1.ResourceCPU)
	mem := c.mem || r.change.Touches(corev1.ResourceMemory)
	ctr := level{path: c.key, want: want.Cgroup(a.period, cpu, mem)}
	var pod *level
	if c.pod != "" {
		pcpu, pmem := cpu, mem
		for _, o := range a.containers {
			if o != c && o.pod == c.pod {
				pcpu, pmem = pcpu || o.cpu, pmem || o.mem
			}
		}
		pod = &level{path: c.pod, want: podResources(a.podMembersLocked(c, want), a.period).Cgroup(a.period, pcpu, pmem)}
	}
	a.mu.Unlock()

	state, reason, msg, applied := a.write(c, r, ctr, pod)

	a.mu.Lock()
	defer a.mu.Unlock()
	if state == intent.Completed {
		c.res, c.cpu, c.mem = want, cpu, mem
		r.Status.Applied = applied
	} else {
		a.ledger.Set(c.key, requests(old))
	}
	a.finishLocked(c, r, state, reason, msg)
	// Capacity freed, by a shrink or by handing back a reservation that
	// was not used: give Deferred intents their chance.
	now := requests(c.res)
	reserved := requests(want)
	if now.MilliCPU < max(reserved.MilliCPU, requests(old).MilliCPU) || now.Memory < max(reserved.Memory, requests(old).Memory) {
		a.retryDeferredLocked()
	}
}

// write does the cgroup part of apply and says how it ended.
func (a *Agent) write(c *container, r *record, ctr level, pod *level) (intent.State, string, string, map[string][]cgroup.Value) {
	var err error
	if ctr.cur, err = a.cg.Read(c.key); err != nil {
		return a.readFailed(c.key, err)
	}
	if pod != nil {
		if pod.cur, err = a.cg.Read(pod.path); err != nil {
			return a.readFailed(pod.path, err)
		}
	}
	if !r.Spec.AllowMemoryBelowUsage {
		for _, l := range []*level{&ctr, pod} {
			if l == nil || l.want.MemoryMax == nil || *l.want.MemoryMax == cgroup.Unlimited {
				continue
			}
			if lim := *l.want.MemoryMax; lim < l.cur.MemoryCurrent && lim < memLimit(l.cur.MemoryMax) {
				return intent.Failed, intent.ReasonMemoryBelowUsage, fmt.Sprintf(
					"memory limit %s is below the current usage %s of %s; refusing, since the kernel would have to reclaim and might OOM-kill the container (set allowMemoryBelowUsage to force)",
					intent.FormatMemory(lim), intent.FormatMemory(l.cur.MemoryCurrent), l.path), nil
			}
		}
	}
	steps := plan(ctr, pod, a.cg.PageSize())
	if len(steps) == 0 {
		return intent.Completed, intent.ReasonNoChange, "cgroup already holds the requested values", nil
	}
	applied := map[string][]cgroup.Value{}
	for i, s := range steps {
		err := a.cg.Write(s.path, s.resource)
		a.countWrite(s.resource, err)
		if err != nil {
			rb := a.rollback(steps[:i])
			a.log.Warn("cgroup write failed", "intent", r.ID, "cgroup", s.path, "values", s.resource.Values(), "err", err, "rollback", rb)
			msg := fmt.Sprintf("writing %s: %v", s.path, err)
			if rb != nil {
				msg += "; rollback: " + rb.Error()
			} else if i > 0 {
				msg += fmt.Sprintf("; the %d file(s) written before were restored", i)
			}
			return intent.Failed, intent.ReasonWriteFailed, msg, nil
		}
		applied[s.path] = append(applied[s.path], s.resource.Values()...)
	}
	return intent.Completed, intent.ReasonApplied, fmt.Sprintf("%d cgroup file(s) written and verified", len(steps)), applied
}

func (a *Agent) readFailed(path string, err error) (intent.State, string, string, map[string][]cgroup.Value) {
	reason := intent.ReasonWriteFailed
	if errors.Is(err, cgroup.ErrNotFound) {
		reason = intent.ReasonContainerGone
	}
	return intent.Failed, reason, fmt.Sprintf("reading %s: %v", path, err), nil
}

func (a *Agent) rollback(done []step) error {
	var errs []error
	for _, s := range slices.Backward(done) {
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
	a.hub.publish(Event{"MODIFIED", r.Intent})
}

// finishLocked puts r in a terminal state and records its metrics.
func (a *Agent) finishLocked(c *container, r *record, s intent.State, reason, msg string) {
	if c.pending == r {
		c.pending = nil
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

// retryDeferredLocked gives every Deferred intent another try, oldest
// first; the ledger decides, so an older intent that fits goes first.
func (a *Agent) retryDeferredLocked() {
	var ready []*container
	for _, c := range a.containers {
		if c.pending != nil && c.pending.Status.State == intent.Deferred {
			ready = append(ready, c)
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].pending.seq < ready[j].pending.seq })
	for _, c := range ready {
		c.pending.retry = true
		a.kickLocked(c)
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
		if f.match(&r.Intent) && (state == "" || r.Status.State == state) {
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
	for _, id := range a.order {
		r := a.intents[id]
		if f.match(&r.Intent) && (!r.Status.State.Terminal() || f.IntentID != "") {
			initial = append(initial, Event{"ADDED", r.Intent})
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

// ContainerInfo is what the agent knows of a managed container.
type ContainerInfo struct {
	Name          string             `json:"name"`
	CgroupPath    string             `json:"cgroupPath"`
	PodCgroupPath string             `json:"podCgroupPath,omitempty"`
	Resources     intent.Resources   `json:"resources"`
	ManagesCPU    bool               `json:"managesCPU"`    // an intent declared cpu
	ManagesMemory bool               `json:"managesMemory"` // an intent declared memory
	Allocated     admission.Capacity `json:"allocated"`
	Cgroup        *CgroupValues      `json:"cgroup,omitempty"`
	CgroupError   string             `json:"cgroupError,omitempty"`
	PendingIntent string             `json:"pendingIntent,omitempty"`
	LastIntent    string             `json:"lastIntent,omitempty"`
	QOSClass      corev1.PodQOSClass `json:"qosClass"`
}

// CgroupValues are the live values of a container's cgroup files.
type CgroupValues struct {
	CPUMax        string `json:"cpuMax"`
	CPUWeight     uint64 `json:"cpuWeight"`
	MemoryMax     string `json:"memoryMax"`
	MemoryCurrent int64  `json:"memoryCurrent"`
}

// Containers lists the managed containers with their live cgroup values.
func (a *Agent) Containers() []ContainerInfo {
	a.mu.Lock()
	out := make([]ContainerInfo, 0, len(a.containers))
	for _, c := range a.containers {
		ci := ContainerInfo{Name: c.name, CgroupPath: c.key, PodCgroupPath: c.pod, Resources: c.res,
			ManagesCPU: c.cpu, ManagesMemory: c.mem, Allocated: a.ledger.Get(c.key), LastIntent: c.last, QOSClass: intent.QOSClass(c.res)}
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
	}
	return out
}

// Forget stops managing a container (by name or cgroup path), releases what
// it held on the ledger and fails its pending intent.
func (a *Agent) Forget(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.containers {
		if c.name == name || c.key == name {
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
	delete(a.containers, c.key)
	a.ledger.Release(c.key)
	a.log.Info("container forgotten", "container", c.name, "cgroup", c.key, "why", why)
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
		ok, err := a.cg.Exists(c.key)
		if err != nil || ok {
			continue
		}
		a.mu.Lock()
		if cur, still := a.containers[c.key]; still && cur == c && !c.running {
			a.forgetLocked(c, "cgroup "+c.key+" no longer exists")
		}
		a.mu.Unlock()
	}
}

// Run resyncs every interval until ctx ends.
func (a *Agent) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Resync()
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

// NodeInfo is the node's capacity account.
type NodeInfo struct {
	Allocatable admission.Capacity `json:"allocatable"`
	Allocated   admission.Capacity `json:"allocated"`
	Free        admission.Capacity `json:"free"`
}

// Node returns the capacity account.
func (a *Agent) Node() NodeInfo {
	al, used := a.ledger.Allocatable(), a.ledger.Allocated()
	return NodeInfo{al, used, admission.Capacity{MilliCPU: al.MilliCPU - used.MilliCPU, Memory: al.Memory - used.Memory}}
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
