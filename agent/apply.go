package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cri"
)

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
			// An exit reported after apply's own check but while this worker
			// still ran was only recorded (see handleExit): act on it now, or
			// the capacity stays held until the next resync.
			if c.exited != "" && c.exited == c.cgroup && !a.closing {
				a.exitSeenLocked(c)
			}
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
		a.deferred[c] = struct{}{}
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
	// Not journaled here: recovery applies a Proposed intent again just as
	// an InProgress one (the writes are idempotent and verified), so the
	// record bought nothing for a write, and encoding and writing it was
	// a tenth of a resize's time in the agent (issue 16). What recovery
	// must undo, a shrink's lowered memory.high, is journaled before it
	// is done (journalInProgress), and a restart likewise (markRestarting).
	a.changeLocked(r, intent.InProgress, "", "")
	return want, true
}

func reasonOf(err error) string {
	if msg := err.Error(); strings.Contains(msg, intent.ReasonQoSChange) {
		return intent.ReasonQoSChange
	}
	return intent.ReasonInvalid
}

// apply has the actuator write want to c's cgroups and finishes r. It runs
// without the lock; c's worker is the only one touching c's cgroups, and
// the pod's resize lock makes its siblings wait from their sums to their
// commits, so that the pod cgroup ends at the sum of what its members hold.
func (a *Agent) apply(c *container, r *record, want intent.Resources) {
	a.mu.Lock()
	pd, podUID, rid := c.pod, c.podUID, c.runtimeID
	a.mu.Unlock()
	if pd != nil {
		pd.resize.Lock()
		defer pd.resize.Unlock()
	}
	reported := a.reportedFor(rid, r.Spec)

	var (
		old             intent.Resources
		runtimeID       string
		cpu, mem        bool
		restartedBefore bool
		out             actuate.Result
	)
	for retried := false; ; retried = true {
		listed := a.podListing(pd, podUID)
		a.mu.Lock()
		old, runtimeID = c.res, c.runtimeID
		cpu = c.cpu || r.change.Touches(corev1.ResourceCPU)
		mem = c.mem || r.change.Touches(corev1.ResourceMemory)
		// A restart is not idempotent: an intent that restarted its container
		// before the agent stopped finds the next attempt running and is applied
		// to it in place, verified like any other.
		restartedBefore = r.restarting != "" && r.restarting != runtimeID
		job := actuate.Job{
			Want: want, Old: old, CPU: cpu, Memory: mem, RuntimeID: runtimeID, KubeletMemoryHigh: c.kubeletHigh,
			Restart:               runtimeID != "" && a.restartNeeded(r.Spec, old, want, reported, runtimeID == rid, c.mem) && !restartedBefore,
			AllowMemoryBelowUsage: r.Spec.AllowMemoryBelowUsage,
			Container:             actuate.Level{Path: c.cgroup, Want: a.act.ContainerFiles(c.cgroup, want, cpu, mem)},
			BeforeRestart:         func() error { return a.markRestarting(r, runtimeID) },
			BeforeShrink:          func() error { return a.journalInProgress(r) },
		}
		if pd != nil {
			job.Pod = &actuate.Level{Path: pd.cgroup, Want: a.act.PodFiles(pd.cgroup, podUID, pd.sizing(c, want, cpu, mem), listed)}
		}
		a.mu.Unlock()

		out = a.act.Do(a.ctx, job)
		logActuation(a.log, r.ID, out)
		if retried || out.State != intent.Failed || out.Reason != intent.ReasonContainerGone || out.Restarted != nil || !a.replaced(c, runtimeID) {
			break
		}
	}
	observePhases(a.metrics, r, out)

	a.mu.Lock()
	defer a.mu.Unlock()
	msg := out.Message
	if out.State == intent.Completed {
		c.res, c.cpu, c.mem = want, cpu, mem
		r.Status.Applied = out.Applied
		r.Status.Via = out.Via
	} else {
		a.ledger.Set(c.key, requests(old))
		// What the agent knew of the container and its pod may be what
		// failed: ask the runtime again next time.
		c.ctr = nil
		c.pod.staleListing()
	}
	if restartedBefore {
		r.Status.Restarted, r.Status.ContainerID = true, c.runtimeID
		if out.State == intent.Completed {
			msg = fmt.Sprintf("container %s was restarted as %s before the agent stopped; %s", r.restarting, c.runtimeID, msg)
		}
	}
	if out.Restarted != nil {
		// Restarted, whatever else happened: follow the new container.
		old := c.cgroup
		c.runtimeID, c.cgroup = out.Restarted.ID, out.Cgroup
		a.exits.follow(c, old)
		ct := *out.Restarted
		c.ctr = &ct
		c.pod.staleListing()
		r.Status.Restarted, r.Status.ContainerID = true, out.Restarted.ID
		r.Status.Via = "restart"
	}
	a.finishLocked(c, r, out.State, out.Reason, msg)
	// Capacity freed, by a shrink or by handing back a reservation that
	// was not used: give Deferred intents their chance.
	now := requests(c.res)
	reserved := requests(want)
	if now.MilliCPU < max(reserved.MilliCPU, requests(old).MilliCPU) || now.Memory < max(reserved.Memory, requests(old).Memory) {
		a.retryDeferredLocked()
	}
	if c.exited != "" && c.exited == c.cgroup && c.pending == nil && c.admitted == nil {
		a.exitSeenLocked(c)
	}
}

