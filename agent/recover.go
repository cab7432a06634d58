package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
)

// Journal makes intents durable; *journal.Journal implements it. Append
// keeps the order of the records appended; Wait returns once a record is
// on disk; Records is what was on disk when the journal was opened.
type Journal interface {
	Append(journal.Record) journal.Ticket
	Wait(journal.Ticket) error
	Records() []journal.Record
}

// WithJournal makes the agent journal every intent before it acknowledges
// it, and every change of state after; Recover replays the journal.
func WithJournal(j Journal) Option { return func(a *Agent) { a.journal = j } }

// Recovery says what Recover found.
type Recovery struct {
	Intents    int // intents in the journal
	Requeued   int // not terminal at the crash: queued again
	Failed     int // not terminal, but their container could not be found again
	Containers int // containers given back their last Completed resources
	Took       time.Duration
}

// Recover replays the journal: every container gets back the resources of
// its last Completed intent (and the ledger accounts them), and every
// intent not in a terminal state is queued again in its original order,
// with its ID and acceptance time. An intent that was InProgress (a
// shrink's: a plain write is not journaled InProgress, see admitLocked) is
// applied again, before Recover returns and before anything queued behind
// it (the writes are idempotent and verified). Targets are
// resolved again, since a container may have a new cgroup; an intent whose
// container is gone ends Failed (ContainerGone). Call it once, after New
// and before the agent takes intents.
func (a *Agent) Recover() (Recovery, error) {
	var out Recovery
	if a.journal == nil {
		return out, nil
	}
	start := time.Now()
	recs := a.journal.Records()
	out.Intents = len(recs)

	// Where each container is now, found without the lock: the runtime may
	// be slow.
	type found struct {
		t   intent.Target
		res resolved
		err error
	}
	where := map[string]*found{}
	lastCompleted := map[string]*journal.Record{}
	newest := map[string]*journal.Record{}
	for i := range recs {
		jr := &recs[i]
		if jr.Forget() {
			// Forgotten since: it comes back only with a later intent.
			delete(lastCompleted, jr.Container)
			continue
		}
		newest[jr.Container] = jr // recs are in acceptance order
		done := jr.Intent.Status.State.Terminal()
		if jr.Intent.Status.State == intent.Completed && jr.Resources != nil {
			lastCompleted[jr.Container] = jr
		} else if done {
			continue
		}
		if where[jr.Container] == nil {
			f := &found{t: jr.Intent.Spec.Target}
			f.res, f.err = a.resolve(f.t)
			where[jr.Container] = f
		}
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	type queued struct {
		c *container
		r *record
	}
	var resumed []*container
	var rest []queued
	containerOf := func(key string) (*container, error) {
		f := where[key]
		if f.err != nil {
			return nil, f.err
		}
		if c := a.containers[f.res.key]; c != nil {
			return c, nil
		}
		return a.containerLocked(f.t, f.res)
	}
	for key, jr := range lastCompleted {
		c, err := containerOf(key)
		if err != nil {
			a.log.Info("journal: container gone since the agent stopped", "container", key, "err", err)
			continue
		}
		c.res, c.cpu, c.mem, c.last = jr.Resources.Resources, jr.Resources.CPU, jr.Resources.Memory, jr.Intent.ID
		a.ledger.Set(c.key, requests(c.res))
		out.Containers++
	}
	for _, jr := range recs {
		// A Forget marker took a sequence number too: handing it out again
		// would tie a new intent with the marker (issue 15, finding 3).
		a.seq = max(a.seq, jr.Seq)
		if jr.Forget() {
			continue
		}
		r := &record{Intent: jr.Intent, seq: jr.Seq, key: jr.Container, restarting: jr.Restarting}
		// One copy of each resources section, as for a submission: the
		// decoded maps of a full history were a fifth of the heap under
		// issue 15's load.
		r.Spec.Resources, r.shared = a.specs.intern(r.Spec.Resources)
		if r.Origin == "" {
			r.Origin = legacyOrigin(r.ID)
		}
		if _, dup := a.hist.intents[r.ID]; dup {
			continue
		}
		a.hist.intents[r.ID] = r
		a.hist.order = append(a.hist.order, r.ID)
		if r.Status.State.Terminal() {
			continue
		}
		addInFlight(a.metrics, 1)
		_, change, err := intent.Validate(r.Spec)
		r.change = change
		var c *container
		if err == nil {
			c, err = containerOf(jr.Container)
		}
		if err != nil {
			out.Failed++
			a.finishLocked(&container{name: r.Spec.Target.Name}, r, intent.Failed, recoveryReason(err),
				"after an agent restart, the intent could not be queued again: "+err.Error())
			continue
		}
		r.key, r.recovered = c.key, true
		if n := newest[jr.Container]; n.Seq > r.seq && n.Intent.Status.State.Terminal() && n.Intent.Status.Reason != intent.ReasonShutdown && r.Status.State != intent.InProgress {
			// A newer intent for the container came back from its journal
			// write first and went ahead: this one was superseded then,
			// but the crash came before that was on disk. One that the
			// agent's shutdown refused as it was journaled went nowhere:
			// an intent before it may have been being written (a plain
			// write is not journaled InProgress), and is applied again.
			r.Status.SupersededBy = n.Intent.ID
			a.finishLocked(c, r, intent.Superseded, intent.ReasonSuperseded, "superseded by intent "+n.Intent.ID+" for the same container")
			continue
		}
		out.Requeued++
		if jr.Intent.Status.State == intent.InProgress && !slices.ContainsFunc(rest, func(q queued) bool { return q.c == c }) && !slices.Contains(resumed, c) {
			// It was being written: it goes first, alone, as it would have
			// finished before anything queued behind it.
			a.setLocked(r, intent.Proposed, "", "was InProgress when the agent stopped; applying it again")
			c.pending, c.newest = r, r
			resumed = append(resumed, c)
			continue
		}
		rest = append(rest, queued{c, r})
	}
	if len(resumed) > 0 {
		for _, c := range resumed {
			for _, p := range []string{c.cgroup, c.podPath()} {
				if p != "" {
					to := int64(cgroup.Unlimited)
					if p == c.cgroup {
						to = a.recordedMemoryHigh(c)
					}
					releaseMemoryHigh(a.act, a.log, p, to)
				}
			}
			a.kickLocked(c)
		}
		// Nothing else runs yet: the workers are those just kicked, and
		// each stops once its container has nothing pending.
		a.mu.Unlock()
		a.workers.Wait()
		a.mu.Lock()
	}
	for _, q := range rest {
		c, r := q.c, q.r
		if r.Status.State == intent.Deferred {
			r.retry = true // the node may have room now
		} else {
			a.setLocked(r, intent.Proposed, "", fmt.Sprintf("queued again after an agent restart (was %s)", r.Status.State))
		}
		if old := c.pending; old != nil {
			old.Status.SupersededBy = r.ID
			a.finishLocked(c, old, intent.Superseded, intent.ReasonSuperseded, "superseded by intent "+r.ID+" for the same container")
		}
		c.pending, c.newest = r, r
	}
	for _, c := range a.containers {
		if c.pending != nil {
			a.kickLocked(c)
		}
	}
	a.hist.evict(a.history)
	out.Took = time.Since(start)
	a.log.Info("journal replayed", "intents", out.Intents, "requeued", out.Requeued, "failed", out.Failed,
		"containers", out.Containers, "took", out.Took)
	return out, nil
}

// legacyOrigin is the origin of an intent journaled before intents carried
// one: then only its ID told, by the prefixes the Kubernetes intake
// (kube.IDPrefix) and the drift check (DriftIntentPrefix) give their IDs.
func legacyOrigin(id string) intent.Origin {
	switch {
	case strings.HasPrefix(id, "k8s."):
		return intent.OriginKubernetes
	case strings.HasPrefix(id, DriftIntentPrefix):
		return intent.OriginDrift
	}
	return intent.OriginAPI
}

func recoveryReason(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return intent.ReasonContainerGone
	case errors.Is(err, ErrRuntime):
		return intent.ReasonRuntimeFailed
	}
	return reasonOf(err)
}

