package allocdrift

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup/spec"
	"github.com/resizer/resize-agent/cri"
)

// Policy is what the Checker does about a drift.
type Policy string

const (
	// PolicyReport reports: the counter, an Event, the caller's log.
	PolicyReport Policy = "report"
	// PolicyRestore also writes the kubelet's values back through the
	// runtime.
	PolicyRestore Policy = "restore"
	// PolicyOff turns the check off.
	PolicyOff Policy = "off"
)

// ParsePolicy checks a policy name.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyReport, PolicyRestore, PolicyOff:
		return p, nil
	}
	return "", fmt.Errorf("kube drift policy %q is not report, restore or off", s)
}

// ReasonCgroupDrift is the Event reason, the agent's own (never one of the
// kubelet's).
const ReasonCgroupDrift = "CgroupDrift"

// Actions, as in resize_agent_drift_total's action label.
const (
	ActionReport  = "report"
	ActionRestore = "restore"
	ActionBackoff = "backoff"
)

// Runtime is the part of the CRI client the check uses.
type Runtime interface {
	Get(ctx context.Context, id string) (cri.Container, error)
	Update(ctx context.Context, id string, r cri.Resources) error
}

// Cgroups is the part of the cgroup manager the check uses.
type Cgroups interface {
	PathOf(pid int) (string, error)
	Read(path string) (spec.State, error)
	PageSize() int64
}

