package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// ExitWatcher reports when a watched cgroup empties or is removed;
// *cgroup.Watcher implements it. Errors reports that it may have missed
// events (an inotify queue overflow): Run then looks at every container.
type ExitWatcher interface {
	Watch(path string) error
	Unwatch(path string)
	Events() <-chan cgroup.Event
	Errors() <-chan error
}

// exitWatch is the ExitWatcher, if any, with what watching needs.
type exitWatch struct {
	w   ExitWatcher
	log *slog.Logger
}

// follow starts watching c's cgroup for its exit, and stops watching old
// (its previous cgroup, when it was restarted), if not "".
func (x exitWatch) follow(c *container, old string) {
	c.watched = false
	if x.w == nil {
		return
	}
	if old != "" && old != c.cgroup {
		x.w.Unwatch(old)
	}
	err := x.w.Watch(c.cgroup)
	c.watched = err == nil
	if err != nil {
		// Resync still finds the cgroup gone, only later.
		x.log.Warn("cannot watch container for its exit", "container", c.name, "cgroup", c.cgroup, "err", err)
	}
}

func (x exitWatch) unwatch(path string) {
	if x.w != nil {
		x.w.Unwatch(path)
	}
}

// handleExit acts on a cgroup that emptied or went away.
func (a *Agent) handleExit(ctx context.Context, e cgroup.Event) {
	a.mu.Lock()
	c := a.containers.atCgroup(e.Path)
	if c == nil {
		a.mu.Unlock()
		return
	}
	c.ctr = nil // whatever follows, ask the runtime again
	c.pod.staleListing()
	if c.running || c.admitted != nil {
		// The worker forgets it when its apply ends (see apply).
		c.exited, c.exitedRemoved = e.Path, e.Removed
		a.mu.Unlock()
		return
	}
	if c.runtimeID == "" || e.Removed || a.rt == nil {
		a.exitedLocked(c)
		a.mu.Unlock()
		return
	}
	id, podUID, name := c.runtimeID, c.podUID, c.name
	a.mu.Unlock()

	// A runtime's container that exited is forgotten as a bare cgroup is
	// (Resync does the same once its cgroup is gone), unless the runtime
	// already runs its next attempt: then the agent follows that one.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var next *cri.Container
	var nextCgroup string
	if ct, err := a.rt.Find(rctx, podUID, name); podUID != "" && err == nil && ct.Running() && ct.ID != id {
		if p, err := a.cg.PathOf(ct.PID); err == nil {
			next, nextCgroup = &ct, p
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.containers[c.key]; !ok || cur != c || c.runtimeID != id || c.running {
		return // forgotten, followed or busy meanwhile
	}
	if next == nil {
		a.exitedLocked(c)
		return
	}
	old := c.cgroup
	c.runtimeID, c.cgroup, c.ctr = next.ID, nextCgroup, next
	a.exits.follow(c, old)
	c.pod.staleListing()
	a.log.Info("container restarted by its runtime; following the new one", "container", c.name, "runtimeID", c.runtimeID, "cgroup", c.cgroup)
}

// exitSeenLocked acts on the exit handleExit left to c's worker, now that
// the worker lets go of c: a bare cgroup, or one removed, is forgotten; a
// runtime's container goes back to handleExit, which follows the runtime's
// next attempt when it already runs. Forgetting it here as well (until
// 2026-12-07) dropped a container restarted by its runtime just as the
// agent resized it, and freed its capacity while its next attempt ran.
func (a *Agent) exitSeenLocked(c *container) {
	e := cgroup.Event{Path: c.exited, Removed: c.exitedRemoved}
	if c.runtimeID == "" || e.Removed || a.rt == nil || a.closing {
		a.exitedLocked(c)
		return
	}
	c.exited, c.exitedRemoved = "", false
	a.workers.Add(1) // the worker letting go still holds one: Close waits for this too
	go func() {
		defer a.workers.Done()
		a.handleExit(a.ctx, e)
	}()
}

// exitedLocked forgets a container that exited, which frees its capacity
// for Deferred intents at once.
func (a *Agent) exitedLocked(c *container) {
	c.exited, c.exitedRemoved = "", false
	a.forgetLocked(c, "container exited: its cgroup "+c.cgroup+" has no process left")
}
