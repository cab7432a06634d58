package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cri"
)

const (
	cgroupRoot = "/sys/fs/cgroup"
	period     = 100000
	runcRoot   = "/run/containerd/runc/k8s.io" // containerd's runc root for the k8s.io namespace
	cpuRequest = 100                           // millicores, the same in every agent intent
	// verifyTimeout bounds the wait for a change to show on the cgroup file.
	verifyTimeout = 10 * time.Second
)

// method is one way of making a CPU limit change, timed from its start to
// the new value read back from the cgroup's cpu.max.
type method struct {
	name, what string
	n          int
	cgroup     string // relative to the root
	// resize changes the limit to milli and returns the server-side time
	// when there is one (the agent's AcceptedAt -> CompletedAt), else -1.
	resize func(ctx context.Context, milli int64) (time.Duration, error)
	k      int // resizes done, so that the next one alternates
	client []time.Duration
	server []time.Duration
	errs   int
}

func quotaOf(milli int64) int64 { return milli * period / 1000 }

func cpuMaxText(milli int64) string {
	return strconv.FormatInt(quotaOf(milli), 10) + " " + strconv.Itoa(period)
}

// nextMilli alternates 200m and 300m, so that every resize changes cpu.max.
func (m *method) nextMilli() int64 {
	m.k++
	return 200 + 100*int64(m.k%2)
}

// once does one resize and checks it on the file. It returns the client
// time and the server time (-1 if none).
func (m *method) once(ctx context.Context) (time.Duration, time.Duration, error) {
	milli := m.nextMilli()
	want := cpuMaxText(milli)
	file := filepath.Join(cgroupRoot, m.cgroup, cgroup.FileCPUMax)
	start := time.Now()
	srv, err := m.resize(ctx, milli)
	if err != nil {
		return 0, 0, err
	}
	if err := waitFile(file, want); err != nil {
		return 0, 0, err
	}
	return time.Since(start), srv, nil
}

// waitFile reads file until it holds want. A runtime may return before the
// kernel has the value; the time until it does counts.
func waitFile(file, want string) error {
	deadline := time.Now().Add(verifyTimeout)
	for {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		got := strings.TrimSpace(string(b))
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s holds %q, not %q after %v", file, got, want, verifyTimeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// floor writes cpu.max itself: one open-write-close, then the read-back.
func floorMethod(path string, n int) *method {
	file := filepath.Join(cgroupRoot, path, cgroup.FileCPUMax)
	return &method{name: "bare write (floor)", what: "write `cpu.max`, read it back", n: n, cgroup: path,
		resize: func(_ context.Context, milli int64) (time.Duration, error) {
			return -1, os.WriteFile(file, []byte(cpuMaxText(milli)), 0)
		}}
}

func cpuSpec(t intent.Target, milli int64) intent.Spec {
	s := intent.Spec{Target: t}
	s.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(cpuRequest, resource.DecimalSI)}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(milli, resource.DecimalSI)}
	return s
}

// agentResize submits an intent over the unix socket with ?wait=, as
// resizectl does, so that the answer comes once the intent has settled.
// The intent's ID is kept in id unless it is nil.
func agentResize(ctx context.Context, c *api.Client, t intent.Target, milli int64, id *string) (time.Duration, error) {
	it, _, err := c.SubmitWait(ctx, cpuSpec(t, milli), verifyTimeout)
	if err != nil {
		return 0, fmt.Errorf("submit: %w", err)
	}
	if id != nil {
		*id = it.ID
	}
	return settled(it)
}

// agentResizeWatch submits, then waits for the intent to settle on the
// watch stream: two requests and a second connection, as a client of the
// API without ?wait= does.
func agentResizeWatch(ctx context.Context, c *api.Client, t intent.Target, milli int64) (time.Duration, error) {
	it, _, err := c.Submit(ctx, cpuSpec(t, milli))
	if err != nil {
		return 0, fmt.Errorf("submit: %w", err)
	}
	if it, err = c.WaitSettled(ctx, it.ID); err != nil {
		return 0, err
	}
	return settled(it)
}

// settled is an intent's time in the agent, once it has completed.
func settled(it intent.Intent) (time.Duration, error) {
	if it.Status.State != intent.Completed || it.Status.CompletedAt == nil {
		return 0, fmt.Errorf("intent %s: %s %s: %s", it.ID, it.Status.State, it.Status.Reason, it.Status.Message)
	}
	return it.Status.CompletedAt.Sub(it.Status.AcceptedAt), nil
}

// agentDirectMethod keeps the ID of its last settled intent in last, for
// roundTripMethod.
func agentDirectMethod(c *api.Client, last *string, path string, n int) *method {
	t := intent.Target{Name: "bench-direct", CgroupPath: path}
	return &method{name: directRow, what: "API submit answered once settled (`?wait=`, as resizectl does)", n: n, cgroup: path,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			return agentResize(ctx, c, t, milli, last)
		}}
}

