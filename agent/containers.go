package agent

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/pressure"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// Key addresses a managed container the way an intake knows it: a
// runtime's container by pod UID and name (which outlive a restart), or by
// ID when it has no pod; a bare cgroup by its path.
type Key struct {
	PodUID, Name string
	ContainerID  string
	Cgroup       string
}

// String is the key as the journal and the ledger record it.
func (k Key) String() string {
	switch {
	case k.PodUID != "":
		return "pod:" + k.PodUID + "/" + k.Name
	case k.ContainerID != "":
		return "container:" + k.ContainerID
	}
	return k.Cgroup
}

// container is one container the agent manages, keyed by its cgroup path
// (a bare cgroup) or by pod UID and name (a runtime's container, whose ID and
// cgroup change when it is restarted).
type container struct {
	key, name string
	pod       *pod   // nil: no pod cgroup kept in step
	cgroup    string // its cgroup now
	runtimeID string // "" for a bare cgroup
	podUID    string
	// res is what the container was last given; for a resource no intent
	// has declared yet (cpu, mem false), the limit inferred from its cgroup.
	// The agent writes only the files of declared resources.
	res      intent.Resources
	cpu, mem bool
	// reported: the undeclared resources of res are what the runtime
	// reports for the container (reportedResources), not a guess from its
	// cgroup, and so are its requests.
	reported bool
	// kubeletHigh: the runtime's record of the container holds a
	// memory.high the kubelet set under MemoryQoS (actuate.Job).
	kubeletHigh bool
	pending     *record // the next intent to run: Proposed or Deferred
	running     bool
	last        string // ID of the last intent to reach a terminal state
	// newest is the newest intent accepted, which a late older one must
	// not supersede (recover.go).
	newest *record
	// admitted is an intent admitted by retryDeferredLocked, with its
	// reservation made, for the worker to apply.
	admitted *admittedIntent
	// exited is the cgroup reported emptied while the worker ran, and
	// exitedRemoved whether it was removed.
	exited        string
	exitedRemoved bool
	// ctr is the runtime's container as the runtime last reported it, which
	// resolves the container's next intents without asking the runtime
	// again; nil when the agent must ask (it never did, a resize failed, the
	// container was restarted). See Agent.known.
	ctr *cri.Container
	// watched: the exit watcher reports when its cgroup empties or goes,
	// so that Resync need not look (but for its every fullResync-th round).
	watched bool
}

func (c *container) podPath() string {
	if c.pod == nil {
		return ""
	}
	return c.pod.cgroup
}

func idle(c *container) bool { return !c.running && c.pending == nil }

// qos is the QoS class of c's pod (or of c alone) if c had res: over the
// managed members and the pod's other containers as the runtime reports
// them.
func (c *container) qos(res intent.Resources) corev1.PodQOSClass {
	all := []intent.Resources{res}
	if c.pod != nil {
		for _, o := range c.pod.members {
			if o != c {
				all = append(all, o.res)
			}
		}
		all = append(all, c.pod.others...)
	}
	return intent.QOSClass(all...)
}

// placedQOS is the QoS class the kubelet gave c's pod, read from where it
// put the pod's cgroup, above c's (pkg/kubelet/cm/qos_container_manager_linux.go:
// kubepods/burstable/pod<uid>, kubepods-burstable-pod<uid>.slice; the same
// for besteffort), false when the path does not say. It settles what the
// runtime's record cannot: a container whose only resource is a memory
// request looks BestEffort there (no runtime carries a memory request).
func (c *container) placedQOS() (corev1.PodQOSClass, bool) {
	for _, seg := range strings.Split(c.cgroup, "/") {
		switch {
		case seg == "burstable" || strings.HasPrefix(seg, "kubepods-burstable"):
			return corev1.PodQOSBurstable, true
		case seg == "besteffort" || strings.HasPrefix(seg, "kubepods-besteffort"):
			return corev1.PodQOSBestEffort, true
		}
	}
	return "", false
}

// known reports whether c's requests and limits are all known, so that its
// QoS class can be judged: declared, or reported by the runtime.
func (c *container) known() bool { return c.reported || (c.cpu && c.mem) }

// fresh says, per resource, whether an intent's limit given without its
// request also sets the request (intent.Change.Apply): only for a
// resource neither declared nor reported by the runtime.
func (c *container) fresh() (cpu, mem bool) {
	return !c.cpu && !c.reported, !c.mem && !c.reported
}

// adoptReported takes what the runtime reports for the container as its
// resources, for those no intent has declared.
func (c *container) adoptReported(r intent.Resources) {
	c.reported = true
	if !c.cpu {
		c.res.CPURequest, c.res.CPULimit = r.CPURequest, r.CPULimit
	}
	if !c.mem {
		c.res.MemoryRequest, c.res.MemoryLimit = r.MemoryRequest, r.MemoryLimit
	}
}

