package latency

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
)

// EventResizeMeasured is the reason of the agent's Event on a measured
// resize: its own, never one of the kubelet's.
const EventResizeMeasured = "ResizeMeasured"

// Cgroups is what the tracker reads of the cgroup files; *cgroup.Manager
// implements it.
type Cgroups interface {
	Read(p string) (cgroup.State, error)
	Exists(p string) (bool, error)
	PageSize() int64
}

var _ Cgroups = (*cgroup.Manager)(nil)

// WriteTimes is the kernel's time of the last write to a cgroup's limit
// files; pressure.BPF implements it.
type WriteTimes interface {
	LastLimitWrite(cgroupPath string) (time.Time, bool)
}

var _ WriteTimes = pressure.BPF{}

// Options configure a Tracker. Zero values take the defaults.
type Options struct {
	NodeName string
	Cgroups  Cgroups
	// Sources give the pressure evidence; none: no evidence.
	Sources []pressure.Source
	// Writes, if set, times the writes to the containers' limit files
	// (the eBPF source): the cgroup phase is then the kernel's time of
	// the write rather than of the read that found the values.
	Writes  WriteTimes
	Metrics *metrics.KubeResize
	Logger  *slog.Logger
	// Recorder writes the ResizeMeasured Events (Run makes one if nil).
	Recorder record.EventRecorder
	// Poll is how often the cgroup files of an open resize are read
	// (100ms); SampleEvery how often every container's pressure is
	// (5s); Window the length of the windows before and after (30s).
	Poll, SampleEvery, Window time.Duration
	// Timeout ends a resize not done after it (10m); Grace ends one whose
	// status reports the new values while the files never held them
	// (30s after the status).
	Timeout, Grace time.Duration
	// Now is the clock (time.Now); readings are stamped with it as they
	// are taken.
	Now func() time.Time
	// MaxContainers bounds the containers sampled (256); Keep the
	// measured resizes listed (256).
	MaxContainers, Keep int
}

// Tracker measures the resizes of the pods on one node.
type Tracker struct {
	opts Options
	log  *slog.Logger

	mu   sync.Mutex
	pods map[types.UID]*podTrack
	// waiting are resizes whose phases are done and whose window after is
	// still running; done the last Keep measured resizes, oldest first.
	waiting []*resize
	done    []*resize
	// nextSample is when every container's pressure is read next.
	nextSample time.Time
}

type podTrack struct {
	ref corev1.ObjectReference
	// uid is the UID in the pod's cgroup names: a mirror pod's static
	// pod's (podcgroup.UID), not ref's.
	uid  types.UID
	key  string
	gen  int64
	qos  corev1.PodQOSClass
	spec map[string]corev1.ResourceRequirements
	// podSpec is the pod-level resources (spec.resources; empty without).
	podSpec corev1.ResourceRequirements
	ids     map[string]string // container name -> runtime ID
	// started is when each running container started (its status).
	started map[string]time.Time
	// cgroups located per container name, with the ID they are for.
	cgroups map[string]located
	missed  map[string]missed
	rings   map[string]*ring
	// podCgroup is the pod's own cgroup, located for a pod-level resize;
	// podMissed when it was last looked for in vain.
	podCgroup string
	podMissed time.Time
	open      *resize
}

type located struct{ id, path string }

type resize struct {
	pod  *podTrack
	rec  api.KubeResize
	want map[string]corev1.ResourceRequirements
	// files are the containers' resources as the runtime gets them (with
	// pod-level limits for containers without their own).
	files map[string]corev1.ResourceRequirements
	// podWant is the pod-level resources of a pod-level resize, podFiles
	// what the kubelet writes to the pod cgroup for the new spec; nil
	// without a pod-level change.
	podWant  *corev1.ResourceRequirements
	podFiles podcgroup.Values
	accepted time.Time
	seen     time.Time
	admitted time.Time
	cgroupAt time.Time
	// cgroupBy is when each container's files first held the new values.
	cgroupBy map[string]time.Time
	statusAt time.Time
	mismatch string // the last cgroup files that did not hold the new values
	before   map[string]*api.PressureWindow
	// beforeTaken lists the containers whose reading before is planned;
	// tookBefore is set once every container has one, or can no longer.
	beforeTaken map[string]bool
	tookBefore  bool
	loggedWait  bool
	afterStart  map[string]reading
	until       time.Time // end of the window after
}