// reportedFor asks the runtime what it reports for container id's
// resources, when spec has a RestartContainer policy to judge by it; nil
// when there is nothing to judge or the runtime cannot say.
func (a *Agent) reportedFor(id string, spec intent.Spec) *cri.Resources {
	pol, _ := intent.Policies(spec.ResizePolicy)
	if id == "" || a.rt == nil || (pol[corev1.ResourceCPU] != corev1.RestartContainer && pol[corev1.ResourceMemory] != corev1.RestartContainer) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ct, err := a.rt.Get(ctx, id)
	if err != nil || ct.Resources == (cri.Resources{}) {
		if err != nil {
			a.log.Warn("cannot read the container's resources from the runtime; the restart is judged by the agent's record", "container", id, "err", err)
		}
		return nil
	}
	return &ct.Resources
}

// restartNeeded reports whether a resource whose policy is RestartContainer
// really changes, judged as the kubelet judges it
// (computePodResizeAction): against what the runtime reports for the
// container (actuate.RuntimeDiffers), and, when it cannot say (or said it
// of another container: current false), against the agent's record. The
// memory request never reaches the runtime: like the kubelet, which keeps
// it in its checkpoint, the agent judges it by its record, when an intent
// declared it before (memDeclared); a first intent's memory request is
// not a change.
func (a *Agent) restartNeeded(spec intent.Spec, old, want intent.Resources, reported *cri.Resources, current, memDeclared bool) bool {
	if reported == nil || !current {
		return needsRestart(spec, old, want)
	}
	pol, _ := intent.Policies(spec.ResizePolicy)
	cpu, mem := actuate.RuntimeDiffers(*reported, want, a.period)
	mem = mem || (memDeclared && old.MemoryRequest != want.MemoryRequest)
	return (pol[corev1.ResourceCPU] == corev1.RestartContainer && cpu) || (pol[corev1.ResourceMemory] == corev1.RestartContainer && mem)
}

