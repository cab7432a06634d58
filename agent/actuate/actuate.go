package actuate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/metrics"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

// Cgroups is what a resize needs of the cgroup filesystem; *cgroup.Manager
// implements it, and the optional storer and memoryShrinker.
type Cgroups interface {
	Read(path string) (cgroup.State, error)
	Write(path string, r cgroup.Resources) error
	PathOf(pid int) (string, error)
	PageSize() int64
}

// narrowCgroups is what *cgroup.Manager offers beyond Cgroups: reads of
// the files a resize changes only, and writes that take what the files
// hold from the read just made. Each file is three system calls, and under
// TCG they were most of a resize's own time (issue 16); a Cgroups without
// them is read and written whole.
type narrowCgroups interface {
	ReadFiles(path string, files ...string) (cgroup.State, error)
	WriteFrom(path string, r cgroup.Resources, cur cgroup.State) error
}

// Runtime is what a resize needs of the container runtime; *cri.Client
// implements it, and the optional podLister.
type Runtime interface {
	Update(ctx context.Context, id string, r cri.Resources) error
	Restart(ctx context.Context, id string, r cri.Resources, stopTimeout time.Duration) (cri.Container, error)
}

// Actuator carries out admitted resizes. It holds its dependencies and
// settings only: nothing of one call is kept for the next, and it is safe
// for concurrent use on different containers.
type Actuator struct {
	Cgroups Cgroups
	Runtime Runtime // nil: containers are resized through their files only
	Period  uint64  // cpu.max period in microseconds
	// ShrinkTimeout bounds how long a memory decrease below usage may spend
	// bringing usage down; 0 means DefaultShrinkTimeout, < 0 refuses such
	// a decrease.
	ShrinkTimeout time.Duration
	Metrics       *metrics.Metrics // nil: nothing recorded
	// MemoryThrottlingFactor is the kubelet's (its memoryThrottlingFactor)
	// for KubeletMemoryHigh; 0 means DefaultMemoryThrottlingFactor.
	MemoryThrottlingFactor float64
}

// Level is one cgroup of a resize and what its files must hold
// (ContainerFiles, PodFiles).
type Level struct {
	Path string
	Want cgroup.Resources
}

// Job is one admitted resize of one container.
type Job struct {
	// Want is what the container is given; Old what it had, for the
	// runtime's record when a step is undone.
	Want, Old intent.Resources
	// CPU and Memory say which resources are declared once it is applied.
	CPU, Memory bool
	RuntimeID   string // "" for a bare cgroup
	// KubeletMemoryHigh: the runtime's record of the container holds a
	// memory.high that the kubelet set under MemoryQoS; every update
	// through the runtime then sets the one the kubelet would for the new
	// resources (runtimeResources). Otherwise memory.high is left alone.
	KubeletMemoryHigh bool
	// Restart: the container is restarted with its new resources (its
	// resizePolicy asks for it for a resource that changes).
	Restart bool
	// AllowMemoryBelowUsage writes a memory limit below usage at once.
	AllowMemoryBelowUsage bool
	Container             Level
	Pod                   *Level // nil: no pod cgroup kept in step
	// BeforeRestart, when set, is called before the container is
	// restarted; an error keeps it from being restarted. The agent
	// journals the restart there.
	BeforeRestart func() error
	// BeforeShrink, when set, is called before a shrink lowers
	// memory.high; an error refuses the decrease. The agent journals the
	// intent as InProgress there, for recovery to put memory.high back.
	BeforeShrink func() error
}

// Phases is the time one resize spent in each phase.
type Phases struct{ Reclaim, Runtime, Verify time.Duration }