// journalLocked appends r as it is now. It does not wait: the journal
// keeps the order, and only acceptance must be on disk before it is
// acknowledged.
func (a *Agent) journalLocked(r *record) {
	if a.journal == nil {
		return
	}
	if r.key == "" {
		r.key = a.containers.keyOf(r.Spec.Target)
	}
	jr := journal.Record{Seq: r.seq, Container: r.key, Intent: r.Intent, Restarting: r.restarting}
	if c := a.containers[r.key]; c != nil && r.Status.State == intent.Completed {
		jr.Resources = &journal.Resources{Resources: c.res, CPU: c.cpu, Memory: c.mem}
	}
	a.journal.Append(jr)
}

// journalInProgress puts on disk that r is being applied, before a shrink
// lowers memory.high: recovery from a crash in the middle puts memory.high
// back for an intent that was InProgress. Without the record on disk, the
// shrink does not begin.
func (a *Agent) journalInProgress(r *record) error {
	if a.journal == nil {
		return nil
	}
	a.mu.Lock()
	t := a.journal.Append(journal.Record{Seq: r.seq, Container: r.key, Intent: r.Intent, Restarting: r.restarting})
	a.mu.Unlock()
	if err := a.journal.Wait(t); err != nil {
		return fmt.Errorf("%w: %w", ErrJournal, err)
	}
	return nil
}

// markRestarting puts on disk, before the restart begins, that r restarts
// its container runtimeID, so that recovery from a crash mid-restart can
// tell whether the restart happened (the container has a new ID) and not
// restart it twice. Without the record on disk, the restart does not begin.
func (a *Agent) markRestarting(r *record, runtimeID string) error {
	if a.journal == nil {
		return nil
	}
	a.mu.Lock()
	r.restarting = runtimeID
	t := a.journal.Append(journal.Record{Seq: r.seq, Container: r.key, Intent: r.Intent, Restarting: runtimeID})
	a.mu.Unlock()
	if err := a.journal.Wait(t); err != nil {
		return fmt.Errorf("%w: %w", ErrJournal, err)
	}
	return nil
}

