package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
)

// Companion intents. In Kubernetes mode the kubelet owns in-place resize:
// it admits a pod's resize against every pod on the node, actuates it and
// reports it (kubelet pkg/kubelet/allocation, pkg/kubelet/status). The
// agent then only follows: agent/kube turns a request into a pods/resize
// patch and reports the kubelet's verdict in an intent that the agent
// holds, lists and streams like any other, but never admits on its ledger,
// never journals (the pod is the durable record; agent/kube derives the
// same intent ID from it after a restart) and never actuates.

// WithKubeletOwnsPods says that a kubelet owns the resources of the
// Kubernetes pods on this node: the agent's API then refuses intents whose
// target belongs to a pod (ErrKubeletOwned). Who may change a pod's
// resources is the API server's to decide (RBAC on pods/resize, quota,
// LimitRange); the agent's socket and tokens authenticate node root and
// its operators, not Kubernetes principals, so a change through them would
// bypass it.
func WithKubeletOwnsPods() Option { return func(a *Agent) { a.kubeletOwnsPods = true } }

// ErrKubeletOwned is returned for an API intent that targets a container
// of a Kubernetes pod on a node whose kubelet owns pod resources.
var ErrKubeletOwned = fmt.Errorf("%w: the kubelet owns this pod's resources", ErrForbidden)

// ErrForbidden is returned for a request the agent does not serve to
// anyone, whatever the credentials.
var ErrForbidden = fmt.Errorf("forbidden")

// kubeletPodCgroup matches a kubelet pod cgroup's name: pod<uid> (cgroupfs
// driver) or ...-pod<uid with underscores>.slice (systemd driver).
var kubeletPodCgroup = regexp.MustCompile(`(^pod[0-9a-fA-F-]{36}$)|(-pod[0-9a-fA-F_]{36}\.slice$)`)

// kubeletPod reports whether the target resolved to a container of a
// Kubernetes pod: a runtime container with a pod UID, or a cgroup below a
// kubelet pod cgroup.
func kubeletPod(res resolved) (string, bool) {
	if res.ctr != nil && res.ctr.PodUID != "" {
		return "pod " + res.ctr.PodUID, true
	}
	for p := res.cgroup; p != "/" && p != "." && p != ""; p = path.Dir(p) {
		if kubeletPodCgroup.MatchString(path.Base(p)) {
			return "pod cgroup " + p, true
		}
	}
	return "", false
}

// Follow records an intent whose resize the kubelet carries out: it is
// validated and held (Get, List, Watch, the API), starts Proposed, and
// changes only through Report. It is not admitted, journaled or applied.
// created is false when an intent of the same ID and spec is held already.
func (a *Agent) Follow(origin intent.Origin, spec intent.Spec) (intent.Intent, bool, error) {
	spec, _, err := intent.Validate(spec)
	if err != nil {
		return intent.Intent{}, false, err
	}
	if spec.ID == "" {
		return intent.Intent{}, false, fmt.Errorf("%w: a followed intent needs an ID", intent.ErrInvalid)
	}
	spec.Resources = *spec.Resources.DeepCopy()
	spec.ResizePolicy = slices.Clone(spec.ResizePolicy)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return intent.Intent{}, false, ErrShuttingDown
	}
	if old, ok := a.hist.intents[spec.ID]; ok {
		if !sameSpec(old.Spec, spec) {
			return intent.Intent{}, false, fmt.Errorf("%w: intent %s was accepted with another spec", ErrConflict, spec.ID)
		}
		return old.Intent, false, nil
	}
	now := a.now()
	a.seq++
	r := &record{Intent: intent.Intent{ID: spec.ID, Origin: origin, Spec: spec, Status: intent.Status{
		State: intent.Proposed, AcceptedAt: now, UpdatedAt: now, Via: ViaKubelet,
	}}, seq: a.seq, followed: true}
	a.hist.add(r)
	addInFlight(a.metrics, 1)
	a.hub.publish(Event{Type: "ADDED", Intent: r.Intent})
	a.log.Info("intent followed", "intent", r.ID, "origin", origin, "pod", spec.Target.PodUID, "container", spec.Target.Name)
	a.hist.evict(a.history)
	return r.Intent, true, nil
}