// roundTripMethod is the peer of the agent's methods as the client sees
// them: a GET of the last intent the agent settled for the direct method
// (the same answer, decoded the same way, over the same connection, with
// nothing done for it), then the bare write of cpu.max. What the agent's
// resize adds to the API's own round trip is the difference between the two.
func roundTripMethod(c *api.Client, last *string, path string, n int) *method {
	file := filepath.Join(cgroupRoot, path, cgroup.FileCPUMax)
	return &method{name: roundTripRow, what: "GET of a settled intent over the agent's socket (the same answer, nothing done), then write `cpu.max`, read it back", n: n, cgroup: path,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			if *last == "" {
				return -1, errors.New("no intent of the direct method to get yet")
			}
			if _, err := c.Get(ctx, *last); err != nil {
				return -1, fmt.Errorf("get: %w", err)
			}
			return -1, os.WriteFile(file, []byte(cpuMaxText(milli)), 0)
		}}
}

func agentWatchMethod(c *api.Client, path string, n int) *method {
	t := intent.Target{Name: "bench-direct-watch", CgroupPath: path}
	return &method{name: "agent, bare cgroup, submit then watch", what: "API submit, then a watch stream until settled (two requests, a second connection)", n: n, cgroup: path,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			return agentResizeWatch(ctx, c, t, milli)
		}}
}

func agentCRIMethod(c *api.Client, podUID string, ct benchContainer, n int) *method {
	t := intent.Target{Name: ct.name, PodUID: podUID}
	return &method{name: "agent, CRI container", what: "API submit answered once settled; the agent updates the container through CRI and reads back; its pod has a sidecar the agent does not manage", n: n, cgroup: ct.cgroup,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			return agentResize(ctx, c, t, milli, nil)
		}}
}

func runcMethod(ct benchContainer, n int) *method {
	return &method{name: "`runc update`", what: "exec `runc --root " + runcRoot + " update --cpu-quota Q --cpu-period P`", n: n, cgroup: ct.cgroup,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			out, err := exec.CommandContext(ctx, "runc", "--root", runcRoot, "update",
				"--cpu-quota", strconv.FormatInt(quotaOf(milli), 10), "--cpu-period", strconv.Itoa(period), ct.id).CombinedOutput()
			if err != nil {
				return -1, fmt.Errorf("runc update: %w: %s", err, out)
			}
			return -1, nil
		}}
}

// ctrMethod uses `ctr task update`, for a ctr that has it.
func ctrMethod(ct benchContainer, n int, dir string) *method {
	file := filepath.Join(dir, "ctr-resources-"+ct.name+".json")
	return &method{name: "`ctr task update`", what: "exec `ctr -n k8s.io task update --resources FILE`", n: n, cgroup: ct.cgroup,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			js := fmt.Sprintf(`{"cpu":{"quota":%d,"period":%d}}`, quotaOf(milli), period)
			if err := os.WriteFile(file, []byte(js), 0o644); err != nil {
				return -1, err
			}
			out, err := exec.CommandContext(ctx, "ctr", "-n", "k8s.io", "task", "update", "--resources", file, ct.id).CombinedOutput()
			if err != nil {
				return -1, fmt.Errorf("ctr task update: %w: %s", err, out)
			}
			return -1, nil
		}}
}

// ctrHasTaskUpdate reports whether this ctr has `task update`; the ctr of
// containerd 2.x does not (ctr task has no update subcommand there).
func ctrHasTaskUpdate() bool {
	out, err := exec.Command("ctr", "task", "update", "--help").CombinedOutput()
	return err == nil && strings.Contains(string(out), "update")
}

func taskAPIMethod(tc *taskClient, ct benchContainer, n int) *method {
	return &method{name: "containerd Tasks.Update", what: "gRPC to containerd (what `ctr task update` / `nerdctl update` call), shim, runc", n: n, cgroup: ct.cgroup,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			return -1, tc.updateCPU(ctx, ct.id, quotaOf(milli), period)
		}}
}

func criMethod(cc *cri.Client, ct benchContainer, n int) *method {
	return &method{name: "CRI UpdateContainerResources", what: "gRPC to containerd's CRI (what the kubelet calls), shim, runc", n: n, cgroup: ct.cgroup,
		resize: func(ctx context.Context, milli int64) (time.Duration, error) {
			return -1, cc.Update(ctx, ct.id, cri.Resources{CPUPeriod: period, CPUQuota: quotaOf(milli)})
		}}
}

var errTooMany = errors.New("too many errors")

// record runs one timed resize of m and keeps its times.
func (m *method) record(ctx context.Context) error {
	cl, srv, err := m.once(ctx)
	if err != nil {
		m.errs++
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", m.name, err)
		if m.errs > 10 {
			return fmt.Errorf("%s: %w, last: %w", m.name, errTooMany, err)
		}
		return nil
	}
	m.client = append(m.client, cl)
	if srv >= 0 {
		m.server = append(m.server, srv)
	}
	return nil
}
