package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

const (
	// DriftReport only reports: metric, log, the container listing.
	DriftReport DriftPolicy = "report"
	// DriftRestore writes the agent's values back, through an internal
	// intent (origin drift, ID prefix DriftIntentPrefix) serialized with the container's
	// other intents and applied like them (through the runtime for a
	// runtime's container).
	DriftRestore DriftPolicy = "restore"
	// DriftAdopt takes the limits found in the files as the container's
	// resources, when that keeps its QoS class and fits the node.
	DriftAdopt DriftPolicy = "adopt"
	// DriftOff turns the check off.
	DriftOff DriftPolicy = "off"
)

// ParseDriftPolicy checks a policy name.
func ParseDriftPolicy(s string) (DriftPolicy, error) {
	switch p := DriftPolicy(s); p {
	case DriftReport, DriftRestore, DriftAdopt, DriftOff:
		return p, nil
	}
	return "", fmt.Errorf("drift policy %q is not report, restore, adopt or off", s)
}

// DriftIntentPrefix starts the ID of the intents the agent makes itself to
// restore or adopt drifted values.
const DriftIntentPrefix = "drift-"

// ReasonDriftAdopted is the reason of the (Completed) intent that records
// an adoption.
const ReasonDriftAdopted = "DriftAdopted"

// Actions, as in the action label of resize_agent_drift_total and in
// DriftInfo.Action.
const (
	DriftActionReport  = "report"  // reported only
	DriftActionRestore = "restore" // a restore intent was made
	DriftActionAdopt   = "adopt"   // the found values became the container's resources
	DriftActionRefuse  = "refuse"  // adoption refused (QoS, capacity, not expressible)
	DriftActionBackoff = "backoff" // another writer keeps undoing the restores: no restore for a while
)

// WithDriftLeavePods leaves the containers of Kubernetes pods (those with
// a pod UID) out of DriftCheck: in Kubernetes mode their reference is what
// the kubelet allocated and actuated, which agent/kube/allocdrift checks;
// the agent's own last intent would undo a kubelet resize.
func WithDriftLeavePods() Option { return func(a *Agent) { a.drift.leavePods = true } }

// WithDriftPolicy sets what DriftCheck does about drift (default restore).
func WithDriftPolicy(p DriftPolicy) Option { return func(a *Agent) { a.drift.policy = p } }

// WithDriftBackoff sets the flapping guard: when drift comes back after
// restores restores within window, the agent stops restoring for window
// (doubling each time the fight resumes, up to 16 windows). RunDrift
// defaults window to ten intervals; restores defaults to 3.
func WithDriftBackoff(window time.Duration, restores int) Option {
	return func(a *Agent) { a.drift.window, a.drift.restores = window, restores }
}

// LimitWrites names the last write to a cgroup's limit files
// (pressure.BPF, where the eBPF hook on cgroup_file_write is attached).
type LimitWrites interface {
	LimitWriteMark(cgroupPath string) (pressure.WriteMark, bool)
}

// anyWrites is a LimitWrites that also stamps the last write to any
// cgroup (pressure.BPF): a check that finds the stamp where the last check
// took it skips every clean container without a lookup (a path walk and
// a map read) each.
type anyWrites interface {
	AnyLimitWriteStamp() (uint64, bool)
}

// WithDriftWrites makes DriftCheck event-driven: a container whose files
// were clean at its last check, and whose cgroup (and pod cgroup) nothing
// has written since, is not read again; every container is still read
// every sweep (default a minute), for the
// writes the hook cannot see (a cgroup the kernel map lost before it was
// ever seen). Reading four files of each idle container every
// interval was the agent's cost at rest on a node of 1,000 (issue 16).
// A resize takes the same marks of its pod's other containers' cgroups, to
// tell whether it must list the pod again (podListing).
func WithDriftWrites(w LimitWrites, sweep time.Duration) Option {
	return func(a *Agent) { a.drift.writes, a.drift.sweep = w, sweep }
}

// DriftResult sums up one DriftCheck.
type DriftResult struct {
	Checked int // containers whose files were read
	// Skipped counts the clean containers not read again: nothing wrote
	// their limit files since they were (WithDriftWrites).
	Skipped int
	Drifted int // containers drifted now
	// Recheck is set while a restore waits to be verified: RunDrift then
	// looks again soon, so that a writer fighting the agent is caught.
	Recheck bool
}