// Recorder records Events on pods (client-go's record.EventRecorder).
type Recorder interface {
	Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Options configure a Checker.
type Options struct {
	Policy Policy
	// Period is the kubelet's CFS period in µs (cpuCFSQuotaPeriod,
	// default 100000).
	Period uint64
	// Confirm is how long a difference must last before it is drift
	// (default 3s: the kubelet reports a resize 1.5-4 s after it writes
	// the files, under emulation).
	Confirm time.Duration
	// Restores within Window before the check backs off (defaults 3 and
	// 2 minutes): another writer that keeps undoing the restores is
	// reported, not fought.
	Restores int
	Window   time.Duration
	// Count, when set, counts a drift per resource and action.
	Count func(resource, action string)
	// Checked, when set, is called at the end of every check.
	Checked func()
	// Recorder, when set, gets an Event per drift acted on.
	Recorder Recorder
	// OnFinding, when set, is called for every drift acted on (the
	// daemon logs it).
	OnFinding func(Finding)
	Now       func() time.Time
	// Writes, when set, names the last write to a cgroup's limit files
	// (pressure.BPF, where the eBPF hook is attached): a cgroup found
	// holding its expected values is not read again while nothing has
	// written it and its expected values stay, except every Sweep
	// (default a minute), for the writes the hook cannot see. Reading
	// every container every interval is the agent's cost at rest.
	Writes LimitWrites
	Sweep  time.Duration
	// Kubelet, when set, is what the check must know of the kubelet now
	// (ok false: not known yet, the check waits for it). Without it CPU
	// limits are taken as enforced and memory.high is not compared.
	Kubelet func() (k Kubelet, ok bool)
}

// highReader and highWriter are the optional parts of Cgroups for
// memory.high (*cgroup.Manager has them): without the first it is not
// compared, without the second a drift of it is reported only.
type highReader interface {
	ReadMemoryHigh(path string) (int64, error)
}

type highWriter interface {
	SetMemoryHigh(path string, v int64) error
}

// LimitWrites names the last write to a cgroup's cpu.max, cpu.weight,
// memory.max or memory.high (pressure.BPF).
type LimitWrites interface {
	LimitWriteMark(cgroupPath string) (pressure.WriteMark, bool)
}

// anyWrites is a LimitWrites that also stamps the last write to any
// cgroup (pressure.BPF): a check that finds the stamp where the last one
// took it skips its clean cgroups without a lookup each.
type anyWrites interface {
	AnyLimitWriteStamp() (uint64, bool)
}

// Finding is one drift acted on.
type Finding struct {
	Pod       types.NamespacedName
	Container string // "" for the pod cgroup
	ID        string // runtime container ID
	Cgroup    string
	Files     []File
	Action    string
	Message   string
	FirstSeen time.Time
}

// Checker compares the node's containers with their allocation.
type Checker struct {
	pods func() []*corev1.Pod
	rt   Runtime
	cg   Cgroups
	opts Options

	mu    sync.Mutex
	state map[string]*drift // by runtime container ID
	paths map[string]string // cgroup path by runtime container ID
	// clean is, by state key, the last read that found a cgroup holding
	// its expected values (Options.Writes); swept the last check that read
	// everything.
	clean map[string]cleanRead
	swept time.Time
	// anyStamp is the last write to any cgroup as the last whole check
	// found it before its reads (anyOK: it could be read).
	anyStamp uint64
	anyOK    bool
	// podHigh is, by pod UID, the pod cgroup's memory.high as the kubelet
	// last wrote it: it writes it only with the pod's memory limit
	// (setPodCgroupConfig in pkg/kubelet/kuberuntime/kuberuntime_manager.go,
	// 1.37.2, called when the limit changes), so a change of the request
	// alone leaves the value of the request before.
	podHigh map[types.UID]podHighRef
}

type podHighRef struct {
	limit, high int64
	seen        bool // its file was read once
}

// cleanRead is what a skipped read must have in common with the last clean
// one: the expected values and the cgroup's write mark.
type cleanRead struct {
	want string
	mark pressure.WriteMark
}

type drift struct {
	sig        string
	first      time.Time
	acted      bool
	restoresAt []time.Time
	backoff    bool
}

// New makes a checker over the pods pods returns (the capacity view's).
func New(pods func() []*corev1.Pod, rt Runtime, cg Cgroups, opts Options) (*Checker, error) {
	if pods == nil || rt == nil || cg == nil {
		return nil, errors.New("allocdrift: pods, runtime and cgroups are required")
	}
	if opts.Policy == "" {
		opts.Policy = PolicyReport
	}
	if _, err := ParsePolicy(string(opts.Policy)); err != nil {
		return nil, err
	}
	if opts.Period == 0 {
		opts.Period = spec.DefaultPeriod
	}
	if opts.Confirm <= 0 {
		opts.Confirm = 3 * time.Second
	}
	if opts.Restores <= 0 {
		opts.Restores = 3
	}
	if opts.Window <= 0 {
		opts.Window = 2 * time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Sweep <= 0 {
		opts.Sweep = time.Minute
	}
	return &Checker{pods: pods, rt: rt, cg: cg, opts: opts, state: map[string]*drift{}, paths: map[string]string{}, clean: map[string]cleanRead{},
		podHigh: map[types.UID]podHighRef{}}, nil
}

// Result sums up one Check.
type Result struct {
	Checked int // containers whose files were compared
	Pods    int // pod cgroups whose files were compared
	// Skipped counts the cgroups not read again: clean at their last read,
	// not written since, and expected to hold the same (Options.Writes).
	Skipped  int
	Drifted  int       // cgroups that differ now (confirmed or not)
	Findings []Finding // drifts acted on in this check
	// Recheck: a difference waits for its confirmation; look again after
	// Options.Confirm.
	Recheck bool
}

// Run checks every interval until ctx ends, and after the confirmation
// delay while a difference waits to be confirmed.
func (c *Checker) Run(ctx context.Context, interval time.Duration) {
	if c.opts.Policy == PolicyOff {
		return
	}
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := interval
		if c.Check(ctx).Recheck {
			next = min(interval, c.opts.Confirm)
		}
		t.Reset(next)
	}
}

// target is one running container to compare.
type target struct {
	pod  *corev1.Pod
	name string
	id   string
	res  corev1.ResourceRequirements
	// own is the container's own resources in the spec (the allocation:
	// the pod is settled), without the pod-level limits res fills in.
	own corev1.ResourceRequirements
	// altWeight, when not 0, is a second cpu.weight the kubelet writes
	// for res (AltWeight).
	altWeight uint64
}

// targets lists the running containers of pods whose allocation is
// settled: not a pod being resized (PodResizeInProgress, a spec that
// differs from the status without the kubelet having said
// PodResizePending, pod-level resources not yet allocated: podSettled),
// nor one being deleted.
func targets(pods []*corev1.Pod) []target {
	var out []target
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || hasCondition(p, corev1.PodResizeInProgress) || !podSettled(p) {
			continue
		}
		pending := hasCondition(p, corev1.PodResizePending)
		var ts []target
		settled := true
		for _, l := range []struct {
			spec []corev1.Container
			sts  []corev1.ContainerStatus
		}{{p.Spec.InitContainers, p.Status.InitContainerStatuses}, {p.Spec.Containers, p.Status.ContainerStatuses}} {
			for _, st := range l.sts {
				if st.State.Running == nil || st.Resources == nil || st.ContainerID == "" {
					continue
				}
				var sp *corev1.Container
				for i := range l.spec {
					if l.spec[i].Name == st.Name {
						sp = &l.spec[i]
					}
				}
				if sp == nil {
					continue
				}
				if !pending && !sameResources(sp.Resources, *st.Resources) {
					settled = false
				}
				_, id, _ := strings.Cut(st.ContainerID, "://")
				// The pod-level limits a container without its own gets
				// are the allocated ones: the spec's, the pod settled.
				// Its own are the spec's too, except where a resize is
				// pending: then the status holds the allocation.
				own := sp.Resources
				if pending {
					own = *st.Resources
				}
				ts = append(ts, target{pod: p, name: st.Name, id: id, res: podcgroup.ContainerResources(p, *st.Resources),
					own: own, altWeight: AltWeight(p, *st.Resources)})
			}
		}
		if settled {
			out = append(out, ts...)
		}
	}
	return out
}