// reportedResources is what the runtime's record of a container (CRI
// ContainerStatus resources) says of its requests and limits, false when
// it reports none. The memory request never reaches the runtime: it is
// taken equal to the memory limit, as the API server defaults a request to
// its limit, and 0 without one.
func reportedResources(r cri.Resources) (intent.Resources, bool) {
	if r == (cri.Resources{}) {
		return intent.Resources{}, false
	}
	out := actuate.FromRuntime(r)
	out.MemoryRequest = out.MemoryLimit
	return out, true
}

// pod is a pod-level cgroup the agent keeps in step with the managed
// containers in it. Its members are kept as containers are registered and
// forgotten, so that nothing scans every container to find them.
type pod struct {
	cgroup  string
	members []*container
	// others are the pod's running containers the agent does not manage,
	// as the runtime last reported them (for the QoS class).
	others []intent.Resources
	// resize is held by a member's apply from reading its siblings' values
	// for the pod's sums to committing its own, so that resizes of a pod's
	// containers at the same time each sum the others' committed values
	// (the kubelet resizes a pod as one unit, doPodResizeAction). It is
	// taken without a.mu held, and a.mu may be taken under it.
	resize sync.Mutex
	// listed is the pod's running containers as the runtime last listed
	// them, for the pod cgroup's sums; listedOK false: list again before the
	// next resize. Refreshed at registration, by the drift check, and after
	// a member exits, is restarted or fails a resize, so that a resize
	// does not list the pod (issue 16).
	listed   []cri.Container
	listedOK bool
	// marks are the limit-write marks of the pod cgroup's children, taken
	// just before listed was listed (nil: not taken). While the pod
	// cgroup has the same children and those that are not members hold
	// the same marks, no container of the pod the agent does not manage
	// has started, stopped or been updated (each writes its cgroup's
	// limit files), and listed still holds: a resize of a container with
	// unmanaged siblings need not list the pod (issue 16).
	marks    map[string]pressure.WriteMark
	markedAt time.Time
}

// setListing records the pod's containers as the runtime listed them.
func (p *pod) setListing(listed []cri.Container) {
	p.setOthers(listed)
	p.listed, p.listedOK, p.marks = listed, listed != nil, nil
}

// staleListing makes the next resize of the pod list it again.
func (p *pod) staleListing() {
	if p != nil {
		p.listedOK = false
	}
}

// pods are the pods of the managed containers, by pod cgroup path; a.mu
// guards them.
type pods map[string]*pod

// join adds c to the pod at path, made on first sight; "" is no pod.
func (ps pods) join(path string, c *container) *pod {
	if path == "" {
		return nil
	}
	p := ps[path]
	if p == nil {
		p = &pod{cgroup: path}
		ps[path] = p
	}
	p.members = append(p.members, c)
	return p
}

// leave takes c out of its pod, and drops the pod when it was the last.
func (ps pods) leave(c *container) {
	p := c.pod
	if p == nil {
		return
	}
	p.members = slices.DeleteFunc(p.members, func(o *container) bool { return o == c })
	if len(p.members) == 0 && ps[p.cgroup] == p {
		delete(ps, p.cgroup)
	}
}

// sizing is the pod's members as the pod cgroup sums them (PodFiles), self
// first, with res and the declared resources cpu, mem in place of self's.
func (p *pod) sizing(self *container, res intent.Resources, cpu, mem bool) []actuate.Member {
	out := []actuate.Member{{RuntimeID: self.runtimeID, Resources: res, CPU: cpu, Memory: mem}}
	for _, o := range p.members {
		if o != self {
			out = append(out, actuate.Member{RuntimeID: o.runtimeID, Resources: o.res, CPU: o.cpu, Memory: o.mem})
		}
	}
	return out
}

// speaker is the member the drift check reads the pod cgroup with: the
// first by key that declares a resource.
func (p *pod) speaker() *container {
	var s *container
	for _, o := range p.members {
		if (o.cpu || o.mem) && (s == nil || o.key < s.key) {
			s = o
		}
	}
	return s
}

// setOthers records the listed containers that are not members.
func (p *pod) setOthers(listed []cri.Container) {
	p.others = p.others[:0]
	for _, ct := range listed {
		if !slices.ContainsFunc(p.members, func(o *container) bool { return o.runtimeID == ct.ID }) {
			r, _ := reportedResources(ct.Resources)
			p.others = append(p.others, r)
		}
	}
}

func (p *pod) idle() bool {
	return !slices.ContainsFunc(p.members, func(o *container) bool { return !idle(o) })
}