// drifts is the drift policy and state; a.mu guards it.
type drifts struct {
	policy    DriftPolicy
	leavePods bool
	window    time.Duration
	restores  int
	state     map[string]*driftState // by container key
	log       *slog.Logger
	metrics   *metrics.Metrics
	writes    LimitWrites
	sweep     time.Duration
	swept     time.Time // the last check that read every container
	// anyStamp is the last write to any cgroup as the last check found it
	// before its reads (anyOK: it could be read).
	anyStamp uint64
	anyOK    bool
}

// driftState is what the agent remembers of one container's drift.
type driftState struct {
	c      *container
	info   *DriftInfo // nil: the files match
	sig    string     // the found values of info, to report each change once
	seen   string     // c.last when last checked: another intent resets the state
	intent string     // the last drift intent
	verify bool       // a restore was made and not yet checked
	// The flapping guard: restores made within the window, whether the
	// agent has had to back off, for how long and until when.
	restoresAt []time.Time
	contested  bool
	backoff    time.Duration
	until      time.Time
	// clean is set when the last read found the files holding the values,
	// with the write marks taken just before it (WithDriftWrites).
	clean         bool
	mark, podMark pressure.WriteMark
}

// probe is what one container's check reads, snapshotted under the lock.
type probe struct {
	c        *container
	path     string
	want     cgroup.Resources
	pod      string           // "" unless c speaks for its pod
	podWant  cgroup.Resources // what the agent writes to the pod
	podUID   string
	members  []actuate.Member  // the pod's, c first (pod.sizing)
	listed   []cri.Container   // the pod's containers, from the runtime
	last     map[string]string // the last intent of c and its pod's members, by key
	st       cgroup.State      // read without the lock
	files    []DriftFile
	readErr  error
	podSt    *cgroup.State
	podFiles []DriftFile
	// The write marks: the last clean read's (may: it can be skipped on
	// equal marks) and the ones taken before this read (marked: all ok).
	may             bool
	prev, prevPod   pressure.WriteMark
	marked, skipped bool
	mark, podMark   pressure.WriteMark
}

const (
	defaultDriftWindow   = 2 * time.Minute
	defaultDriftRestores = 3
	maxDriftBackoff      = 16 // windows
)

// RunDrift checks for drift every interval until ctx ends, and sooner while
// a restore waits to be verified.
func (a *Agent) RunDrift(ctx context.Context, interval time.Duration) {
	a.mu.Lock()
	if a.drift.policy == DriftOff {
		a.mu.Unlock()
		return
	}
	if a.drift.window == 0 {
		a.drift.window = 10 * interval
	}
	a.mu.Unlock()
	soon := min(max(interval/5, 50*time.Millisecond), 2*time.Second)
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			next := interval
			if a.DriftCheck(ctx).Recheck {
				next = soon
			}
			t.Reset(next)
		}
	}
}