func hasCondition(p *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// sameResources compares cpu and memory requests and limits.
func sameResources(a, b corev1.ResourceRequirements) bool {
	return sameList(a.Requests, b.Requests) && sameList(a.Limits, b.Limits)
}

// sameList compares the cpu and memory entries of two lists.
func sameList(a, b corev1.ResourceList) bool {
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		x, okx := a[r]
		y, oky := b[r]
		if okx != oky || (okx && x.Cmp(y) != 0) {
			return false
		}
	}
	return true
}

// subject is one cgroup to compare: a container's, or a pod's own.
type subject struct {
	key       string // state key: the runtime container ID, or "pod/"+UID
	pod       *corev1.Pod
	container string // "" for the pod cgroup
	id        string // runtime container ID; "" for the pod cgroup
	path      string
	st        spec.State
	want      spec.Resources
	// altWeight, when not 0, is a cpu.weight that is the kubelet's too.
	altWeight uint64
	// high is the kubelet's memory.high, compared with found when hasHigh;
	// altHigh, when not 0, is one that is the kubelet's too.
	high, altHigh, found int64
	hasHigh              bool
	// restore writes the kubelet's values back; "" when it did, else why
	// it did not.
	restore func(ctx context.Context, files []File) (string, error)
}

// Check compares every settled container, and the pod cgroup of every
// settled pod, once and acts on confirmed drift.
func (c *Checker) Check(ctx context.Context) Result {
	var res Result
	if c.opts.Policy == PolicyOff {
		return res
	}
	now := c.opts.Now()
	c.mu.Lock()
	sweep := c.opts.Writes == nil || now.Sub(c.swept) >= c.opts.Sweep
	if sweep {
		c.swept = now
	}
	var anyStamp uint64
	var anyOK, quiet bool
	if aw, ok := c.opts.Writes.(anyWrites); ok {
		anyStamp, anyOK = aw.AnyLimitWriteStamp()
		quiet = !sweep && anyOK && c.anyOK && anyStamp == c.anyStamp
		c.anyOK = false // kept below once this check has seen every cgroup
	}
	c.mu.Unlock()
	var kl Kubelet
	if c.opts.Kubelet != nil {
		var ok bool
		if kl, ok = c.opts.Kubelet(); !ok {
			return res // the node's release is not known yet
		}
	}
	_, canHigh := c.cg.(highReader)
	page := c.cg.PageSize()
	seen := map[string]bool{}
	podPaths := map[types.UID]string{}
	var pods []*corev1.Pod
	all := c.pods()
	for _, t := range targets(all) {
		if ctx.Err() != nil {
			break
		}
		path, err := c.path(ctx, t.id)
		if err != nil {
			continue // gone or not ours to read: the next check sees
		}
		if _, ok := podPaths[t.pod.UID]; !ok {
			if pp, ok := podCgroupOf(path, podcgroup.UID(t.pod)); ok {
				podPaths[t.pod.UID] = pp
				pods = append(pods, t.pod)
			}
		}
		want := Expected(t.res, c.opts.Period)
		if kl.NoCPUQuota {
			want.CPUMax = &spec.CPUMax{Quota: spec.Unlimited, Period: spec.DefaultPeriod}
		}
		high, altHigh, hasHigh := ContainerMemoryHigh(t.pod, t.own, t.res.Limits.Memory().Value(), kl, page)
		hasHigh = hasHigh && canHigh
		r, skip := c.unwritten(t.id, path, want, t.altWeight, highKey(high, hasHigh)+fmt.Sprintf(",%d", altHigh), sweep, quiet)
		if skip {
			seen[t.id] = true
			res.Skipped++
			continue
		}
		st, err := c.cg.Read(path)
		if err != nil {
			continue
		}
		sub := subject{key: t.id, pod: t.pod, container: t.name, id: t.id, path: path, st: st,
			want: want, altWeight: t.altWeight, high: high, altHigh: altHigh, hasHigh: hasHigh}
		if hasHigh {
			if sub.found, err = c.cg.(highReader).ReadMemoryHigh(path); err != nil {
				continue
			}
		}
		seen[t.id] = true
		res.Checked++
		sub.restore = c.restoreContainer(t, want, high, hasHigh)
		clean := c.judge(ctx, now, &res, sub)
		c.keep(t.id, r, clean)
	}
	for _, p := range pods { // settled, as targets
		if ctx.Err() != nil {
			break
		}
		path := podPaths[p.UID]
		key := "pod/" + string(p.UID)
		exp := PodExpected(p, c.opts.Period)
		if kl.NoCPUQuota {
			exp.CPUMax.Quota = spec.Unlimited
		}
		want := c.stored(path, exp)
		high, hasHigh := c.podHighWant(p, kl, page)
		hasHigh = hasHigh && canHigh
		r, skip := c.unwritten(key, path, want, 0, highKey(high, hasHigh), sweep, quiet)
		if skip {
			seen[key] = true
			res.Skipped++
			continue
		}
		st, err := c.cg.Read(path)
		if err != nil {
			continue
		}
		sub := subject{key: key, pod: p, path: path, st: st, want: want, high: high, hasHigh: hasHigh}
		if hasHigh {
			if sub.found, err = c.cg.(highReader).ReadMemoryHigh(path); err != nil {
				continue
			}
			if high, ok := c.podHighFirstSight(p, kl, sub.found, page); ok {
				sub.high = high
			}
		}
		seen[key] = true
		res.Pods++
		sub.restore = c.restorePod(path, st, want, sub.high, hasHigh)
		clean := c.judge(ctx, now, &res, sub)
		c.keep(key, r, clean)
	}
	c.mu.Lock()
	if anyOK && ctx.Err() == nil {
		c.anyStamp, c.anyOK = anyStamp, true
	}
	for id := range c.state {
		if !seen[id] {
			delete(c.state, id)
		}
	}
	for id := range c.paths {
		if !seen[id] {
			delete(c.paths, id)
		}
	}
	for key := range c.clean {
		if !seen[key] {
			delete(c.clean, key)
		}
	}
	// Kept while the pod is being resized (not a target then): a change
	// of its request alone must find the value of the request before.
	present := make(map[types.UID]bool, len(all))
	for _, p := range all {
		present[p.UID] = true
	}
	for uid := range c.podHigh {
		if !present[uid] {
			delete(c.podHigh, uid)
		}
	}
	c.mu.Unlock()
	if c.opts.Checked != nil {
		c.opts.Checked()
	}
	return res
}