// New returns a Tracker; Run watches the node's pods.
func New(opts Options) (*Tracker, error) {
	if opts.NodeName == "" {
		return nil, errors.New("latency: the node name is required")
	}
	if opts.Cgroups == nil {
		return nil, errors.New("latency: cgroups are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.Poll, 100*time.Millisecond)
	def(&opts.SampleEvery, 5*time.Second)
	def(&opts.Window, 30*time.Second)
	def(&opts.Timeout, 10*time.Minute)
	def(&opts.Grace, 30*time.Second)
	if opts.MaxContainers <= 0 {
		opts.MaxContainers = 256
	}
	if opts.Keep <= 0 {
		opts.Keep = 256
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Tracker{opts: opts, log: opts.Logger, pods: map[types.UID]*podTrack{}}, nil
}

// ringSize keeps a window's worth of samples and two more, so that a
// reading at least Window old is at hand when a resize starts.
func (t *Tracker) ringSize() int { return int(t.opts.Window/t.opts.SampleEvery) + 2 }

// stamp is now, or, when it is zero (the daemon's calls), the clock read
// under the lock: a time read before waiting for the lock would be stale
// by the wait, and the phases the informer's handler and the ticker stamp
// would come out of order.
func (t *Tracker) stamp(now time.Time) time.Time {
	if now.IsZero() {
		return t.opts.Now()
	}
	return now
}

// observe takes a pod as the informer hands it at now.
func (t *Tracker) observe(p *corev1.Pod, now time.Time) {
	if p.Spec.NodeName != t.opts.NodeName {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.stamp(now)
	pt := t.pods[p.UID]
	spec := specResources(p)
	if pt == nil {
		// First sight (start-up, a new pod): no resize to time, only a
		// baseline of generation and resources.
		pt = &podTrack{
			ref: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
			key: p.Namespace + "/" + p.Name, gen: p.Generation, spec: spec,
			cgroups: map[string]located{}, missed: map[string]missed{}, rings: map[string]*ring{},
		}
		t.pods[p.UID] = pt
	}
	pt.qos, pt.uid = p.Status.QOSClass, podcgroup.UID(p)
	podSpec := podLevel(p)
	pt.ids = map[string]string{}
	pt.started = map[string]time.Time{}
	// Running init containers are sidecars, resized like containers.
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if cs.State.Running != nil && cs.ContainerID != "" {
			pt.ids[cs.Name] = cs.ContainerID
			pt.started[cs.Name] = cs.State.Running.StartedAt.Time
		}
	}
	if p.Generation > pt.gen {
		changed := changedContainers(pt.spec, spec)
		podChanged := !sameCPUMemory(pt.podSpec, podSpec)
		pt.gen = p.Generation
		if len(changed) > 0 || podChanged {
			if pt.open != nil {
				t.finish(pt.open, "superseded", now)
			}
			r := &resize{pod: pt, want: map[string]corev1.ResourceRequirements{}, files: map[string]corev1.ResourceRequirements{}, seen: now}
			r.rec = api.KubeResize{Pod: pt.key, PodUID: string(p.UID), Generation: p.Generation, Containers: append([]string{}, changed...),
				PodLevel: podChanged, SeenAt: now, Outcome: "open"}
			for _, c := range changed {
				r.want[c] = spec[c]
				r.files[c] = podcgroup.ContainerResources(p, spec[c])
			}
			if podChanged {
				w := podSpec
				r.podWant = &w
				r.podFiles = podcgroup.ForPod(p)
			}
			if m, at, ok := resizeManager(p); ok {
				r.rec.Manager, r.accepted = m, at
				a := at
				r.rec.AcceptedAt = &a
			}
			pt.open = r
		}
	}
	pt.spec, pt.podSpec = spec, podSpec
	if r := pt.open; r != nil {
		t.status(r, p, now)
	}
}

// status reads what the kubelet said of the open resize r.
func (t *Tracker) status(r *resize, p *corev1.Pod, now time.Time) {
	gen := r.rec.Generation
	current := func(observed int64) bool { return observed == 0 || observed >= gen }
	pending := false
	for _, c := range p.Status.Conditions {
		switch c.Type {
		case corev1.PodResizeInProgress:
			if !current(c.ObservedGeneration) {
				continue
			}
			t.admit(r, now, "PodResizeInProgress")
			if r.rec.KubeletAdmittedAt == nil && !c.LastTransitionTime.IsZero() {
				at := c.LastTransitionTime.Time
				r.rec.KubeletAdmittedAt = &at
			}
			if c.Reason == corev1.PodReasonError {
				r.rec.Error = c.Message
			}
		case corev1.PodResizePending:
			if !current(c.ObservedGeneration) {
				continue
			}
			pending = true
			switch c.Reason {
			case corev1.PodReasonDeferred:
				r.rec.Deferred = true
			case corev1.PodReasonInfeasible:
				r.rec.Error = c.Message
				t.finish(r, "infeasible", now)
				return
			}
		}
	}
	if !pending && p.Status.ObservedGeneration >= gen {
		// The kubelet has seen this generation and has nothing pending:
		// it admitted the resize, even if the InProgress condition came
		// and went between two status updates.
		t.admit(r, now, "observedGeneration")
	}
	reported, allocated := true, true
	for name, want := range r.want {
		cs := containerStatus(p, name)
		if cs == nil || cs.Resources == nil || !sameCPUMemory(*cs.Resources, want) {
			reported = false
		}
		if cs == nil || !sameList(cs.AllocatedResources, want.Requests) {
			allocated = false
		}
	}
	if w := r.podWant; w != nil {
		// status.resources is read back from the pod cgroup
		// (CPURequestsFromConfig and friends, pkg/kubelet/cm/helpers_linux.go):
		// compared in the cgroup's units.
		if !podReported(p.Status.Resources, *w) {
			reported = false
		}
		// status.allocatedResources is the pod's whole request
		// (PodRequests of the allocated pod).
		if !sameList(p.Status.AllocatedResources, podcgroup.Requests(p)) {
			allocated = false
		}
	}
	if allocated && !pending && p.Status.ObservedGeneration == 0 {
		// Without observedGeneration (its feature off), the allocation
		// holding the new requests is the kubelet's admission.
		t.admit(r, now, "allocatedResources")
	}
	if reported && r.statusAt.IsZero() {
		// The kubelet writes the files before it reports them (kuberuntime
		// actuates, then the status manager syncs); a status seen before the
		// next poll would stamp the files after the status. Look now.
		if r.cgroupAt.IsZero() && t.locatable(r) {
			c := t.planFiles(r)
			t.checkFiles(c, now)
			t.applyFiles(c)
		}
		t.admit(r, now, "status")
		r.statusAt = now
	}
	t.maybeDone(r, now)
}

func (t *Tracker) admit(r *resize, now time.Time, by string) {
	if r.admitted.IsZero() {
		r.admitted, r.rec.AdmittedBy = now, by
	}
}

// maybeDone completes r once the status reports it and its files hold it.
func (t *Tracker) maybeDone(r *resize, now time.Time) {
	switch {
	case r.statusAt.IsZero():
	case !r.cgroupAt.IsZero(), !t.locatable(r):
		t.finish(r, "completed", now)
	case now.Sub(r.statusAt) >= t.opts.Grace:
		t.finish(r, "completed", now)
	}
}

// locatable reports whether every container of r has a known cgroup, and
// the pod its own for a pod-level resize.
func (t *Tracker) locatable(r *resize) bool {
	for name := range r.want {
		if _, ok := r.pod.cgroups[name]; !ok {
			return false
		}
	}
	return r.podWant == nil || r.pod.podCgroup != ""
}

// finish decides r's outcome, records its phases and, when its files held
// the new values and there are pressure sources, starts the window after.
func (t *Tracker) finish(r *resize, outcome string, now time.Time) {
	if r.pod.open == r {
		r.pod.open = nil
	}
	r.rec.Outcome = outcome
	if !r.accepted.IsZero() {
		r.rec.Phases = append(r.rec.Phases, api.KubeResizePhase{Phase: "accepted", At: r.accepted, Seconds: max(0, r.seen.Sub(r.accepted).Seconds())})
	}
	for _, ph := range []struct {
		name string
		at   time.Time
	}{{"admitted", r.admitted}, {"cgroup", r.cgroupAt}, {"status", r.statusAt}} {
		if !ph.at.IsZero() {
			r.rec.Phases = append(r.rec.Phases, api.KubeResizePhase{Phase: ph.name, At: ph.at, Seconds: ph.at.Sub(r.seen).Seconds()})
		}
	}
	for _, ph := range r.rec.Phases {
		t.opts.Metrics.Observe(ph.Phase, outcome, ph.Seconds)
	}
	for _, name := range r.rec.Containers {
		if at, ok := r.cgroupBy[name]; ok {
			r.rec.ContainerCgroups = append(r.rec.ContainerCgroups, api.ContainerCgroup{Container: name, At: at, Seconds: at.Sub(r.seen).Seconds()})
		}
	}
	if outcome == "completed" && !r.cgroupAt.IsZero() && len(t.opts.Sources) > 0 {
		r.until = r.cgroupAt.Add(t.opts.Window)
		t.waiting = append(t.waiting, r)
		return
	}
	t.record(r)
}

// record writes r's line and keeps it in the list.
func (t *Tracker) record(r *resize) {
	r.rec.Pressure = nil
	for _, name := range r.rec.Containers {
		rp := api.ResizePressure{Container: name, Before: r.before[name]}
		if w, ok := r.afterStart[name]; ok {
			rp.After = t.afterWindow(r, name, w)
		}
		if rp.Before != nil || rp.After != nil {
			r.rec.Pressure = append(r.rec.Pressure, rp)
		}
	}
	r.rec.Summary = summary(&r.rec, r.mismatch)
	t.done = append(t.done, r)
	if len(t.done) > t.opts.Keep {
		t.done = slices.Delete(t.done, 0, len(t.done)-t.opts.Keep)
	}
	if rec := t.opts.Recorder; rec != nil {
		ref := r.pod.ref
		typ := corev1.EventTypeNormal
		if r.rec.Outcome != "completed" {
			typ = corev1.EventTypeWarning
		}
		rec.Event(&ref, typ, EventResizeMeasured, r.rec.Summary)
	}
	t.log.Info("resize measured", "pod", r.rec.Pod, "generation", r.rec.Generation, "summary", r.rec.Summary)
}

// afterWindow is the window from start to the newest reading of the
// container (taken when the window ended).
func (t *Tracker) afterWindow(r *resize, name string, start reading) *api.PressureWindow {
	g := r.pod.rings[name]
	if g == nil {
		return nil
	}
	end, ok := g.atOrBefore(r.until.Add(t.opts.SampleEvery), start)
	if !ok || !end.at.After(start.at) {
		return nil
	}
	return window(start, end)
}

// gone ends the resizes of a deleted pod.
func (t *Tracker) gone(uid types.UID, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now = t.stamp(now)
	pt := t.pods[uid]
	if pt == nil {
		return
	}
	if pt.open != nil {
		t.finish(pt.open, "gone", now)
	}
	delete(t.pods, uid)
}

// tick does the timed work: the cgroup files of open resizes, the pressure
// samples, the windows after that have ended, and timeouts. It decides
// under the lock, reads the files without it and applies what it read
// under it again: on a node short of CPU the reads of a round can take
// seconds, and the informer's handler, which stamps when the agent saw a
// change, must not wait for them (a CI run's node saw a change 10 s after
// another informer of the same daemon had).
func (t *Tracker) tick(at time.Time) {
	t.mu.Lock()
	now := t.stamp(at)
	var plan round
	for _, pt := range t.pods {
		// A container of a resize still waiting for its window before is
		// looked for at every tick, not once in relocate.
		t.locate(pt, now, pt.open != nil && !pt.open.tookBefore)
		r := pt.open
		if r == nil {
			continue
		}
		if r.podWant != nil {
			t.locatePod(pt, now)
		}
		if now.Sub(r.seen) >= t.opts.Timeout {
			t.finish(r, "timeout", now)
			continue
		}
		if !r.tookBefore {
			plan.before = append(plan.before, t.planBefore(r, now)...)
		}
		if r.cgroupAt.IsZero() && t.locatable(r) {
			plan.files = append(plan.files, t.planFiles(r))
		}
	}
	if len(t.opts.Sources) > 0 && !now.Before(t.nextSample) {
		t.nextSample = now.Add(t.opts.SampleEvery)
		plan.samples = t.planSamples()
	}
	keep := t.waiting[:0]
	for _, r := range t.waiting {
		if now.Before(r.until) {
			keep = append(keep, r)
			continue
		}
		plan.ended = append(plan.ended, r)
		for name := range r.afterStart {
			if loc, ok := r.pod.cgroups[name]; ok && r.pod.rings[name] != nil {
				plan.samples = append(plan.samples, sampleRead{g: r.pod.rings[name], pt: r.pod, name: name, path: loc.path})
			}
		}
	}
	t.waiting = keep
	t.mu.Unlock()

	for i := range plan.before {
		plan.before[i].rd = t.read(plan.before[i].path)
	}
	for _, c := range plan.files {
		t.checkFiles(c, at)
	}
	for i := range plan.samples {
		plan.samples[i].rd = t.read(plan.samples[i].path)
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range plan.before {
		if b.r.pod.rings[b.name] != b.g {
			continue // the container was relocated meanwhile
		}
		end := b.rd
		if last, ok := b.g.newest(b.r.seen); ok && (!end.ok() || !end.has(last)) {
			// The cgroup could not be read, or not whole: a restart the
			// resize asked for may have removed it already (CI saw the
			// kubelet's restart beat the agent's first look, and once
			// remove it during the reads). The window before then ends
			// at the container's newest sample before the resize was
			// seen.
			end = last
		}
		if start, ok := b.g.atOrBefore(b.from, end); ok && start.at.Before(end.at) {
			b.r.before[b.name] = window(start, end)
		} else if !b.born.IsZero() {
			b.r.before[b.name] = window(birth(b.born, end), end)
		}
		if b.rd.ok() {
			b.g.add(b.rd)
		}
	}
	for _, c := range plan.files {
		t.applyFiles(c)
	}
	for _, s := range plan.samples {
		if s.pt.rings[s.name] == s.g {
			s.g.add(s.rd)
		}
	}
	for _, r := range plan.ended {
		t.record(r)
	}
	done := t.stamp(at)
	for _, pt := range t.pods {
		if r := pt.open; r != nil {
			t.maybeDone(r, done)
		}
	}
}

// round is what one tick reads outside the lock.
type round struct {
	before  []beforeRead
	files   []*filesCheck
	samples []sampleRead
	ended   []*resize
}

// beforeRead is the reading that ends a resize's window before; from is
// where that window starts. born is when the container started, when that
// is at most two windows back: with no reading of its own yet (a resize
// soon after the start), the window before runs from there.
type beforeRead struct {
	r    *resize
	name string
	g    *ring
	path string
	from time.Time
	born time.Time
	rd   reading
}

// sampleRead is one container's pressure reading for its ring.
type sampleRead struct {
	g    *ring
	pt   *podTrack
	name string
	path string
	rd   reading
}

// filesCheck is one read of an open resize's cgroup files: the paths are
// taken under the lock; r.files, r.podFiles and r.podWant never change
// once r is made, so the read needs no lock.
type filesCheck struct {
	r       *resize
	paths   map[string]string // container name -> cgroup
	podPath string
	// What the read found: at, when it ended; held, the containers whose
	// files held the new values then; mismatch, the first that did not
	// (empty when all did). after starts the window after.
	at       time.Time
	held     []string
	mismatch string
	after    map[string]reading
	// written is the kernel's time of the last write to each held
	// container's limit files, podWritten to the pod cgroup's (zero:
	// unknown).
	written    map[string]time.Time
	podWritten time.Time
}

// locate finds the cgroups of the pod's running containers it has not yet.
// A container whose cgroup is at none of the candidates (another cgroup
// root, a runtime it does not know) is looked for again only after
// relocate, not at every tick.
func (t *Tracker) locate(pt *podTrack, now time.Time, force bool) {
	for name, id := range pt.ids {
		if l, ok := pt.cgroups[name]; ok && l.id == id {
			continue
		}
		if m, ok := pt.missed[name]; ok && m.id == id && now.Sub(m.at) < relocate && !force {
			continue
		}
		delete(pt.cgroups, name)
		delete(pt.rings, name)
		delete(pt.missed, name)
		found := false
		for _, c := range candidates(string(pt.uid), pt.qos, id) {
			if ok, _ := t.opts.Cgroups.Exists(c); ok {
				pt.cgroups[name] = located{id: id, path: c}
				found = true
				break
			}
		}
		if !found {
			pt.missed[name] = missed{id: id, at: now}
		}
	}
	for name := range pt.cgroups {
		if _, ok := pt.ids[name]; !ok {
			delete(pt.cgroups, name)
			delete(pt.rings, name)
		}
	}
}

// locatePod finds the pod's own cgroup: the parent of its containers'
// (pkg/kubelet/cm/pod_container_manager_linux.go names it).
func (t *Tracker) locatePod(pt *podTrack, now time.Time) {
	if pt.podCgroup != "" || now.Sub(pt.podMissed) < relocate {
		return
	}
	for _, c := range podCandidates(string(pt.uid), pt.qos) {
		if ok, _ := t.opts.Cgroups.Exists(c); ok {
			pt.podCgroup = c
			return
		}
	}
	pt.podMissed = now
}

// relocate is how long a container whose cgroup was not found waits before
// it is looked for again.
const relocate = 10 * time.Second

type missed struct {
	id string
	at time.Time
}

// planBefore lists the readings that end r's windows before, from now
// back by Window. A container not located yet is planned at a later tick,
// until its files hold the new values (a reading after that would not be
// "before"); r.tookBefore says when every container has had its turn.
func (t *Tracker) planBefore(r *resize, now time.Time) []beforeRead {
	if len(t.opts.Sources) == 0 {
		r.tookBefore = true
		return nil
	}
	if r.before == nil {
		r.before = map[string]*api.PressureWindow{}
		r.beforeTaken = map[string]bool{}
	}
	var out []beforeRead
	from := now.Add(-t.opts.Window)
	waiting := false
	for name := range r.want {
		if r.beforeTaken[name] {
			continue
		}
		loc, ok := r.pod.cgroups[name]
		if !ok {
			if _, held := r.cgroupBy[name]; !held && r.cgroupAt.IsZero() {
				waiting = true
			}
			continue
		}
		r.beforeTaken[name] = true
		b := beforeRead{r: r, name: name, g: r.pod.rings[name], path: loc.path, from: from}
		// Up to two windows old: a pod's first sampling can come late on
		// a starved node (CI saw a pod resized right after it was Ready,
		// about 33 s after its start, with no reading yet).
		if at := r.pod.started[name]; !at.IsZero() && !at.Before(now.Add(-2*t.opts.Window)) && !at.After(now) {
			b.born = at
		}
		if b.g == nil {
			if b.born.IsZero() {
				continue
			}
			// A container younger than a sampling period has no ring
			// yet; this reading starts it.
			b.g = newRing(t.ringSize())
			r.pod.rings[name] = b.g
		}
		out = append(out, b)
	}
	if !waiting {
		r.tookBefore = true
	} else if len(out) == 0 && now.Sub(r.seen) >= time.Second && !r.loggedWait {
		r.loggedWait = true
		t.log.Info("resize: a container's cgroup is not located yet; its window before waits for it", "pod", r.rec.Pod, "generation", r.rec.Generation)
	}
	return out
}

func (t *Tracker) planFiles(r *resize) *filesCheck {
	c := &filesCheck{r: r, paths: make(map[string]string, len(r.want))}
	for name := range r.want {
		c.paths[name] = r.pod.cgroups[name].path
	}
	if r.podWant != nil {
		c.podPath = r.pod.podCgroup
	}
	return c
}

// checkFiles reads the files of c's containers, and of the pod cgroup for
// a pod-level resize. The first time they all hold the new values is the
// cgroup phase (stamped once the files are read: they held the values by
// then), and the start of the window after.
func (t *Tracker) checkFiles(c *filesCheck, now time.Time) {
	r := c.r
	names := make([]string, 0, len(c.paths))
	for name := range c.paths {
		names = append(names, name)
	}
	sort.Strings(names)
	miss := func(m string) {
		if c.mismatch == "" {
			c.mismatch = m
		}
	}
	for _, name := range names {
		s, err := t.opts.Cgroups.Read(c.paths[name])
		if err != nil {
			miss(name + ": " + err.Error())
			continue
		}
		if m := expect(r.files[name]).mismatch(s, t.opts.Cgroups.PageSize()); m != "" {
			miss(name + ": " + m)
			continue
		}
		c.held = append(c.held, name)
		if w := t.opts.Writes; w != nil {
			if at, ok := w.LastLimitWrite(c.paths[name]); ok {
				if c.written == nil {
					c.written = map[string]time.Time{}
				}
				c.written[name] = at
			}
		}
	}
	if r.podWant != nil {
		s, err := t.opts.Cgroups.Read(c.podPath)
		if err != nil {
			miss("pod cgroup: " + err.Error())
		} else if m := podMismatch(r.podFiles, s, t.opts.Cgroups.PageSize()); m != "" {
			miss("pod cgroup: " + m)
		} else if w := t.opts.Writes; w != nil {
			c.podWritten, _ = w.LastLimitWrite(c.podPath)
		}
	}
	c.at = t.stamp(now)
	if c.mismatch != "" || len(t.opts.Sources) == 0 {
		return
	}
	c.after = make(map[string]reading, len(names))
	for _, name := range names {
		c.after[name] = t.read(c.paths[name])
	}
}

// applyFiles takes what checkFiles found, unless r has ended or had its
// files seen hold the values meanwhile.
func (t *Tracker) applyFiles(c *filesCheck) {
	r := c.r
	if r.pod.open != r || !r.cgroupAt.IsZero() {
		return
	}
	for _, name := range c.held {
		if _, ok := r.cgroupBy[name]; !ok {
			if r.cgroupBy == nil {
				r.cgroupBy = map[string]time.Time{}
			}
			r.cgroupBy[name] = heldSince(r, c.written[name], c.at)
		}
	}
	r.mismatch = c.mismatch
	if c.mismatch != "" {
		return
	}
	// The last of the files to get their values, the pod cgroup's included.
	r.cgroupAt = time.Time{}
	if r.podWant != nil {
		r.cgroupAt = heldSince(r, c.podWritten, c.at)
	}
	for name := range r.want {
		if at := r.cgroupBy[name]; at.After(r.cgroupAt) {
			r.cgroupAt = at
		}
	}
	// The kubelet writes the files only for a resize it admitted: their
	// holding the values is an admission no later than that, even if the
	// handler saw the condition after it.
	if r.admitted.IsZero() || r.admitted.After(r.cgroupAt) {
		r.admitted, r.rec.AdmittedBy = r.cgroupAt, "cgroup"
	}
	r.afterStart = c.after
	for name, rd := range c.after {
		if g := r.pod.rings[name]; g != nil {
			g.add(rd)
		}
	}
}

// heldSince is when files that a read at readAt found holding r's new
// values got them: the kernel's time of their last write (the eBPF hook),
// unless it is unknown or after the read (a later write of the same
// values: then the read) or before the agent saw the change (the kubelet
// quicker than the agent's watch: then when it saw it). A read alone says
// only "by then", and on a node short of CPU the agent's 100 ms reads ran
// 2.4 s after the container's own reads had seen the values.
func heldSince(r *resize, written, readAt time.Time) time.Time {
	switch {
	case written.IsZero(), written.After(readAt):
		return readAt
	case written.Before(r.seen):
		return r.seen
	}
	return written
}

// planSamples lists every located container's pressure reading for its
// ring, up to MaxContainers (pods in name order, so the same ones each
// time).
func (t *Tracker) planSamples() []sampleRead {
	pts := make([]*podTrack, 0, len(t.pods))
	for _, pt := range t.pods {
		pts = append(pts, pt)
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].key < pts[j].key })
	var out []sampleRead
	for _, pt := range pts {
		for name, loc := range pt.cgroups {
			if len(out) >= t.opts.MaxContainers {
				return out
			}
			g := pt.rings[name]
			if g == nil {
				g = newRing(t.ringSize())
				pt.rings[name] = g
			}
			out = append(out, sampleRead{g: g, pt: pt, name: name, path: loc.path})
		}
	}
	return out
}

// Targets lists the running containers of the node's pods whose cgroups
// the tracker has located, for the pressure collector: in Kubernetes mode
// the agent manages no container of its own, and the dashboard's pressure
// row reads these.
func (t *Tracker) Targets() []pressure.Target {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []pressure.Target
	for _, pt := range t.pods {
		for name, l := range pt.cgroups {
			out = append(out, pressure.Target{Name: name, PodUID: string(pt.ref.UID), Cgroup: l.path})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cgroup < out[j].Cgroup })
	return out
}

// Resizes lists the measured resizes, oldest first, then those still open
// or in their window after.
func (t *Tracker) Resizes() []api.KubeResize {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]api.KubeResize, 0, len(t.done)+len(t.waiting))
	for _, r := range t.done {
		out = append(out, r.rec)
	}
	for _, r := range t.waiting {
		rec := r.rec
		rec.Outcome = "open"
		out = append(out, rec)
	}
	for _, pt := range t.pods {
		if pt.open != nil {
			out = append(out, pt.open.rec)
		}
	}
	return out
}