// podCgroupOf is the pod-level cgroup of a runtime container whose cgroup is
// ctr, when its parent is the kubelet's pod cgroup: "pod<uid>" with the
// cgroupfs driver (kubepods/burstable/pod<uid>), "...-pod<uid with
// underscores>.slice" with the systemd driver. It is "" otherwise: a
// container not placed by the kubelet has no pod cgroup to keep in step.
func podCgroupOf(ctr, podUID string) string {
	if podUID == "" {
		return ""
	}
	parent := path.Dir(ctr)
	base := path.Base(parent)
	if base == "pod"+podUID || strings.HasSuffix(base, "pod"+strings.ReplaceAll(podUID, "-", "_")+".slice") {
		return parent
	}
	return ""
}

// containers are the managed containers by key; a.mu guards them.
type containers map[string]*container

// keyOf finds the key of a managed container by target, for intents
// made without Submit.
func (cs containers) keyOf(t intent.Target) string {
	for _, c := range cs {
		switch {
		case t.PodUID != "" && c.podUID == t.PodUID && c.name == t.Name,
			t.ContainerID != "" && c.runtimeID == t.ContainerID,
			t.CgroupPath != "" && c.runtimeID == "" && c.cgroup == t.CgroupPath:
			return c.key
		}
	}
	return t.CgroupPath
}

// atCgroup is the container whose cgroup is path, nil if none.
func (cs containers) atCgroup(path string) *container {
	for _, c := range cs {
		if c.cgroup == path {
			return c
		}
	}
	return nil
}

// admittedIntent is an admitted intent and what it will apply.
type admittedIntent struct {
	r    *record
	want intent.Resources
}

// Forget stops managing a container (by key, cgroup path or name),
// releases what it held on the ledger and fails its pending intent. A name
// that several containers share (a "web" in two pods) is refused with
// ErrAmbiguous rather than picking one.
func (a *Agent) Forget(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, err := a.lookupLocked(name)
	if err != nil {
		return err
	}
	a.forgetLocked(c, "container removed from the agent")
	return nil
}

// ForgetContainer is Forget for an intake that addresses the container by
// its key.
func (a *Agent) ForgetContainer(k Key) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[k.String()]
	if !ok {
		return fmt.Errorf("%w: container %s", ErrNotFound, k)
	}
	a.forgetLocked(c, "container removed from the agent")
	return nil
}

func (a *Agent) forgetLocked(c *container, why string) {
	if r := c.pending; r != nil {
		a.finishLocked(c, r, intent.Failed, intent.ReasonContainerGone, why)
	}
	if ad := c.admitted; ad != nil {
		c.admitted = nil
		a.finishLocked(c, ad.r, intent.Failed, intent.ReasonContainerGone, why)
	}
	a.exits.unwatch(c.cgroup)
	delete(a.containers, c.key)
	a.pods.leave(c)
	a.journalForgetLocked(c)
	a.ledger.Release(c.key)
	a.log.Info("container forgotten", "container", c.name, "cgroup", c.cgroup, "why", why)
	a.retryDeferredLocked()
}

// fullResync: every fullResync-th Resync also looks at the containers
// the exit watcher watches (5 minutes at the daemon's 10 s), in case an
// event was lost without the watcher saying so; one it says it may have
// missed (Run: ExitWatcher.Errors) makes the next resync full at once. It
// was every sixth, a minute, until the watcher's errors were heard: with
// 1,000 containers a full round is 1,000 opens, a tenth of a second under
// TCG, and the rounds were a fifth of the agent's CPU at rest (issue 16).
const fullResync = 30

// Resync forgets containers whose cgroup has gone, which frees their
// capacity for Deferred intents. The containers the exit watcher watches
// are looked at only every fullResync-th time: the watcher reports their
// exits as they happen, and a resync of every container every interval
// was most of the agent's idle CPU with 1,000 of them (issue 16).
func (a *Agent) Resync() { a.resync(false) }

// resync is Resync, of every container when all is set.
func (a *Agent) resync(all bool) {
	a.mu.Lock()
	a.resyncs++
	full := all || a.resyncs%fullResync == 0
	var idle []*container
	for _, c := range a.containers {
		if !c.running && (full || !c.watched) {
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

// Containers lists the managed containers with their live cgroup values.
func (a *Agent) Containers() []ContainerInfo {
	a.mu.Lock()
	out := make([]ContainerInfo, 0, len(a.containers))
	for _, c := range a.containers {
		ci := ContainerInfo{Name: c.name, CgroupPath: c.cgroup, PodCgroupPath: c.podPath(), ContainerID: c.runtimeID, PodUID: c.podUID, Resources: c.res,
			ManagesCPU: c.cpu, ManagesMemory: c.mem, Allocated: a.ledger.Get(c.key), LastIntent: c.last, QOSClass: intent.QOSClass(c.res)}
		ci.Drift = a.drift.info(c)
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