// unwritten takes the write mark of the cgroup at path (before its files
// are read) and says whether the read can be skipped: not a sweep, and the
// cgroup clean at its last read with the same expected values and mark.
// r is what keep records when this read finds it clean; ok false: no mark.
// quiet: nothing was written anywhere since the last check, so the mark is
// the last clean read's without looking it up.
func (c *Checker) unwritten(key, path string, want spec.Resources, alt uint64, high string, sweep, quiet bool) (r *cleanRead, skip bool) {
	if c.opts.Writes == nil {
		return nil, false
	}
	var b strings.Builder
	for _, v := range want.Values() {
		b.WriteString(v.File + "=" + v.Data + ";")
	}
	fmt.Fprintf(&b, "alt=%d;%s", alt, high)
	c.mu.Lock()
	last, had := c.clean[key]
	c.mu.Unlock()
	if quiet && had && last.want == b.String() {
		return &last, true
	}
	m, ok := c.opts.Writes.LimitWriteMark(path)
	if !ok {
		return nil, false
	}
	r = &cleanRead{want: b.String(), mark: m}
	return r, !sweep && had && last == *r
}

// keep records a clean read r of key, or forgets the last one.
func (c *Checker) keep(key string, r *cleanRead, clean bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r != nil && clean {
		c.clean[key] = *r
	} else {
		delete(c.clean, key)
	}
}