// ServeHTTP serves GET /v1/kube/resizes[?pod=namespace/name].
func (t *Tracker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pod := r.URL.Query().Get("pod")
	if len(pod) > 320 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(api.Error{Error: "pod: at most 320 characters (namespace/name)", Reason: "Invalid"})
		return
	}
	list := t.Resizes()
	if pod != "" {
		list = slices.DeleteFunc(list, func(k api.KubeResize) bool { return k.Pod != pod })
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

func specResources(p *corev1.Pod) map[string]corev1.ResourceRequirements {
	out := make(map[string]corev1.ResourceRequirements, len(p.Spec.Containers)+len(p.Spec.InitContainers))
	for _, c := range p.Spec.InitContainers {
		out[c.Name] = c.Resources
	}
	for _, c := range p.Spec.Containers {
		out[c.Name] = c.Resources
	}
	return out
}

// podLevel is the pod-level resources, empty without.
func podLevel(p *corev1.Pod) corev1.ResourceRequirements {
	if p.Spec.Resources == nil {
		return corev1.ResourceRequirements{}
	}
	return *p.Spec.Resources.DeepCopy()
}

func changedContainers(old, cur map[string]corev1.ResourceRequirements) []string {
	var out []string
	for name, r := range cur {
		if o, ok := old[name]; ok && !sameCPUMemory(o, r) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	for i := range p.Status.InitContainerStatuses {
		if p.Status.InitContainerStatuses[i].Name == name {
			return &p.Status.InitContainerStatuses[i]
		}
	}
	return nil
}

// sameCPUMemory compares the CPU and memory requests and limits, the
// resources an in-place resize changes, by value (1000m is 1).
func sameCPUMemory(a, b corev1.ResourceRequirements) bool {
	return sameList(a.Requests, b.Requests) && sameList(a.Limits, b.Limits)
}

func sameList(a, b corev1.ResourceList) bool {
	for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		x, okx := a[n]
		y, oky := b[n]
		if okx != oky || (okx && x.Cmp(y) != 0) {
			return false
		}
	}
	return true
}

// resizeManager is the field manager and time of the pod's latest write
// through the resize subresource, from managedFields (in 1.33-1.37 a
// running pod's resources change only through it).
func resizeManager(p *corev1.Pod) (string, time.Time, bool) {
	var name string
	var at time.Time
	for _, mf := range p.ManagedFields {
		if mf.Time == nil || mf.Subresource != "resize" {
			continue
		}
		if mf.Time.Time.After(at) {
			name, at = mf.Manager, mf.Time.Time
		}
	}
	return name, at, name != ""
}
