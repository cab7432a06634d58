package allocdrift

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

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
	// Recorder, when set, gets an Event per drift acted on.
	Recorder Recorder
	// OnFinding, when set, is called for every drift acted on (the
	// daemon logs it).
	OnFinding func(Finding)
	Now       func() time.Time
}

// Finding is one drift acted on.
type Finding struct {
	Pod       types.NamespacedName
	Container string
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
	return &Checker{pods: pods, rt: rt, cg: cg, opts: opts, state: map[string]*drift{}, paths: map[string]string{}}, nil
}

// Result sums up one Check.
type Result struct {
	Checked  int       // containers whose files were compared
	Drifted  int       // containers that differ now (confirmed or not)
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
}

// targets lists the running containers of pods whose allocation is
// settled: not a pod being resized (PodResizeInProgress, or a spec that
// differs from the status without the kubelet having said
// PodResizePending), nor one being deleted.
func targets(pods []*corev1.Pod) []target {
	var out []target
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || hasCondition(p, corev1.PodResizeInProgress) {
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
				ts = append(ts, target{pod: p, name: st.Name, id: id, res: *st.Resources})
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
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		for _, l := range [][2]corev1.ResourceList{{a.Requests, b.Requests}, {a.Limits, b.Limits}} {
			x, okx := l[0][r]
			y, oky := l[1][r]
			if okx != oky || (okx && x.Cmp(y) != 0) {
				return false
			}
		}
	}
	return true
}

// Check compares every settled container once and acts on confirmed
// drift.
func (c *Checker) Check(ctx context.Context) Result {
	var res Result
	if c.opts.Policy == PolicyOff {
		return res
	}
	now := c.opts.Now()
	seen := map[string]bool{}
	for _, t := range targets(c.pods()) {
		if ctx.Err() != nil {
			break
		}
		path, err := c.path(ctx, t.id)
		if err != nil {
			continue // gone or not ours to read: the next check sees
		}
		st, err := c.cg.Read(path)
		if err != nil {
			continue
		}
		seen[t.id] = true
		res.Checked++
		want := Expected(t.res, c.opts.Period)
		files := Differ(st, want, c.cg.PageSize())
		c.mu.Lock()
		d := c.state[t.id]
		if d != nil {
			d.restoresAt = pruned(d.restoresAt, now, c.opts.Window)
			if d.backoff && len(d.restoresAt) == 0 {
				// The backoff is over: a drift still there is acted on anew.
				d.backoff, d.acted, d.first = false, false, now
			}
		}
		if len(files) == 0 {
			if d != nil && len(d.restoresAt) == 0 {
				delete(c.state, t.id)
			} else if d != nil {
				d.sig, d.acted = "", false // the restores stay counted
			}
			c.mu.Unlock()
			continue
		}
		res.Drifted++
		sig := signature(want, files)
		if d == nil {
			d = &drift{}
			c.state[t.id] = d
		}
		if d.sig != sig {
			d.sig, d.first, d.acted = sig, now, false
		}
		if d.acted {
			c.mu.Unlock()
			continue
		}
		if now.Sub(d.first) < c.opts.Confirm {
			res.Recheck = true
			c.mu.Unlock()
			continue
		}
		f := Finding{Pod: types.NamespacedName{Namespace: t.pod.Namespace, Name: t.pod.Name}, Container: t.name, ID: t.id,
			Cgroup: path, Files: files, FirstSeen: d.first}
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
			err := c.rt.Update(rctx, t.id, RuntimeResources(t.res, c.opts.Period))
			cancel()
			if err != nil {
				action, f.Message = ActionReport, "the restore through the runtime failed: "+err.Error()
			} else {
				f.Message = "the kubelet's values written back through the runtime"
				res.Recheck = true
			}
			c.mu.Lock()
			if err == nil {
				d.acted = false // verified at the next check
				d.sig = ""
			}
			c.mu.Unlock()
		}
		f.Action = action
		c.act(t.pod, f)
		res.Findings = append(res.Findings, f)
	}
	c.mu.Lock()
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
	c.mu.Unlock()
	return res
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