// podListing is what the runtime last listed of the pod's containers, for
// the pod cgroup's sums. It lists again only when that may be stale
// (pod.listedOK), or when the pod has containers the agent does not
// manage whose cgroups may have changed since (pod.marks): their resources
// change behind its back (the kubelet resizes them), and the pod cgroup
// must leave them room. A pod whose containers are all managed is summed
// from the agent's own records. Called with the pod's resize lock held.
func (a *Agent) podListing(pd *pod, podUID string) []cri.Container {
	if pd == nil {
		return nil
	}
	a.mu.Lock()
	listed, ok, marks := pd.listed, pd.listedOK, pd.marks
	others := len(pd.others) > 0
	// The hook's map forgets the cgroups written least recently: a sibling
	// it forgot and that was written since would keep its mark, so the
	// marks are trusted for a drift sweep's period, as the drift check
	// trusts them.
	if a.now().Sub(pd.markedAt) >= a.drift.sweepOr() {
		marks = nil
	}
	var members []string
	for _, o := range pd.members {
		members = append(members, o.cgroup)
	}
	a.mu.Unlock()
	if ok && (!others || a.podUnchanged(pd.cgroup, marks, members)) {
		return listed
	}
	// The marks before the listing: a write between the two only lists
	// again next time.
	markedAt := a.now()
	marks = a.podMarks(pd.cgroup)
	listed = podContainers(context.Background(), a.act, a.log, podUID)
	a.mu.Lock()
	pd.setListing(listed)
	if listed != nil {
		pd.marks, pd.markedAt = marks, markedAt
	}
	a.mu.Unlock()
	return listed
}

// childLister is a Cgroups that lists a cgroup's children
// (*cgroup.Manager does).
type childLister interface {
	Children(path string) ([]string, error)
}

// podMarks are the limit-write marks of the pod cgroup's children; nil
// when they cannot all be had (no eBPF hook, a child it cannot name).
func (a *Agent) podMarks(podCgroup string) map[string]pressure.WriteMark {
	cl, ok := a.cg.(childLister)
	if !ok || a.drift.writes == nil {
		return nil
	}
	children, err := cl.Children(podCgroup)
	if err != nil {
		return nil
	}
	marks := make(map[string]pressure.WriteMark, len(children))
	for _, ch := range children {
		m, ok := a.drift.writes.LimitWriteMark(ch)
		if !ok {
			return nil
		}
		marks[ch] = m
	}
	return marks
}

// podUnchanged reports whether the pod cgroup has the children it had
// when marks were taken, and those that are not members' cgroups hold the
// same marks (the members' are the agent's own writes).
func (a *Agent) podUnchanged(podCgroup string, marks map[string]pressure.WriteMark, members []string) bool {
	if marks == nil {
		return false
	}
	cl, ok := a.cg.(childLister)
	if !ok {
		return false
	}
	children, err := cl.Children(podCgroup)
	if err != nil || len(children) != len(marks) {
		return false
	}
	for _, ch := range children {
		was, ok := marks[ch]
		if !ok {
			return false
		}
		if slices.Contains(members, ch) {
			continue
		}
		if m, ok := a.drift.writes.LimitWriteMark(ch); !ok || m != was {
			return false
		}
	}
	return true
}

// replaced reports whether the runtime runs another container in place of
// c's runtimeID, which a resize just found gone, and if so follows it: the
// agent resolves a known container from its own record (known), so a
// container restarted behind its back, before the exit watcher or a
// resync told it, is found here and the resize tried again on it.
func (a *Agent) replaced(c *container, runtimeID string) bool {
	a.mu.Lock()
	podUID, name := c.podUID, c.name
	a.mu.Unlock()
	if podUID == "" || a.rt == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(a.ctx, 15*time.Second)
	defer cancel()
	ct, err := a.rt.Find(ctx, podUID, name)
	if err != nil || !ct.Running() || ct.ID == runtimeID {
		return false
	}
	p, err := a.cg.PathOf(ct.PID)
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.containers[c.key] != c || c.runtimeID != runtimeID {
		return false
	}
	old := c.cgroup
	c.runtimeID, c.cgroup, c.ctr = ct.ID, p, &ct
	a.exits.follow(c, old)
	c.pod.staleListing()
	a.log.Info("container restarted by its runtime; following the new one", "container", c.name, "runtimeID", c.runtimeID, "cgroup", c.cgroup)
	return true
}