// judge compares s's files with what the kubelet wrote and, once a
// difference has lasted the confirmation delay, acts on it (once per
// difference; restores bounded per window). It reports whether the files
// held the values.
func (c *Checker) judge(ctx context.Context, now time.Time, res *Result, s subject) bool {
	files := Differ(s.st, s.want, c.cg.PageSize())
	if s.hasHigh && s.found != spec.PageAlign(s.high, c.cg.PageSize()) && (s.altHigh == 0 || s.found != s.altHigh) {
		files = append(files, File{File: FileMemoryHigh, Expected: spec.FormatMax(s.high), Found: spec.FormatMax(s.found)})
	}
	if s.altWeight != 0 && s.st.CPUWeight == s.altWeight {
		files = slices.DeleteFunc(files, func(f File) bool { return f.File == spec.FileCPUWeight })
	}
	c.mu.Lock()
	d := c.state[s.key]
	if d != nil {
		d.restoresAt = pruned(d.restoresAt, now, c.opts.Window)
		if d.backoff && len(d.restoresAt) == 0 {
			// The backoff is over: a drift still there is acted on anew.
			d.backoff, d.acted, d.first = false, false, now
		}
	}
	if len(files) == 0 {
		if d != nil && len(d.restoresAt) == 0 {
			delete(c.state, s.key)
		} else if d != nil {
			d.sig, d.acted = "", false // the restores stay counted
		}
		c.mu.Unlock()
		return true
	}
	res.Drifted++
	sig := signature(s.want, files)
	if d == nil {
		d = &drift{}
		c.state[s.key] = d
	}
	if d.sig != sig {
		d.sig, d.first, d.acted = sig, now, false
	}
	if d.acted {
		c.mu.Unlock()
		return false
	}
	if now.Sub(d.first) < c.opts.Confirm {
		res.Recheck = true
		c.mu.Unlock()
		return false
	}
	f := Finding{Pod: types.NamespacedName{Namespace: s.pod.Namespace, Name: s.pod.Name}, Container: s.container, ID: s.id,
		Cgroup: s.path, Files: files, FirstSeen: d.first}
	action := ActionReport
	if c.opts.Policy == PolicyRestore {
		if d.backoff || len(d.restoresAt) >= c.opts.Restores {
			action, d.backoff = ActionBackoff, true
			f.Message = fmt.Sprintf("the drift came back after %d restores within %s: another writer seems to own these files; reported, not restored", len(d.restoresAt), c.opts.Window)
		} else {
			action = ActionRestore
			d.restoresAt = append(d.restoresAt, now)
		}
	}
	d.acted = true
	c.mu.Unlock()
	if action == ActionRestore {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		why, err := s.restore(rctx, files)
		cancel()
		restored := err == nil && why == ""
		switch {
		case err != nil && s.container == "":
			action, f.Message = ActionReport, "writing the pod cgroup failed: "+err.Error()
		case err != nil:
			action, f.Message = ActionReport, "the restore through the runtime failed: "+err.Error()
		case why != "":
			action, f.Message = ActionReport, why
		case s.container == "":
			f.Message = "the kubelet's values written back to the pod cgroup"
			res.Recheck = true
		default:
			f.Message = "the kubelet's values written back through the runtime"
			res.Recheck = true
		}
		c.mu.Lock()
		if restored {
			d.acted = false // verified at the next check
			d.sig = ""
		} else if why != "" {
			d.restoresAt = d.restoresAt[:len(d.restoresAt)-1] // nothing was tried
		}
		c.mu.Unlock()
	}
	f.Action = action
	c.act(s.pod, f)
	res.Findings = append(res.Findings, f)
	return false
}

// restoreContainer writes the kubelet's values back through the runtime
// (UpdateContainerResources), so that its record and the files agree.
func (c *Checker) restoreContainer(t target, want spec.Resources, high int64, hasHigh bool) func(context.Context, []File) (string, error) {
	return func(ctx context.Context, _ []File) (string, error) {
		r := RuntimeResources(t.res, c.opts.Period)
		r.CPUPeriod, r.CPUQuota = int64(want.CPUMax.Period), want.CPUMax.Quota
		if hasHigh {
			// The kubelet's value in the runtime's record too, so that
			// containerd's next update (it merges the unified map) keeps it.
			r.MemoryHigh = high
			if high == spec.Unlimited {
				r.MemoryHigh = cri.MemoryHighMax
			}
		}
		return "", c.rt.Update(ctx, t.id, r)
	}
}

