package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/resizer/resize-agent/cri"
)

// A runtime that hangs is a normal day, and no request the agent refuses
// may take effect later. An intent for a container the agent knows is
// accepted without asking the runtime for the container (issue 16), so
// the agent must still know that the runtime answers before it accepts
// one: runtimeGate, which every runtime call of the agent goes through,
// keeps what the calls showed of the runtime's liveness, and asks the
// runtime for its version (cheap, bounded) when that is not enough.
//
// Like the kubelet, which stops syncing pods once its last successful
// runtime status check is older than a threshold (pkg/kubelet/runtime.go,
// runtimeState.runtimeErrors, fed by Kubelet.updateRuntimeUp), the agent
// trusts the runtime only for a while after it last answered; unlike the
// kubelet, which polls every 5 s, it asks when an intent needs to know,
// and it does not trust a runtime that has a call outstanding it has not
// answered anything since: that call may be the one hanging.
const liveFor = time.Second // how long an answer from the runtime vouches for it

// probeTimeout bounds the version call that asks whether the runtime
// answers: a runtime that answers answers that at once. A variable for
// tests.
var probeTimeout = 2 * time.Second

// errRuntimeDown is why a call was not made: the runtime did not answer
// the last call or the probe.
var errRuntimeDown = errors.New("the container runtime did not answer")

// runtimeGate is the agent's Runtime with the liveness record.
type runtimeGate struct {
	Runtime
	now func() time.Time

	mu sync.Mutex
	// Events are numbered: a call's start, and an answer.
	ev       uint64
	inflight map[uint64]struct{} // the start events of the calls in flight
	answered uint64              // the event of the last answer, 0: none
	at       time.Time           // when it came
	down     error               // the last call or probe went unanswered; nil once one is answered
	probe    *liveProbe          // the probe in flight, shared by all who need it
}

type liveProbe struct {
	done chan struct{}
	err  error
}

func newRuntimeGate(rt Runtime) *runtimeGate {
	return &runtimeGate{Runtime: rt, now: time.Now, inflight: map[uint64]struct{}{}}
}

// unanswered reports whether err means the runtime did not answer (a
// timeout, a socket nobody serves), rather than answered with an error.
func unanswered(err error) bool {
	return errors.Is(err, cri.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errRuntimeDown)
}

// track runs call, recording its start and whether the runtime answered.
func (g *runtimeGate) track(call func() error) error {
	g.mu.Lock()
	g.ev++
	start := g.ev
	g.inflight[start] = struct{}{}
	g.mu.Unlock()
	err := call()
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.inflight, start)
	switch {
	case unanswered(err):
		g.down = err
	case errors.Is(err, context.Canceled):
		// The agent gave up (it is closing): says nothing of the runtime.
	default:
		g.ev++
		g.answered, g.at, g.down = g.ev, g.now(), nil
	}
	return err
}

// trusted reports whether the runtime may be taken to answer without
// asking it: it answered less than liveFor ago, after every call in
// flight was made.
func (g *runtimeGate) trustedLocked() bool {
	if g.down != nil || g.answered == 0 || g.now().Sub(g.at) >= liveFor {
		return false
	}
	for start := range g.inflight {
		if start > g.answered {
			return false
		}
	}
	return true
}

// live returns nil when the runtime answers: at once when it is trusted,
// else after asking it for its version (one probe at a time, shared). It
// returns an error matching errRuntimeDown and cri.ErrUnavailable when the
// runtime did not answer within probeTimeout.
func (g *runtimeGate) live() error {
	g.mu.Lock()
	if g.trustedLocked() {
		g.mu.Unlock()
		return nil
	}
	p := g.probe
	first := p == nil
	if first {
		p = &liveProbe{done: make(chan struct{})}
		g.probe = p
	}
	g.mu.Unlock()
	if !first {
		<-p.done
		return p.err
	}
	err := g.track(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		_, err := g.Runtime.Version(ctx)
		return err
	})
	switch {
	case err == nil:
	case unanswered(err):
		err = fmt.Errorf("%w within %v (CRI Version): %w", errRuntimeDown, probeTimeout, err)
	default:
		// It answered, if with an error (a runtime without Version): it
		// is alive, and track took it so.
		err = nil
	}
	g.mu.Lock()
	p.err, g.probe = err, nil
	g.mu.Unlock()
	close(p.done)
	return err
}

// unlessDown returns nil at once unless the last call or probe went
// unanswered; then it asks (live).
func (g *runtimeGate) unlessDown() error {
	g.mu.Lock()
	down := g.down != nil
	g.mu.Unlock()
	if !down {
		return nil
	}
	return g.live()
}

// sendable returns nil when a call that changes a container may be sent:
// unless the last call went unanswered, at once. A call sent to a runtime
// that hangs would be carried out once it resumes, after the agent has
// given up on it, so one that has not answered since is asked first.
func (g *runtimeGate) sendable() error {
	if err := g.unlessDown(); err != nil {
		// Matches cri.ErrUnavailable: the intent fails RuntimeUnavailable.
		return fmt.Errorf("not sent: %w: %w", cri.ErrUnavailable, err)
	}
	return nil
}

func (g *runtimeGate) Find(ctx context.Context, podUID, name string) (ct cri.Container, err error) {
	err = g.track(func() error { ct, err = g.Runtime.Find(ctx, podUID, name); return err })
	return ct, err
}

func (g *runtimeGate) Get(ctx context.Context, id string) (ct cri.Container, err error) {
	err = g.track(func() error { ct, err = g.Runtime.Get(ctx, id); return err })
	return ct, err
}

func (g *runtimeGate) Version(ctx context.Context) (v string, err error) {
	err = g.track(func() error { v, err = g.Runtime.Version(ctx); return err })
	return v, err
}

func (g *runtimeGate) Update(ctx context.Context, id string, r cri.Resources) error {
	if err := g.sendable(); err != nil {
		return err
	}
	return g.track(func() error { return g.Runtime.Update(ctx, id, r) })
}

func (g *runtimeGate) Restart(ctx context.Context, id string, r cri.Resources, stopTimeout time.Duration) (ct cri.Container, err error) {
	if err := g.sendable(); err != nil {
		return cri.Container{}, err
	}
	err = g.track(func() error { ct, err = g.Runtime.Restart(ctx, id, r, stopTimeout); return err })
	return ct, err
}

// podLister is the optional part of a Runtime that lists a pod's
// containers (actuate.Actuator.PodContainers); *cri.Client has it.
type podLister interface {
	PodContainers(ctx context.Context, podUID string) ([]cri.Container, error)
}

// PodContainers lists through the runtime when it can; nil, nil when it
// cannot, as the actuator treats a runtime without it.
func (g *runtimeGate) PodContainers(ctx context.Context, podUID string) (out []cri.Container, err error) {
	pl, ok := g.Runtime.(podLister)
	if !ok {
		return nil, nil
	}
	err = g.track(func() error { out, err = pl.PodContainers(ctx, podUID); return err })
	return out, err
}
