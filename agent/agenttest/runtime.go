package agenttest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/cri"
)

// Runtime is an in-memory container runtime (agent.Runtime) for tests of
// clients that name containers by pod UID and name, such as the Kubernetes
// intake: each container has a fake PID whose cgroup is a directory of a
// FakeTree, and an update does to that directory what containerd and runc
// do to the real cgroup. It is no proof that anything works with a real
// runtime: the VM tests use containerd for that.
type Runtime struct {
	cg *cgroup.Manager

	mu      sync.Mutex
	ctrs    map[string]*cri.Container // by ID
	cgroups map[int]string            // PID -> cgroup path
	nextPID int
	updates int
	// held, when set (SetHeld), is received from after each Update has
	// done its work, before it returns.
	held chan struct{}
}

// SetHeld makes every Update, once it has done its work, wait to receive
// from ch before it returns (nil: not at all): a test holds the agent's
// worker there.
func (r *Runtime) SetHeld(ch chan struct{}) {
	r.mu.Lock()
	r.held = ch
	r.mu.Unlock()
}

// NewRuntime returns an empty runtime whose containers live in cg's tree.
func NewRuntime(cg *cgroup.Manager) *Runtime {
	return &Runtime{cg: cg, ctrs: map[string]*cri.Container{}, cgroups: map[int]string{}, nextPID: 1000}
}

// Add starts container name of pod podUID in the (existing) cgroup path
// and returns it.
func (r *Runtime) Add(podUID, name, path string) cri.Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextPID++
	c := &cri.Container{
		ID: fmt.Sprintf("%064x", r.nextPID), Name: name, PodUID: podUID, PID: r.nextPID,
		State: "CONTAINER_RUNNING", CgroupsPath: path, StartedAt: time.Now(),
	}
	r.ctrs[c.ID] = c
	r.cgroups[c.PID] = path
	return *c
}

// Remove stops the pod's container of that name (it is no longer found).
func (r *Runtime) Remove(podUID, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.ctrs {
		if c.PodUID == podUID && c.Name == name {
			delete(r.ctrs, id)
			delete(r.cgroups, c.PID)
		}
	}
}

// Updates is how many UpdateContainerResources calls the runtime got.
func (r *Runtime) Updates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updates
}

// Version implements agent.Runtime.
func (r *Runtime) Version(context.Context) (string, error) { return "agenttest 0", nil }

// Find implements agent.Runtime.
func (r *Runtime) Find(_ context.Context, podUID, name string) (cri.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *cri.Container
	for _, c := range r.ctrs {
		if c.PodUID == podUID && c.Name == name && (best == nil || c.Attempt > best.Attempt) {
			best = c
		}
	}
	if best == nil {
		return cri.Container{}, fmt.Errorf("%w: no running container %q in pod %s", cri.ErrNotFound, name, podUID)
	}
	return *best, nil
}

// PodContainers lists the pod's containers, as cri.Client does.
func (r *Runtime) PodContainers(_ context.Context, podUID string) ([]cri.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []cri.Container
	for _, c := range r.ctrs {
		if c.PodUID == podUID {
			out = append(out, *c)
		}
	}
	return out, nil
}

// Get implements agent.Runtime.
func (r *Runtime) Get(_ context.Context, id string) (cri.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.ctrs[id]
	if !ok {
		return cri.Container{}, fmt.Errorf("%w: %s", cri.ErrNotFound, id)
	}
	return *c, nil
}