// Writer is the optional part of Cgroups that writes a cgroup's files
// (*cgroup.Manager: through the cgroup package, as unit properties under
// the systemd driver, as the kubelet's cgroup manager does). Without it a
// pod cgroup's drift is reported only: no runtime owns a pod cgroup, the
// kubelet writes it itself (pkg/kubelet/cm/pod_container_manager_linux.go).
type Writer interface {
	Write(path string, r spec.Resources) error
}

// restorePod writes the files of the pod cgroup at path that differ back
// to the kubelet's values, through the cgroup package. A memory.max below
// what the pod uses is not written: the kernel would reclaim or kill to
// meet it, where the kubelet's own resize checks usage first.
func (c *Checker) restorePod(path string, st spec.State, want spec.Resources, high int64, hasHigh bool) func(context.Context, []File) (string, error) {
	return func(_ context.Context, files []File) (string, error) {
		w, ok := c.cg.(Writer)
		if !ok {
			return "no cgroup writer: reported, not restored", nil
		}
		var r spec.Resources
		setHigh := false
		for _, f := range files {
			switch f.File {
			case FileMemoryHigh:
				setHigh = hasHigh
			case spec.FileCPUMax:
				r.CPUMax = want.CPUMax
			case spec.FileCPUWeight:
				r.CPUWeight = want.CPUWeight
			case spec.FileMemoryMax:
				if *want.MemoryMax != spec.Unlimited && st.MemoryCurrent > *want.MemoryMax {
					return fmt.Sprintf("memory.current %d is above the kubelet's memory.max: writing it back would reclaim or OOM-kill; reported, not restored", st.MemoryCurrent), nil
				}
				r.MemoryMax = want.MemoryMax
			}
		}
		if !r.IsZero() {
			if err := w.Write(path, r); err != nil {
				return "", err
			}
		}
		if setHigh {
			hw, ok := c.cg.(highWriter)
			if !ok {
				return "no memory.high writer: reported, not restored", nil
			}
			// The file alone, also under the systemd driver: the unit's
			// MemoryHigh is still the kubelet's (it sets the property);
			// a stray write changed the file only.
			return "", hw.SetMemoryHigh(path, high)
		}
		return "", nil
	}
}

// highKey is the expected memory.high in a clean read's key.
func highKey(high int64, ok bool) string {
	if !ok {
		return ""
	}
	return FileMemoryHigh + "=" + spec.FormatMax(high)
}

// podHighWant is the pod cgroup's memory.high as the kubelet last wrote it
// for p's allocation: PodMemoryHigh when its memory limit is new (or the
// pod first seen), else the value of the request at the limit's last
// change (Checker.podHigh).
func (c *Checker) podHighWant(p *corev1.Pod, k Kubelet, page int64) (int64, bool) {
	alloc := podcgroup.Allocated(p)
	high, ok := PodMemoryHigh(alloc, k, page)
	if !ok {
		return 0, false
	}
	lim := podcgroup.ForPod(alloc).MemoryLimit
	c.mu.Lock()
	defer c.mu.Unlock()
	ref, had := c.podHigh[p.UID]
	if had && ref.limit == lim {
		return ref.high, true
	}
	// A new limit: the kubelet wrote the value of the request now.
	c.podHigh[p.UID] = podHighRef{limit: lim, high: high, seen: had}
	return high, true
}

// podHighFirstSight: a pod the check has just met whose memory.high is
// not the value of its request now may have had its request changed
// alone before the agent started (the kubelet then leaves the value of
// the request before). found is taken as the kubelet's when it is one the
// kubelet writes for some request under the pod's limit: page-aligned,
// from factor × limit up to the limit.
func (c *Checker) podHighFirstSight(p *corev1.Pod, k Kubelet, found, page int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ref, had := c.podHigh[p.UID]
	if !had || ref.seen || found == ref.high {
		if had {
			ref.seen = true
			c.podHigh[p.UID] = ref
		}
		return 0, false
	}
	ref.seen = true
	lo := throttled(0, ref.limit, k.MemoryHighFactor, page)
	if found != spec.Unlimited && found%page == 0 && lo != spec.Unlimited && found >= lo && found <= ref.limit {
		ref.high = found
	}
	c.podHigh[p.UID] = ref
	return ref.high, true
}