// ViaKubelet is Status.Via of a followed intent: the kubelet changed the
// cgroups, through pods/resize.
const ViaKubelet = "kubelet"

// Report sets the state of a followed intent, as the kubelet's verdict
// says, and tells the watchers if anything changed. Unlike the agent's own
// intents, a followed one may leave Failed or Infeasible again: the kubelet
// retries an Error and re-evaluates an Infeasible resize when the node
// changes, and the intent says what the kubelet says now. Superseded is
// final.
func (a *Agent) Report(id string, s intent.State, reason, msg string) (intent.Intent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.hist.intents[id]
	if !ok {
		return intent.Intent{}, fmt.Errorf("%w: intent %q", ErrNotFound, id)
	}
	if !r.followed {
		return intent.Intent{}, fmt.Errorf("%w: intent %s is the agent's own, not a followed one", ErrConflict, id)
	}
	st := &r.Status
	if st.State == intent.Superseded || (st.State == s && st.Reason == reason && st.Message == msg) {
		return r.Intent, nil
	}
	was := st.State
	st.State, st.Reason, st.Message = s, reason, msg
	now := a.now()
	st.UpdatedAt = now
	switch {
	case s.Terminal() && !was.Terminal():
		st.CompletedAt = &now
		addInFlight(a.metrics, -1)
		if a.metrics != nil {
			a.metrics.Resizes.WithLabelValues(strings.ToLower(string(s))).Inc()
		}
	case !s.Terminal() && was.Terminal():
		st.CompletedAt = nil
		addInFlight(a.metrics, 1)
	}
	level := slog.LevelInfo
	if s == intent.Failed || s == intent.Infeasible {
		level = slog.LevelWarn
	}
	a.log.Log(context.Background(), level, "followed intent "+strings.ToLower(string(s)), "intent", id, "reason", reason, "message", msg,
		"after", now.Sub(st.AcceptedAt).Round(time.Millisecond))
	a.hub.publish(Event{Type: "MODIFIED", Intent: r.Intent})
	return r.Intent, nil
}

// Verify reads, without writing anything, the cgroup files of a pod's
// container found through the runtime and reports whether they hold what
// want gives (cpu.weight and cpu.max from the cpu request and limit,
// memory.max from the memory limit, converted as runc does), and, when they
// do not, what they hold.
func (a *Agent) Verify(ctx context.Context, podUID, name string, want intent.Resources) (bool, string, error) {
	if a.rt == nil {
		return false, "", fmt.Errorf("%w: no container runtime to find the container (set --cri-endpoint)", ErrRuntime)
	}
	ct, err := a.rt.Find(ctx, podUID, name)
	if err != nil {
		return false, "", fmt.Errorf("%w: %w", ErrRuntime, err)
	}
	if !ct.Running() {
		return false, "", fmt.Errorf("%w: container %s is %s", ErrNotFound, ct.ID, ct.State)
	}
	p, err := a.cg.PathOf(ct.PID)
	if err != nil {
		return false, "", fmt.Errorf("%w: cgroup of container %s (pid %d): %w", ErrNotFound, ct.ID, ct.PID, err)
	}
	st, err := a.cg.Read(p)
	if err != nil {
		return false, "", fmt.Errorf("reading the cgroup of container %s: %w", ct.ID, err)
	}
	files := a.act.ContainerFiles(p, want, true, true)
	held := fmt.Sprintf("%s holds cpu.weight %d, cpu.max %s, memory.max %s", p, st.CPUWeight, st.CPUMax, memString(st.MemoryMax))
	return st.Matches(files, a.cg.PageSize()), held, nil
}

func memString(v int64) string {
	if v < 0 {
		return "max"
	}
	return fmt.Sprint(v)
}