// podContainers lists a pod's running containers for the pod cgroup's sum;
// when the runtime cannot say, the sum follows the managed containers only.
func podContainers(ctx context.Context, act *actuate.Actuator, log *slog.Logger, podUID string) []cri.Container {
	ctrs, err := act.PodContainers(ctx, podUID)
	if err != nil {
		log.Warn("cannot list the pod's containers; the pod cgroup follows the managed containers only", "podUID", podUID, "err", err)
		return nil
	}
	return ctrs
}

// logActuation logs what the actuator reports beyond the intent's status:
// a failed step and its rollback, and a memory shrink.
func logActuation(log *slog.Logger, id string, out actuate.Result) {
	if s := out.Step; s != nil {
		log.Warn("resize step failed", "intent", id, "cgroup", s.Path, "values", s.Values, "err", s.Err, "rollback", s.Rollback)
	}
	if rc := out.Reclaim; rc != nil {
		if rc.RestoreErr != nil {
			log.Warn("restoring memory.high after a shrink failed", "intent", id, "err", rc.RestoreErr)
		}
		log.Info("memory shrink", "intent", id, "state", out.State, "reclaim", strings.Join(rc.Reclaimed, "; "), "restore", strings.Join(rc.Restored, "; "))
	}
}

// observePhases records the phases of an applied intent.
func observePhases(m *metrics.Metrics, r *record, out actuate.Result) {
	if m == nil {
		return
	}
	outcome := strings.ToLower(string(out.State))
	h := m.ResizePhase
	h.WithLabelValues("admission", outcome).Observe(r.started.Sub(r.Status.AcceptedAt).Seconds())
	h.WithLabelValues("reclaim", outcome).Observe(out.Took.Reclaim.Seconds())
	h.WithLabelValues("runtime", outcome).Observe(out.Took.Runtime.Seconds())
	h.WithLabelValues("verify", outcome).Observe(out.Took.Verify.Seconds())
}

// setLocked changes r's state, tells the watchers and journals it.
func (a *Agent) setLocked(r *record, s intent.State, reason, msg string) {
	a.changeLocked(r, s, reason, msg)
	a.journalLocked(r)
}

// changeLocked is setLocked without the journal.
func (a *Agent) changeLocked(r *record, s intent.State, reason, msg string) {
	r.Status.State, r.Status.Reason, r.Status.Message = s, reason, msg
	r.Status.UpdatedAt = a.now()
	a.hub.publish(Event{Type: "MODIFIED", Intent: r.Intent})
}

// finishLocked puts r in a terminal state and records its metrics. The
// metrics come first: a client that saw the outcome and then scraped the
// agent found the resize not yet counted.
func (a *Agent) finishLocked(c *container, r *record, s intent.State, reason, msg string) {
	if c.pending == r {
		c.pending = nil
	}
	if r.recovered {
		msg += " (queued again after an agent restart)"
	}
	now := a.now()
	r.Status.CompletedAt = &now
	outcome := strings.ToLower(string(s))
	if a.metrics != nil {
		a.metrics.Resizes.WithLabelValues(outcome).Inc()
		d := now.Sub(r.Status.AcceptedAt).Seconds()
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if r.change.Touches(res) {
				a.metrics.ResizeDuration.WithLabelValues(string(res), outcome).Observe(d)
			}
		}
	}
	addInFlight(a.metrics, -1)
	a.setLocked(r, s, reason, msg)
	c.last = r.ID
	level := slog.LevelInfo
	if s != intent.Completed {
		level = slog.LevelWarn
	}
	a.log.Log(context.Background(), level, "intent "+outcome, "intent", r.ID, "container", c.name,
		"cgroup", c.cgroup, "resources", describe(r.change),
		"reason", reason, "message", msg, "duration", now.Sub(r.Status.AcceptedAt))
}

// addInFlight counts intents accepted and not yet terminal.
func addInFlight(m *metrics.Metrics, delta float64) {
	if m != nil {
		m.InFlight.Add(delta)
	}
}