// DriftCheck compares the files of every idle managed container (no intent
// running or queued) with what its last completed intent gave it, and its
// pod's cgroup with what the agent wrote there, and acts on differences by
// the policy. The files are read without the lock; a container whose
// intents moved on meanwhile is left for the next check.
func (a *Agent) DriftCheck(ctx context.Context) DriftResult {
	a.mu.Lock()
	if a.drift.policy == DriftOff {
		a.mu.Unlock()
		return DriftResult{}
	}
	now := a.now()
	w := a.drift.writes
	// Nothing written anywhere since the last check: its clean containers
	// keep their marks, no need to look each up.
	var quiet bool
	var anyStamp uint64
	var anyOK bool
	if aw, ok := w.(anyWrites); ok {
		anyStamp, anyOK = aw.AnyLimitWriteStamp()
		quiet = anyOK && a.drift.anyOK && anyStamp == a.drift.anyStamp
		// Kept for the next check only once this one has looked at every
		// container: one cut short left some unmarked.
		a.drift.anyOK = false
	}
	canSkip := false
	if w != nil {
		if now.Sub(a.drift.swept) >= a.drift.sweepOr() {
			a.drift.swept = now // this check reads everything
			quiet = false
		} else {
			canSkip = true
		}
	}
	var res DriftResult
	probes, skipped := a.drift.probes(a.containers, a.act, canSkip, quiet, a.rt != nil)
	res.Skipped = skipped
	a.mu.Unlock()

	pageSize := a.cg.PageSize()
	for _, p := range probes {
		if ctx.Err() != nil {
			break
		}
		if w != nil {
			p.marks(w)
			if p.skipped {
				continue
			}
		}
		if p.pod != "" {
			// As apply does: the pod cgroup counts the containers of the
			// pod the agent does not manage too.
			if p.podUID != "" && a.rt != nil {
				p.listed = podContainers(ctx, a.act, a.log, p.podUID)
			}
			p.podWant = p.podWantWith(a.act, p.members[0].Resources)
		}
		// The files the agent set only: a sweep of 1,000 containers reads
		// half as many files as with the whole State (issue 16).
		p.st, p.readErr = a.act.ReadFor(p.path, p.want)
		if p.readErr != nil {
			continue // gone or unreadable: Resync and the exit watcher deal with it
		}
		p.files = differ(p.path, p.st, p.want, pageSize)
		if p.pod != "" {
			if ps, err := a.cg.Read(p.pod); err == nil {
				p.podSt = &ps
				p.podFiles = differ(p.pod, ps, p.podWant, pageSize)
			}
		}
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	if anyOK && ctx.Err() == nil {
		a.drift.anyStamp, a.drift.anyOK = anyStamp, true
	}
	for _, p := range probes {
		if pd := a.pods[p.pod]; pd != nil && p.listed != nil {
			// The periodic refresh of what resizes sum the pod with.
			pd.setListing(p.listed)
		}
		if p.skipped {
			res.Skipped++
			continue
		}
		if p.readErr != nil || ctx.Err() != nil || a.closing || !p.unchanged(a.containers[p.c.key]) {
			continue
		}
		res.Checked++
		a.actLocked(p)
		if d := a.drift.state[p.c.key]; d != nil {
			// A clean read with its marks lets the next checks skip it.
			d.clean = p.marked && d.info == nil && !d.verify
			d.mark, d.podMark = p.mark, p.podMark
		}
	}
	for key, d := range a.drift.state {
		if a.containers[key] != d.c {
			delete(a.drift.state, key)
			continue
		}
		if d.info != nil {
			res.Drifted++
		}
		res.Recheck = res.Recheck || d.verify
	}
	if a.metrics != nil {
		a.metrics.DriftedContainers.Set(float64(res.Drifted))
		a.metrics.DriftChecks.WithLabelValues("intent").Inc()
	}
	return res
}

// sweepOr is how often every container is read whatever the marks say.
func (d *drifts) sweepOr() time.Duration {
	if d.sweep > 0 {
		return d.sweep
	}
	return time.Minute
}

// marks takes p's write marks before its files are read, and marks p
// skipped when they are the ones of its last clean read.
func (p *probe) marks(w LimitWrites) {
	var ok, podOK bool
	p.mark, ok = w.LimitWriteMark(p.path)
	podOK = true
	if p.pod != "" {
		p.podMark, podOK = w.LimitWriteMark(p.pod)
	}
	p.marked = ok && podOK
	p.skipped = p.may && p.marked && p.mark == p.prev && (p.pod == "" || p.podMark == p.prevPod)
}

// probes lists what the check reads, in key order: the idle managed
// containers (a pod's cgroup with its speaker, and only when all its
// members are idle), each with what its files (and its pod's) should hold.
// With canSkip, a container clean at its last read with nothing run for it
// since may be skipped on unchanged write marks; on a quiet check (nothing
// written anywhere since) it is skipped at once, without a probe: at rest
// with 1,000 containers, working out every container's files at every
// check was most of its CPU (issue 16). A pod probe that lists its pod's
// containers through the runtime is never skipped: the listing is what its
// pod's expected values follow. Under the agent's lock.
func (d *drifts) probes(containers containers, act *actuate.Actuator, canSkip, quiet, runtime bool) (out []*probe, skipped int) {
	for _, c := range containers {
		if (!c.cpu && !c.mem) || !idle(c) || (d.leavePods && c.podUID != "") {
			continue
		}
		var pod, podUID string
		if pd := c.pod; pd != nil && pd.speaker() == c && pd.idle() {
			pod, podUID = pd.cgroup, c.podUID
		}
		st := d.state[c.key]
		may := canSkip && st != nil && st.c == c && st.clean && st.info == nil && !st.verify && st.seen == c.last &&
			!(pod != "" && podUID != "" && runtime)
		if may && quiet {
			skipped++ // its drift state keeps its marks
			continue
		}
		p := &probe{c: c, path: c.cgroup, pod: pod, podUID: podUID, may: may,
			want: act.ContainerFiles(c.cgroup, c.res, c.cpu, c.mem), last: map[string]string{c.key: c.last}}
		if may {
			p.prev, p.prevPod = st.mark, st.podMark
		}
		if pod != "" {
			p.members = c.pod.sizing(c, c.res, c.cpu, c.mem)
			for _, o := range c.pod.members {
				p.last[o.key] = o.last
			}
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y *probe) int { return strings.Compare(x.c.key, y.c.key) })
	return out, skipped
}

// podWantWith is what apply writes to the pod cgroup when the speaker has
// self (actuate.Actuator.PodFiles, the one rule).
func (p *probe) podWantWith(act *actuate.Actuator, self intent.Resources) cgroup.Resources {
	members := slices.Clone(p.members)
	members[0].Resources = self
	return act.PodFiles(p.pod, p.podUID, members, p.listed)
}

// unchanged reports whether nothing ran for p's container and pod since
// the snapshot, so that what was read is drift and not an apply; cur is
// the container managed under its key now.
func (p *probe) unchanged(cur *container) bool {
	c := p.c
	if cur != c || !idle(c) || c.cgroup != p.path {
		return false
	}
	if p.pod != "" {
		for _, o := range c.pod.members {
			if last, ok := p.last[o.key]; !ok || last != o.last || !idle(o) {
				return false
			}
		}
		return len(c.pod.members) == len(p.last)
	}
	return p.last[c.key] == c.last
}

// differ lists the files of want that st does not hold.
func differ(path string, st cgroup.State, want cgroup.Resources, pageSize int64) []DriftFile {
	var out []DriftFile
	for _, v := range want.Values() {
		if !st.Matches(want.Only(v.File), pageSize) {
			out = append(out, DriftFile{Cgroup: path, File: v.File, Expected: v.Data, Found: found(st, v.File)})
		}
	}
	return out
}

func found(st cgroup.State, file string) string {
	switch file {
	case cgroup.FileCPUMax:
		return st.CPUMax.String()
	case cgroup.FileCPUWeight:
		return strconv.FormatUint(st.CPUWeight, 10)
	}
	if st.MemoryMax == cgroup.Unlimited {
		return "max"
	}
	return strconv.FormatInt(st.MemoryMax, 10)
}

// actLocked records p's outcome and acts on drift by the policy.
func (a *Agent) actLocked(p *probe) {
	c := p.c
	d := a.drift.state[c.key]
	if d == nil || d.c != c {
		if a.drift.state == nil {
			a.drift.state = map[string]*driftState{}
		}
		d = &driftState{c: c, seen: c.last}
		a.drift.state[c.key] = d
	}
	now := a.now()
	if c.last != d.seen && c.last != d.intent {
		// Another intent has set new values: the fight, if any, is over,
		// and what differs now is a new drift.
		*d = driftState{c: c}
	}
	d.seen = c.last
	files := append(slices.Clone(p.files), p.podFiles...)
	if len(files) == 0 {
		if d.info != nil {
			a.log.Info("cgroup drift resolved", "container", c.name, "cgroup", c.cgroup, "after", now.Sub(d.info.FirstSeen).Round(time.Millisecond))
		}
		d.info, d.sig, d.verify = nil, "", false
		if d.contested && now.After(d.until) && (len(d.restoresAt) == 0 || now.Sub(d.restoresAt[len(d.restoresAt)-1]) > a.drift.windowOr()) {
			d.contested, d.backoff, d.restoresAt = false, 0, nil
		}
		return
	}
	sig := signature(files)
	// Act on a drift once: when first seen, when the values found change,
	// when it comes back after a restore, and when a backoff ends.
	fresh := d.info == nil || d.sig != sig || d.verify || d.info.Action == DriftActionBackoff && !now.Before(d.until)
	if d.info == nil {
		d.info = &DriftInfo{FirstSeen: now}
	}
	d.sig, d.verify = sig, false
	info := d.info
	info.Files, info.LastSeen, info.Policy = files, now, a.drift.policyOr()
	if !fresh {
		return // reported and acted on already; nothing new
	}
	switch a.drift.policyOr() {
	case DriftReport:
		a.drift.note(c, d, files, DriftActionReport, "")
	case DriftAdopt:
		if len(p.files) > 0 {
			if !a.adoptLocked(c, d, p) {
				return // the refusal is what to report
			}
			if p.podSt != nil {
				// The pod's values follow from the adopted ones now.
				p.podFiles = differ(p.pod, *p.podSt, p.podWantWith(a.act, c.res), a.cg.PageSize())
			}
			if len(p.podFiles) == 0 {
				d.info, d.sig = nil, "" // the files hold the container's values now
				return
			}
			info.Files, d.sig = p.podFiles, signature(p.podFiles)
		}
		a.drift.note(c, d, p.podFiles, DriftActionReport, "the pod-level values follow from its containers' and are not adopted")
	default:
		a.restoreLocked(c, d, files, now)
	}
}

// policyOr is the policy, restore by default.
func (d *drifts) policyOr() DriftPolicy {
	if d.policy == "" {
		return DriftRestore
	}
	return d.policy
}

func signature(files []DriftFile) string {
	var b strings.Builder
	for _, f := range files {
		b.WriteString(f.Cgroup + "/" + f.File + "=" + f.Found + ";")
	}
	return b.String()
}

func (d *drifts) windowOr() time.Duration {
	if d.window > 0 {
		return d.window
	}
	return defaultDriftWindow
}

// note records the action taken on ds's drift, counts it per resource, and
// logs it.
func (d *drifts) note(c *container, ds *driftState, files []DriftFile, action, msg string) {
	ds.info.Action, ds.info.Message = action, msg
	if d.metrics != nil {
		for _, res := range resourcesOf(files) {
			d.metrics.Drift.WithLabelValues(res, action).Inc()
		}
	}
	desc := make([]string, len(files))
	for i, f := range files {
		desc[i] = f.String()
	}
	d.log.Warn("cgroup drift", "container", c.name, "cgroup", c.cgroup, "policy", d.policyOr(), "action", action,
		"files", strings.Join(desc, "; "), "message", msg, "intent", ds.info.Intent)
}

func resourcesOf(files []DriftFile) []string {
	var out []string
	for _, f := range files {
		res := "cpu"
		if f.File == cgroup.FileMemoryMax {
			res = "memory"
		}
		if !slices.Contains(out, res) {
			out = append(out, res)
		}
	}
	return out
}

// restoreLocked makes an intent that puts the container's values back,
// unless the flapping guard says to hold off.
func (a *Agent) restoreLocked(c *container, d *driftState, files []DriftFile, now time.Time) {
	window := a.drift.windowOr()
	if now.Before(d.until) {
		d.info.Action = DriftActionBackoff
		return
	}
	d.info.BackoffUntil = nil
	d.restoresAt = slices.DeleteFunc(d.restoresAt, func(t time.Time) bool { return now.Sub(t) > window })
	limit := a.drift.restores
	if limit <= 0 {
		limit = defaultDriftRestores
	}
	prev := ""
	if r, ok := a.hist.intents[d.intent]; ok && r.Status.State != intent.Completed {
		prev = fmt.Sprintf("; the last restore intent %s ended %s: %s", r.ID, r.Status.State, r.Status.Message)
	}
	if len(d.restoresAt) >= limit || (d.contested && len(d.restoresAt) > 0) {
		d.contested = true
		d.backoff = min(max(2*d.backoff, window), maxDriftBackoff*window)
		d.until = now.Add(d.backoff)
		until := d.until
		d.info.BackoffUntil = &until
		a.drift.note(c, d, files, DriftActionBackoff, fmt.Sprintf(
			"the drift came back after %d restore(s) within %s: another writer seems to own these files; not restoring until %s%s",
			len(d.restoresAt), window, until.UTC().Format(time.RFC3339), prev))
		return
	}
	r, err := a.driftIntentLocked(c)
	if err != nil {
		a.drift.note(c, d, files, DriftActionReport, "cannot restore: "+err.Error())
		return
	}
	d.restoresAt = append(d.restoresAt, now)
	d.intent, d.verify = r.ID, true
	d.info.Intent = r.ID
	d.info.Restores++
	a.drift.note(c, d, files, DriftActionRestore, "restoring through intent "+r.ID+prev)
}

// driftIntentLocked accepts an intent that gives c again the resources it
// holds, for the declared resources only, and starts it. It bypasses
// Submit, which would supersede an intent queued meanwhile; the caller holds
// the lock and has checked that c is idle. It is not journaled before it
// runs: after a crash the next check finds the drift again.
func (a *Agent) driftIntentLocked(c *container) (*record, error) {
	spec := declaredSpec(c)
	spec, change, err := intent.Validate(spec)
	if err != nil {
		return nil, err
	}
	now := a.now()
	a.seq++
	r := &record{Intent: intent.Intent{ID: spec.ID, Origin: intent.OriginDrift, Spec: spec, Status: intent.Status{
		State: intent.Proposed, AcceptedAt: now, UpdatedAt: now,
		Message: "made by the agent to restore drifted cgroup values",
	}}, change: change, seq: a.seq, key: c.key}
	a.acceptLocked(c, r)
	return r, nil
}

// declaredSpec is a spec for c's declared resources as it holds them now.
func declaredSpec(c *container) intent.Spec {
	t := intent.Target{Name: c.name, PodCgroupPath: c.podPath()}
	switch {
	case c.runtimeID == "":
		t.CgroupPath = c.cgroup
	case c.podUID != "":
		t.PodUID = c.podUID
	default:
		t.ContainerID = c.runtimeID
	}
	req, lim := corev1.ResourceList{}, corev1.ResourceList{}
	if c.cpu {
		req[corev1.ResourceCPU] = *resource.NewMilliQuantity(c.res.CPURequest, resource.DecimalSI)
		if c.res.CPULimit > 0 {
			lim[corev1.ResourceCPU] = *resource.NewMilliQuantity(c.res.CPULimit, resource.DecimalSI)
		}
	}
	if c.mem {
		req[corev1.ResourceMemory] = *resource.NewQuantity(c.res.MemoryRequest, resource.BinarySI)
		if c.res.MemoryLimit > 0 {
			lim[corev1.ResourceMemory] = *resource.NewQuantity(c.res.MemoryLimit, resource.BinarySI)
		}
	}
	s := intent.Spec{ID: DriftIntentPrefix + newID(), Target: t}
	s.Resources.Requests = req
	if len(lim) > 0 {
		s.Resources.Limits = lim
	}
	return s
}

// adoptLocked makes the values found on c's own cgroup its resources, when
// they can be expressed as requests and limits, keep the QoS class and fit
// the node; otherwise it refuses and says why. It reports whether it
// adopted.
func (a *Agent) adoptLocked(c *container, d *driftState, p *probe) bool {
	want, err := adopted(c, p.st, p.files, a.period, a.ledger)
	if err != nil {
		a.drift.note(c, d, p.files, DriftActionRefuse, "not adopted: "+err.Error())
		return false
	}
	old := c.res
	c.res = want
	now := a.now()
	a.seq++
	spec := declaredSpec(c)
	spec, change, _ := intent.Validate(spec)
	desc := make([]string, len(p.files))
	for i, f := range p.files {
		desc[i] = f.File + "=" + f.Found
	}
	msg := fmt.Sprintf("adopted the values another writer set (%s): %s, was %s", strings.Join(desc, " "), want, old)
	r := &record{Intent: intent.Intent{ID: spec.ID, Origin: intent.OriginDrift, Spec: spec, Status: intent.Status{
		State: intent.Completed, Reason: ReasonDriftAdopted, Message: msg,
		AcceptedAt: now, UpdatedAt: now, CompletedAt: &now,
	}}, change: change, seq: a.seq, key: c.key}
	a.hist.intents[r.ID] = r
	a.hist.order = append(a.hist.order, r.ID)
	a.hub.publish(Event{Type: "ADDED", Intent: r.Intent})
	c.last, d.seen, d.intent = r.ID, r.ID, r.ID
	a.journalLocked(r) // with c.res: the adopted values survive a restart
	d.info.Intent = r.ID
	a.drift.note(c, d, p.files, DriftActionAdopt, msg)
	a.hist.evict(a.history)
	if requests(want).MilliCPU < requests(old).MilliCPU {
		a.retryDeferredLocked()
	}
	return true
}

// adoptedLocked is c's resources with the drifted files' values taken in.
// The memory request stays as declared (no file holds it); a changed
// cpu.weight is taken as the CPU request that gives it.
func adopted(c *container, st cgroup.State, files []DriftFile, period uint64, ledger *admission.Ledger) (intent.Resources, error) {
	n := c.res
	for _, f := range files {
		switch f.File {
		case cgroup.FileCPUMax:
			n.CPULimit = 0
			if q := st.CPUMax.Quota; q != cgroup.Unlimited {
				if st.CPUMax.Period != period {
					return n, fmt.Errorf("cpu.max %s has a period other than the agent's %d", st.CPUMax, period)
				}
				n.CPULimit = q * cgroup.MilliCPUToCPU / int64(period)
				if n.CPULimit == 0 || cgroup.MilliCPUToQuota(n.CPULimit, period) != q {
					return n, fmt.Errorf("cpu.max %s is not a whole number of millicores", st.CPUMax)
				}
			}
		case cgroup.FileCPUWeight:
			m, ok := requestForWeight(st.CPUWeight)
			if !ok {
				return n, fmt.Errorf("cpu.weight %d is not the weight of any CPU request", st.CPUWeight)
			}
			n.CPURequest = m
		case cgroup.FileMemoryMax:
			n.MemoryLimit = 0
			if st.MemoryMax != cgroup.Unlimited {
				n.MemoryLimit = st.MemoryMax
			}
		}
	}
	if n.CPULimit > 0 && n.CPURequest > n.CPULimit {
		return n, fmt.Errorf("the CPU request %s would be above the limit %s", intent.FormatCPU(n.CPURequest), intent.FormatCPU(n.CPULimit))
	}
	if n.MemoryLimit > 0 && n.MemoryRequest > n.MemoryLimit {
		return n, fmt.Errorf("the declared memory request %s would be above the limit %s", intent.FormatMemory(n.MemoryRequest), intent.FormatMemory(n.MemoryLimit))
	}
	if c.cpu && c.mem {
		if before, after := c.qos(c.res), c.qos(n); before != after {
			return n, fmt.Errorf("%s: it would change the QoS class from %s to %s", intent.ReasonQoSChange, before, after)
		}
	}
	if req := requests(n); req != requests(c.res) {
		if dec := ledger.Reserve(c.key, req); dec.Verdict != admission.Fit {
			return n, fmt.Errorf("the CPU request %s it implies does not fit: %s", intent.FormatCPU(n.CPURequest), dec.Message)
		}
	}
	return n, nil
}

// requestForWeight inverts cgroup.MilliCPUToWeight: of the CPU requests
// whose weight is w (a range, the conversion being many to one), the
// roundest, as a person or the kubelet would have asked for it.
func requestForWeight(w uint64) (int64, bool) {
	top := int(int64(cgroup.MaxShares) * cgroup.MilliCPUToCPU / cgroup.SharesPerCPU)
	lo := int64(sort.Search(top+1, func(i int) bool { return cgroup.MilliCPUToWeight(int64(i)) >= w }))
	hi := int64(sort.Search(top+1, func(i int) bool { return cgroup.MilliCPUToWeight(int64(i)) > w })) - 1
	if lo > hi {
		return 0, false
	}
	for p := int64(100000); p > 1; p /= 10 {
		if x := (lo + p - 1) / p * p; x <= hi {
			return x, true
		}
	}
	return lo, true
}

// info is a copy of c's drift, for the container listing.
func (d *drifts) info(c *container) *DriftInfo {
	ds := d.state[c.key]
	if ds == nil || ds.c != c || ds.info == nil {
		return nil
	}
	info := *ds.info
	info.Files = slices.Clone(info.Files)
	return &info
}