// Result is what became of a Job.
type Result struct {
	State   intent.State // Completed or Failed
	Reason  string
	Message string
	// Applied lists the files written and verified, by cgroup path.
	Applied intent.Applied
	// Via is how the container's own cgroup changed: cgroup, runtime,
	// runtime+cgroup or restart.
	Via string
	// Restarted is the container that replaced the job's, whatever else
	// happened, and Cgroup its cgroup.
	Restarted *cri.Container
	Cgroup    string
	Took      Phases
	// Step is the step that failed and what undoing the ones before gave.
	Step *StepError
	// Reclaim is set when memory was reclaimed before a decrease.
	Reclaim *Reclaim
}

// StepError is the step a resize failed at.
type StepError struct {
	Path     string
	Values   []cgroup.Value
	Err      error
	Rollback error // undoing the steps done before it; nil when it worked
}

// runtimeTimeout bounds one runtime call of a resize, as the kubelet's
// --runtime-request-timeout does (2 minutes, cri.DefaultTimeout).
const runtimeTimeout = cri.DefaultTimeout

// restartTimeout bounds a restart: its calls and retries (cri.Restart).
const restartTimeout = 10 * time.Minute

// job is one call of Do: the Job with what was read of the files.
type job struct {
	x   *Actuator
	ctx context.Context
	Job
	ctr    level
	pod    *level
	shrunk bool // the shrink reclaimed before this write
	took   Phases
	rec    *Reclaim
	step   *StepError
}

// Do carries out j. Once ctx ends, a reclaim in progress stops (and the
// decrease fails); the writes and runtime calls in hand still run to their
// end, bounded by their own timeouts, so that a resize is never left half
// written without its rollback.
func (x *Actuator) Do(ctx context.Context, j Job) Result {
	r := &job{x: x, ctx: ctx, Job: j, ctr: level{path: j.Container.Path, want: j.Container.Want}}
	if j.Pod != nil {
		r.pod = &level{path: j.Pod.Path, want: j.Pod.Want}
	}
	out := r.write()
	out.Took, out.Reclaim, out.Step = r.took, r.rec, r.step
	return out
}

// runtimeCtx is the context of one runtime call: not cancelled with ctx
// (see Do), bounded by d.
func (j *job) runtimeCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(j.ctx), d)
}

// timed runs f and adds its duration to *d.
func timed(d *time.Duration, f func()) {
	t := time.Now()
	f()
	*d += time.Since(t)
}