// Update implements agent.Runtime as containerd with runc does: shares to
// cpu.weight with runc's formula, quota and period to cpu.max, the memory
// limit to memory.max; zero fields are left alone.
func (r *Runtime) Update(_ context.Context, id string, res cri.Resources) error {
	r.mu.Lock()
	c, ok := r.ctrs[id]
	r.updates++
	var path string
	if ok {
		// Fields of 0 leave the record as it is, as containerd's
		// WithResources leaves the spec.
		merge := func(dst *int64, v int64) {
			if v != 0 {
				*dst = v
			}
		}
		merge(&c.Resources.CPUPeriod, res.CPUPeriod)
		merge(&c.Resources.CPUQuota, res.CPUQuota)
		merge(&c.Resources.CPUShares, res.CPUShares)
		merge(&c.Resources.MemoryLimit, res.MemoryLimit)
		path = r.cgroups[c.PID]
	}
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", cri.ErrNotFound, id)
	}
	var cr cgroup.Resources
	if res.CPUPeriod != 0 {
		w := cgroup.SharesToWeight(uint64(res.CPUShares))
		cr.CPUWeight = &w
		q := res.CPUQuota
		if q <= 0 {
			q = cgroup.Unlimited
		}
		cr.CPUMax = &cgroup.CPUMax{Quota: q, Period: uint64(res.CPUPeriod)}
	}
	if res.MemoryLimit != 0 {
		m := res.MemoryLimit
		cr.MemoryMax = &m
	}
	var err error
	if !cr.IsZero() {
		err = r.cg.Write(path, cr)
	}
	r.mu.Lock()
	held := r.held
	r.mu.Unlock()
	if held != nil {
		<-held
	}
	return err
}

// Restart implements agent.Runtime: the next attempt, with a new ID and
// PID, in the same cgroup, with the resources applied.
func (r *Runtime) Restart(ctx context.Context, id string, res cri.Resources, _ time.Duration) (cri.Container, error) {
	r.mu.Lock()
	old, ok := r.ctrs[id]
	if !ok {
		r.mu.Unlock()
		return cri.Container{}, fmt.Errorf("%w: %s", cri.ErrNotFound, id)
	}
	path := r.cgroups[old.PID]
	delete(r.ctrs, id)
	delete(r.cgroups, old.PID)
	r.nextPID++
	c := *old
	c.ID, c.PID, c.Attempt, c.RestartCount, c.StartedAt = fmt.Sprintf("%064x", r.nextPID), r.nextPID, old.Attempt+1, old.RestartCount+1, time.Now()
	r.ctrs[c.ID] = &c
	r.cgroups[c.PID] = path
	r.mu.Unlock()
	if err := r.Update(ctx, c.ID, res); err != nil {
		return cri.Container{}, err
	}
	return c, nil
}

// Cgroups returns the agent's view of the tree: cg, with the runtime's
// fake PIDs resolved to their cgroups.
func (r *Runtime) Cgroups() agent.Cgroups { return pidCgroups{r.cg, r} }

type pidCgroups struct {
	*cgroup.Manager
	rt *Runtime
}

func (p pidCgroups) PathOf(pid int) (string, error) {
	p.rt.mu.Lock()
	defer p.rt.mu.Unlock()
	if c, ok := p.rt.cgroups[pid]; ok {
		return c, nil
	}
	return "", fmt.Errorf("%w: pid %d", cgroup.ErrNotFound, pid)
}

// RuntimeAgent is a real agent on a FakeTree with a fake Runtime.
type RuntimeAgent struct {
	*agent.Agent
	Runtime *Runtime
	Root    string // the FakeTree
	Ledger  *admission.Ledger
}

// NewRuntimeAgent starts an agent with the given allocatable capacity on an
// empty FakeTree with an empty Runtime, closed when the test ends. Add
// cgroups with AddContainer.
func NewRuntimeAgent(t testing.TB, alloc admission.Capacity, opts ...agent.Option) *RuntimeAgent {
	t.Helper()
	root := cgrouptest.FakeTree(t)
	cg := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	rt := NewRuntime(cg)
	l := admission.NewLedger(alloc)
	opts = append([]agent.Option{agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), agent.WithRuntime(rt)}, opts...)
	a := agent.New(rt.Cgroups(), l, opts...)
	t.Cleanup(func() { a.Close(context.Background()) })
	return &RuntimeAgent{Agent: a, Runtime: rt, Root: root, Ledger: l}
}

// AddContainer creates the container's cgroup at path (kernel defaults)
// and starts it in the runtime.
func (ra *RuntimeAgent) AddContainer(t testing.TB, podUID, name, path string) cri.Container {
	t.Helper()
	cgrouptest.AddFake(t, ra.Root, path)
	return ra.Runtime.Add(podUID, name, path)
}

// File reads a cgroup file of the tree.
func (ra *RuntimeAgent) File(t testing.TB, path, file string) string {
	t.Helper()
	return cgrouptest.ReadFile(t, ra.Root, path, file)
}