// storer is the optional part of Cgroups that says what a cgroup's files
// hold once r is written there (the systemd driver's rounding of quotas:
// the kubelet writes pod slices through systemd); *cgroup.Manager has it.
type storer interface {
	Stored(path string, r spec.Resources) spec.Resources
}

func (c *Checker) stored(path string, r spec.Resources) spec.Resources {
	if s, ok := c.cg.(storer); ok {
		return s.Stored(path, r)
	}
	return r
}

// podCgroupOf is the pod cgroup of pod uid, the parent of a container's
// cgroup at ctr when that is the kubelet's pod<uid> (cgroupfs) or
// kubepods-<qos>-pod<uid with _>.slice (systemd) naming
// (pkg/kubelet/cm/pod_container_manager_linux.go, GetPodContainerName).
func podCgroupOf(ctr string, uid types.UID) (string, bool) {
	if uid == "" {
		return "", false
	}
	parent := path.Dir(ctr)
	base := path.Base(parent)
	u := string(uid)
	if base == "pod"+u || (strings.HasPrefix(base, "kubepods-") && strings.HasSuffix(base, "pod"+strings.ReplaceAll(u, "-", "_")+".slice")) {
		return parent, true
	}
	return "", false
}

// podSettled reports whether the pod's allocation is known, as far as its
// pod-level resources go: without them, always (the containers decide,
// targets); with them, once the kubelet has seen the latest spec
// (status.observedGeneration), says nothing is pending, and reports as the
// pod's whole request (status.allocatedResources, 1.36+: PodRequests of
// its allocated pod) what the spec's pod-level values give. The API shows
// no allocated pod-level values of their own, so a pod whose pod-level
// change waits (PodResizePending) is not checked.
func podSettled(p *corev1.Pod) bool {
	if p.Spec.Resources == nil {
		return true
	}
	if p.Status.ObservedGeneration != 0 && p.Status.ObservedGeneration < p.Generation {
		return false
	}
	if hasCondition(p, corev1.PodResizePending) {
		return false
	}
	return p.Status.AllocatedResources == nil || sameList(podcgroup.Requests(podcgroup.Allocated(p)), p.Status.AllocatedResources)
}

func (c *Checker) act(p *corev1.Pod, f Finding) {
	if c.opts.Count != nil {
		for _, r := range resources(f.Files) {
			c.opts.Count(r, f.Action)
		}
	}
	desc := make([]string, len(f.Files))
	for i, x := range f.Files {
		desc[i] = x.String()
	}
	if c.opts.Recorder != nil {
		msg := fmt.Sprintf("container %s: cgroup values differ from what the kubelet actuated (status.containerStatuses[].resources): %s", f.Container, strings.Join(desc, "; "))
		if f.Container == "" {
			msg = "pod cgroup: values differ from what the kubelet writes for the pod's allocation (ResourceConfigForPod): " + strings.Join(desc, "; ")
		}
		if f.Message != "" {
			msg += "; " + f.Message
		}
		c.opts.Recorder.Eventf(p, corev1.EventTypeWarning, ReasonCgroupDrift, "%s", msg)
	}
	if c.opts.OnFinding != nil {
		c.opts.OnFinding(f)
	}
}

func pruned(ts []time.Time, now time.Time, window time.Duration) []time.Time {
	out := ts[:0]
	for _, t := range ts {
		if now.Sub(t) <= window {
			out = append(out, t)
		}
	}
	return out
}

func signature(want spec.Resources, files []File) string {
	var b strings.Builder
	for _, v := range want.Values() {
		b.WriteString(v.File + "=" + v.Data + ";")
	}
	for _, f := range files {
		b.WriteString(f.File + ":" + f.Found + ";")
	}
	return b.String()
}

// path is the container's cgroup, from its PID 1 (cached: a container's
// cgroup does not move).
func (c *Checker) path(ctx context.Context, id string) (string, error) {
	c.mu.Lock()
	p, ok := c.paths[id]
	c.mu.Unlock()
	if ok {
		return p, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ct, err := c.rt.Get(cctx, id)
	if err != nil {
		return "", err
	}
	if !ct.Running() || ct.PID <= 0 {
		return "", fmt.Errorf("container %s is %s", id, ct.State)
	}
	p, err = c.cg.PathOf(ct.PID)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.paths[id] = p
	c.mu.Unlock()
	return p, nil
}