func failed(reason, format string, args ...any) Result {
	return Result{State: intent.Failed, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// write reads the levels, then writes the plan's steps in order.
func (j *job) write() (out Result) {
	x := j.x
	var err error
	failedPath := j.ctr.path
	timed(&j.took.Verify, func() {
		if j.ctr.cur, err = x.ReadFor(j.ctr.path, j.ctr.want); err == nil && j.pod != nil {
			failedPath = j.pod.path
			j.pod.cur, err = x.ReadFor(j.pod.path, j.pod.want)
		}
	})
	if err != nil {
		return readFailed(failedPath, err)
	}
	// A decrease below usage: shrink.go brings usage down first, or refuses.
	var refused Result
	var stop bool
	timed(&j.took.Reclaim, func() { refused, stop = j.memoryBelowUsage() })
	if stop {
		return refused
	}
	steps := plan(j.ctr, j.pod, x.Cgroups.PageSize())
	if j.Restart {
		return j.restart(steps)
	}
	if len(steps) == 0 {
		out := Result{State: intent.Completed, Reason: intent.ReasonNoChange, Message: "cgroup already holds the requested values"}
		if note := j.recordInRuntime(steps); note != "" {
			out.Message += "; " + note
		}
		return out
	}
	out = Result{State: intent.Completed, Reason: intent.ReasonApplied, Via: "cgroup"}
	var notes []string
	defer func() {
		if out.State == intent.Completed {
			if note := j.recordInRuntime(steps); note != "" {
				out.Message += "; " + note
			}
		}
	}()
	for i, s := range steps {
		how, note, err := j.writeStep(s)
		if note != "" {
			notes = append(notes, note)
		}
		if err != nil {
			rb := j.rollback(steps[:i])
			j.step = &StepError{Path: s.path, Values: s.resource.Values(), Err: err, Rollback: rb}
			reason := intent.ReasonWriteFailed
			switch {
			case errors.Is(err, cri.ErrNotFound) || errors.Is(err, cgroup.ErrNotFound):
				reason = intent.ReasonContainerGone
			case errors.Is(err, cri.ErrUnavailable):
				reason = intent.ReasonRuntimeUnavailable
			}
			msg := fmt.Sprintf("writing %s %s: %v", s.path, s.group, err)
			if rb != nil {
				msg += "; rollback: " + rb.Error()
			} else if i > 0 {
				msg += fmt.Sprintf("; the %d step(s) done before were undone", i)
			}
			return failed(reason, "%s", msg)
		}
		if s.container && how != "cgroup" {
			out.Via = how
		}
		out.Applied.Add(s.path, s.resource.Values()...)
	}
	out.Message = appliedMessage(len(steps), out.Via != "cgroup")
	if len(notes) > 0 {
		out.Message += "; " + strings.Join(notes, "; ")
	}
	return out
}

// writeStep writes one step. A container of a runtime is updated through
// the runtime, so that the runtime's record of its resources matches, and
// the files are then checked; where the runtime's update fails or does not
// hold, the files are written directly and the note says so.
func (j *job) writeStep(s step) (how, note string, err error) {
	x := j.x
	if !s.container || j.RuntimeID == "" {
		timed(&j.took.Verify, func() { err = x.writeFrom(s.path, s.resource, j.curOf(s.path)) })
		x.countWrite(s.resource, err)
		return "cgroup", "", err
	}
	ctx, cancel := j.runtimeCtx(runtimeTimeout)
	defer cancel()
	timed(&j.took.Runtime, func() {
		err = x.Runtime.Update(ctx, j.RuntimeID, x.runtimeResources(&j.Job, j.Want, s.group == "cpu", s.group == "memory"))
	})
	x.countRuntime(err)
	switch {
	case errors.Is(err, cri.ErrNotFound):
		return "runtime", "", err
	case errors.Is(err, cri.ErrUnavailable):
		// Not written behind its back: the runtime's record of the
		// container's resources would then be wrong when it returns.
		return "runtime", "", err
	case err != nil:
		note = fmt.Sprintf("the runtime refused the %s update (%v), so the agent wrote the cgroup itself", s.group, err)
	default:
		var st cgroup.State
		var rerr error
		timed(&j.took.Verify, func() { st, rerr = x.ReadFor(s.path, s.resource) })
		if rerr != nil {
			return "runtime", "", rerr
		}
		if st.Matches(s.resource, x.Cgroups.PageSize()) {
			return "runtime", "", nil
		}
		note = fmt.Sprintf("after the runtime's %s update the cgroup held cpu.max=%q cpu.weight=%d memory.max=%d, so the agent wrote the cgroup itself",
			s.group, st.CPUMax, st.CPUWeight, st.MemoryMax)
	}
	timed(&j.took.Verify, func() { err = x.Cgroups.Write(s.path, s.resource) })
	x.countWrite(s.resource, err)
	return "runtime+cgroup", note, err
}

// recordInRuntime sends the runtime the declared resources of a runtime's
// container that no step sent it because its files already held them, so
// that the runtime's record ends as a kubelet-driven node's (where the
// kubelet sends every resize to the runtime): 20m and 25m of requests give
// the same cpu.weight, but not the same shares in containerd's record. It
// says what it could not do; the files are right either way.
func (j *job) recordInRuntime(steps []step) string {
	if j.RuntimeID == "" || j.x.Runtime == nil {
		return ""
	}
	var errs []string
	for _, g := range groups { // memory, then CPU
		declared := (g.name == "cpu" && j.CPU) || (g.name == "memory" && j.Memory)
		if !declared || slices.ContainsFunc(steps, func(s step) bool { return s.container && s.group == g.name }) {
			continue
		}
		ctx, cancel := j.runtimeCtx(runtimeTimeout)
		err := j.x.Runtime.Update(ctx, j.RuntimeID, j.x.runtimeResources(&j.Job, j.Want, g.name == "cpu", g.name == "memory"))
		cancel()
		j.x.countRuntime(err)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", g.name, err))
		}
	}
	if len(errs) > 0 {
		return "the runtime's record of the container could not be brought in line (" + strings.Join(errs, "; ") + ")"
	}
	return ""
}

// restart applies a resize by restarting the container with its new
// resources: the pod cgroup grows first, the container restarts, and the
// pod cgroup shrinks after.
func (j *job) restart(steps []step) Result {
	x := j.x
	var before, after []step
	for _, s := range steps {
		switch {
		case s.container:
		case s.after:
			after = append(after, s)
		default:
			before = append(before, s)
		}
	}
	for i, s := range before {
		err := x.Cgroups.Write(s.path, s.resource)
		x.countWrite(s.resource, err)
		if err != nil {
			j.rollback(before[:i])
			return failed(intent.ReasonWriteFailed, "writing pod cgroup %s before the restart: %v", s.path, err)
		}
	}
	if j.BeforeRestart != nil {
		if err := j.BeforeRestart(); err != nil {
			j.rollback(before)
			return failed(intent.ReasonRestartFailed, "container %s not restarted: %v", j.RuntimeID, err)
		}
	}
	ctx, cancel := j.runtimeCtx(restartTimeout)
	defer cancel()
	var ct cri.Container
	var err error
	timed(&j.took.Runtime, func() {
		ct, err = x.Runtime.Restart(ctx, j.RuntimeID, x.runtimeResources(&j.Job, j.Want, j.CPU, j.Memory), 10*time.Second)
	})
	x.countRuntime(err)
	if err != nil {
		j.rollback(before)
		if re := (*cri.RestartError)(nil); errors.As(err, &re) && re.Running == "" {
			return failed(intent.ReasonRestartLostContainer, "restarting container %s: %v", j.RuntimeID, err)
		}
		return failed(intent.ReasonRestartFailed, "restarting container %s: %v", j.RuntimeID, err)
	}
	out := Result{State: intent.Completed, Reason: intent.ReasonApplied, Restarted: &ct}
	if out.Cgroup, err = x.Cgroups.PathOf(ct.PID); err != nil {
		return Result{State: intent.Failed, Reason: intent.ReasonRestartFailed, Restarted: &ct, Cgroup: j.ctr.path,
			Message: fmt.Sprintf("container restarted as %s but its cgroup cannot be found: %v", ct.ID, err)}
	}
	st, err := x.Cgroups.Read(out.Cgroup)
	if err == nil && !st.Matches(j.ctr.want, x.Cgroups.PageSize()) {
		err = x.Cgroups.Write(out.Cgroup, j.ctr.want)
		x.countWrite(j.ctr.want, err)
	}
	if err != nil {
		return Result{State: intent.Failed, Reason: intent.ReasonRestartFailed, Restarted: &ct, Cgroup: out.Cgroup,
			Message: fmt.Sprintf("container restarted as %s, but its cgroup %s does not hold the new values: %v", ct.ID, out.Cgroup, err)}
	}
	out.Applied.Add(out.Cgroup, j.ctr.want.Values()...)
	for _, s := range after {
		err := x.Cgroups.Write(s.path, s.resource)
		x.countWrite(s.resource, err)
		if err != nil {
			return Result{State: intent.Failed, Reason: intent.ReasonWriteFailed, Restarted: &ct, Cgroup: out.Cgroup,
				Message: fmt.Sprintf("container restarted as %s, but shrinking pod cgroup %s failed: %v", ct.ID, s.path, err)}
		}
		out.Applied.Add(s.path, s.resource.Values()...)
	}
	out.Message = fmt.Sprintf("container restarted as %s (restart count %d) with the new resources, verified on %s", ct.ID, ct.RestartCount, out.Cgroup)
	return out
}

// ReadFor reads what the cgroup at path holds of the files want writes,
// and its memory usage when want sets memory.max (a decrease below usage
// is shrunk first: shrink.go); the other fields stay zero.
func (x *Actuator) ReadFor(path string, want cgroup.Resources) (cgroup.State, error) {
	n, ok := x.Cgroups.(narrowCgroups)
	if !ok {
		return x.Cgroups.Read(path)
	}
	files := make([]string, 0, 4)
	for _, v := range want.Values() {
		files = append(files, v.File)
	}
	if want.MemoryMax != nil {
		files = append(files, cgroup.FileMemoryCurrent)
	}
	return n.ReadFiles(path, files...)
}

// writeFrom writes r to the cgroup at path, whose files were read as cur
// by this job (nil: not read, or changed since by another step).
func (x *Actuator) writeFrom(path string, r cgroup.Resources, cur *cgroup.State) error {
	if n, ok := x.Cgroups.(narrowCgroups); ok && cur != nil {
		return n.WriteFrom(path, r, *cur)
	}
	return x.Cgroups.Write(path, r)
}

// curOf is what write read of the cgroup at path, the container's or its
// pod's; nil for another.
func (j *job) curOf(path string) *cgroup.State {
	switch {
	case path == j.ctr.path:
		return &j.ctr.cur
	case j.pod != nil && path == j.pod.path:
		return &j.pod.cur
	}
	return nil
}

func readFailed(path string, err error) Result {
	reason := intent.ReasonWriteFailed
	if errors.Is(err, cgroup.ErrNotFound) {
		reason = intent.ReasonContainerGone
	}
	return failed(reason, "reading %s: %v", path, err)
}

// rollback undoes done steps, newest first: the files directly, and, for a
// runtime's container, the runtime's record too.
func (j *job) rollback(done []step) error {
	x := j.x
	var errs []error
	for _, s := range slices.Backward(done) {
		if s.container && j.RuntimeID != "" {
			ctx, cancel := j.runtimeCtx(runtimeTimeout)
			err := x.Runtime.Update(ctx, j.RuntimeID, x.runtimeResources(&j.Job, j.Old, s.group == "cpu", s.group == "memory"))
			cancel()
			x.countRuntime(err)
		}
		err := x.Cgroups.Write(s.path, s.previous)
		if x.Metrics != nil {
			for _, v := range s.previous.Values() {
				x.Metrics.CgroupWrites.WithLabelValues(v.File, "rollback").Inc()
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (x *Actuator) countRuntime(err error) {
	if x.Metrics == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	x.Metrics.RuntimeCalls.WithLabelValues(result).Inc()
}

func (x *Actuator) countWrite(r cgroup.Resources, err error) {
	if x.Metrics == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	for _, v := range r.Values() {
		x.Metrics.CgroupWrites.WithLabelValues(v.File, result).Inc()
	}
}

// The messages of completed intents, made once: the history holds up to
// 10,000 intents, and a message formatted for each was 1 MiB of them
// (issue 16).
var appliedMessages = func() (m [2][5]string) {
	for n := range m[0] {
		m[0][n] = appliedMessageFor(n, false)
		m[1][n] = appliedMessageFor(n, true)
	}
	return m
}()

func appliedMessage(steps int, viaRuntime bool) string {
	v := 0
	if viaRuntime {
		v = 1
	}
	if steps < len(appliedMessages[v]) {
		return appliedMessages[v][steps]
	}
	return appliedMessageFor(steps, viaRuntime)
}

func appliedMessageFor(steps int, viaRuntime bool) string {
	if viaRuntime {
		return fmt.Sprintf("%d step(s) applied, the container's through the runtime (CRI UpdateContainerResources), and verified on the cgroup files", steps)
	}
	return fmt.Sprintf("%d cgroup step(s) written and verified", steps)
}