// journalAcceptLocked puts r on disk before it is acknowledged. It drops
// the lock while it waits, so that concurrent submissions share a sync.
func (a *Agent) journalAcceptLocked(c *container, r *record) error {
	r.key = c.key
	r.ticket = a.journal.Append(journal.Record{Seq: r.seq, Container: r.key, Intent: r.Intent})
	a.accepting[r.ID] = r
	a.mu.Unlock()
	err := a.journal.Wait(r.ticket)
	a.mu.Lock()
	delete(a.accepting, r.ID)
	if err != nil {
		a.log.Error("journal: intent not accepted", "intent", r.ID, "container", c.name, "err", err)
		return fmt.Errorf("%w: intent not accepted: %w", ErrJournal, err)
	}
	return nil
}

// awaitAcceptLocked answers a retry of an intent still being journaled
// once it is on disk.
func (a *Agent) awaitAcceptLocked(r *record) (intent.Intent, bool, error) {
	a.mu.Unlock()
	err := a.journal.Wait(r.ticket)
	a.mu.Lock()
	if err != nil {
		return intent.Intent{}, false, fmt.Errorf("%w: intent not accepted: %w", ErrJournal, err)
	}
	if cur, ok := a.hist.intents[r.ID]; ok {
		return cur.Intent, false, nil
	}
	return r.Intent, false, nil
}

// acceptLocked makes r, journaled if there is a journal, c's next intent.
// With a journal, submissions for the same container can come back from
// their sync out of order: an intent older than one already accepted is
// superseded by it at once, as it would have been in order.
func (a *Agent) acceptLocked(c *container, r *record) {
	a.hist.add(r)
	addInFlight(a.metrics, 1)
	a.hub.publish(Event{Type: "ADDED", Intent: r.Intent})
	// At debug: the line of its outcome (finishLocked) says the same, and
	// under TCG a second line per intent was a twelfth of a resize's time
	// in the agent (issue 16).
	a.log.Debug("intent accepted", "intent", r.ID, "container", c.name, "cgroup", c.cgroup, "resources", describe(r.change))
	switch {
	case a.containers[c.key] != c:
		a.finishLocked(c, r, intent.Failed, intent.ReasonContainerGone, "the container stopped being managed while the intent was being journaled")
	case a.closing:
		a.finishLocked(c, r, intent.Failed, intent.ReasonShutdown, "the agent began shutting down while the intent was being journaled")
	case c.newest != nil && c.newest.seq > r.seq:
		r.Status.SupersededBy = c.newest.ID
		a.finishLocked(c, r, intent.Superseded, intent.ReasonSuperseded, "superseded by intent "+c.newest.ID+" for the same container")
	default:
		if old := c.pending; old != nil {
			old.Status.SupersededBy = r.ID
			a.finishLocked(c, old, intent.Superseded, intent.ReasonSuperseded, "superseded by intent "+r.ID+" for the same container")
		}
		c.pending, c.newest = r, r
		a.kickLocked(c)
	}
	a.hist.evict(a.history)
}

// recordedMemoryHigh is the memory.high a container's cgroup holds outside
// a shrink: the kubelet's MemoryQoS value as the runtime records it (the
// kubelet's, or the agent's last update's for the kubelet's formula), and
// max when the runtime records none, or "max", or cannot say.
func (a *Agent) recordedMemoryHigh(c *container) int64 {
	if a.rt == nil || c.runtimeID == "" {
		return cgroup.Unlimited
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ct, err := a.rt.Get(ctx, c.runtimeID)
	if err != nil || ct.Resources.MemoryHigh <= 0 {
		return cgroup.Unlimited
	}
	c.kubeletHigh = true
	return ct.Resources.MemoryHigh
}

// releaseMemoryHigh puts memory.high of a cgroup whose intent was being
// applied at the crash back to to (see actuate.Actuator.ReleaseMemoryHigh).
func releaseMemoryHigh(act *actuate.Actuator, log *slog.Logger, p string, to int64) {
	was, err := act.ReleaseMemoryHigh(p, to)
	switch {
	case err != nil:
		log.Warn("journal: cannot restore memory.high left by an interrupted shrink", "cgroup", p, "err", err)
	case was != to:
		log.Info("journal: memory.high left lowered by an interrupted shrink restored", "cgroup", p, "was", was, "memoryHigh", spec.FormatMax(to))
	}
}

// journalForgetLocked records that c is no longer managed, so that a
// restart does not bring back what its last intent gave it.
func (a *Agent) journalForgetLocked(c *container) {
	if a.journal == nil {
		return
	}
	a.seq++
	a.journal.Append(journal.ForgetRecord(a.seq, c.key))
}
