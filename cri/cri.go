package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	gproto "google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultEndpoint is containerd's socket.
const DefaultEndpoint = "unix:///run/containerd/containerd.sock"

// Labels the kubelet puts on every container (kubelet
// pkg/kubelet/types/labels.go), by which a container is found.
const (
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelContainerName = "io.kubernetes.container.name"
	// AnnotationRestartCount is the kubelet's per-container restart count.
	AnnotationRestartCount = "io.kubernetes.container.restartCount"
)

var (
	// ErrNotFound is returned when no container matches.
	ErrNotFound = errors.New("container not found in the runtime")
	// ErrUnavailable is returned when the runtime cannot be reached.
	ErrUnavailable = errors.New("container runtime unavailable")
	// ErrNotRunning is returned for a container that is not running.
	ErrNotRunning = errors.New("container is not running")
	// ErrRestart is returned when a restart could not be completed.
	ErrRestart = errors.New("container restart failed")
)

// Resources are the CPU and memory fields of a CRI LinuxContainerResources,
// with the runtime's meanings: CPUQuota -1 and MemoryLimit -1 are
// unlimited, 0 leaves the value as it is.
type Resources struct {
	CPUPeriod   int64 `json:"cpuPeriod"`
	CPUQuota    int64 `json:"cpuQuota"`
	CPUShares   int64 `json:"cpuShares"`
	MemoryLimit int64 `json:"memoryLimitBytes"`
	// MemoryHigh is memory.high in the CRI unified map: what the runtime
	// records for the container (Get), what an update or a restart sets.
	// 0 is none (left as the runtime records it); MemoryHighMax is "max".
	// The kubelet sets it under MemoryQoS (KEP-2570), and containerd
	// merges an update's unified map into its record and has runc write
	// the whole record again (internal/cri/opts/spec_linux_opts.go
	// WithResources), so an update without it puts the recorded value back.
	MemoryHigh int64 `json:"memoryHigh,omitempty"`
}

// MemoryHighMax is Resources.MemoryHigh for "max".
const MemoryHighMax = -1

const unifiedMemoryHigh = "memory.high"

func (r Resources) linux(base *runtimeapi.LinuxContainerResources) *runtimeapi.LinuxContainerResources {
	out := &runtimeapi.LinuxContainerResources{}
	if base != nil {
		out = proto(base)
	}
	out.CpuPeriod, out.CpuQuota, out.CpuShares, out.MemoryLimitInBytes = r.CPUPeriod, r.CPUQuota, r.CPUShares, r.MemoryLimit
	if r.MemoryHigh != 0 {
		if out.Unified == nil {
			out.Unified = map[string]string{}
		}
		out.Unified[unifiedMemoryHigh] = "max"
		if r.MemoryHigh > 0 {
			out.Unified[unifiedMemoryHigh] = strconv.FormatInt(r.MemoryHigh, 10)
		}
	}
	return out
}

// memoryHigh reads memory.high from a CRI unified map: 0 when absent or
// not a number of bytes.
func memoryHigh(unified map[string]string) int64 {
	v, ok := unified[unifiedMemoryHigh]
	switch {
	case !ok:
		return 0
	case v == "max":
		return MemoryHighMax
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

func proto(r *runtimeapi.LinuxContainerResources) *runtimeapi.LinuxContainerResources {
	return gproto.Clone(r).(*runtimeapi.LinuxContainerResources)
}

// Container is what the agent needs to know of a runtime container.
type Container struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	Attempt      uint32    `json:"attempt"`
	SandboxID    string    `json:"sandboxID"`
	PodUID       string    `json:"podUID"`
	PodName      string    `json:"podName"`
	PodNamespace string    `json:"podNamespace"`
	State        string    `json:"state"`
	PID          int       `json:"pid"`
	CgroupsPath  string    `json:"cgroupsPath"` // from the OCI spec
	StartedAt    time.Time `json:"startedAt"`
	RestartCount int       `json:"restartCount"`
	Resources    Resources `json:"resources"`
}

// Running reports whether the container is running.
func (c Container) Running() bool {
	return c.State == runtimeapi.ContainerState_CONTAINER_RUNNING.String()
}

// Client is a CRI runtime client. It is safe for concurrent use.
type Client struct {
	conn    *grpc.ClientConn
	rt      runtimeapi.RuntimeServiceClient
	timeout time.Duration
}

// Option configures a Client.
type Option func(*Client)

// DefaultTimeout bounds each runtime call, as the kubelet's
// --runtime-request-timeout default does (2 minutes): a slow node's
// runtime is waited for rather than given up on mid-restart.
const DefaultTimeout = 2 * time.Minute

// WithTimeout bounds each call (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// Dial connects to a CRI endpoint ("unix:///path" or a plain path). The
// connection is lazy: a runtime that is down now is retried on each call.
func Dial(endpoint string, opts ...Option) (*Client, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "unix://" + endpoint
	}
	if !strings.HasPrefix(endpoint, "unix://") {
		return nil, fmt.Errorf("CRI endpoint %q: only unix sockets are supported", endpoint)
	}
	// Redial a runtime that went away at most a second apart (gRPC's
	// default backs off to two minutes), so that the agent reaches a
	// restarted containerd as soon as it is back; a local socket is cheap.
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = 100*time.Millisecond, time.Second
	conn, err := grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %q: %w", endpoint, err)
	}
	c := &Client{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// wrap maps gRPC status codes to the sentinel errors.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("%s: %w: %w", op, ErrNotFound, err)
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Version returns the runtime's name and version.
func (c *Client) Version(ctx context.Context) (string, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", wrap("CRI Version", err)
	}
	return v.RuntimeName + " " + v.RuntimeVersion, nil
}

// Find returns the running container named name in the pod with UID podUID
// (the newest attempt, if the kubelet restarted it).
func (c *Client) Find(ctx context.Context, podUID, name string) (Container, error) {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	resp, err := c.rt.ListContainers(cctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{LabelPodUID: podUID, LabelContainerName: name},
	}})
	if err != nil {
		return Container{}, wrap("CRI ListContainers", err)
	}
	var best *runtimeapi.Container
	for _, ct := range resp.Containers {
		if best == nil || ct.GetMetadata().GetAttempt() > best.GetMetadata().GetAttempt() {
			best = ct
		}
	}
	if best == nil {
		return Container{}, fmt.Errorf("%w: no running container %q in pod %s", ErrNotFound, name, podUID)
	}
	return c.Get(ctx, best.Id)
}

// PodContainers returns the running containers of the pod with UID podUID
// (the newest attempt of each name), with the resources the runtime reports
// for them: what the pod-level cgroup is computed from.
func (c *Client) PodContainers(ctx context.Context, podUID string) ([]Container, error) {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	resp, err := c.rt.ListContainers(cctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{LabelPodUID: podUID},
	}})
	if err != nil {
		return nil, wrap("CRI ListContainers", err)
	}
	newest := map[string]*runtimeapi.Container{}
	for _, ct := range resp.Containers {
		name := ct.GetMetadata().GetName()
		if b := newest[name]; b == nil || ct.GetMetadata().GetAttempt() > b.GetMetadata().GetAttempt() {
			newest[name] = ct
		}
	}
	out := make([]Container, 0, len(newest))
	for _, ct := range newest {
		got, err := c.Get(ctx, ct.Id)
		if errors.Is(err, ErrNotFound) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, got)
	}
	return out, nil
}

// verboseInfo is the part of containerd's verbose ContainerStatus info the
// agent reads.
type verboseInfo struct {
	SandboxID   string                      `json:"sandboxID"`
	PID         int                         `json:"pid"`
	Config      *runtimeapi.ContainerConfig `json:"config"`
	RuntimeSpec *struct {
		Linux *struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

func (c *Client) status(ctx context.Context, id string) (*runtimeapi.ContainerStatusResponse, verboseInfo, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	var vi verboseInfo
	resp, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, vi, wrap("CRI ContainerStatus "+id, err)
	}
	if raw, ok := resp.Info["info"]; ok {
		if err := json.Unmarshal([]byte(raw), &vi); err != nil {
			return nil, vi, fmt.Errorf("CRI ContainerStatus %s: decoding verbose info: %w", id, err)
		}
	}
	return resp, vi, nil
}

// Get returns the container with this ID.
func (c *Client) Get(ctx context.Context, id string) (Container, error) {
	resp, vi, err := c.status(ctx, id)
	if err != nil {
		return Container{}, err
	}
	st := resp.GetStatus()
	out := Container{
		ID: st.GetId(), Name: st.GetMetadata().GetName(), Attempt: st.GetMetadata().GetAttempt(),
		SandboxID: vi.SandboxID, PID: vi.PID, State: st.GetState().String(),
		PodUID: st.GetLabels()[LabelPodUID], PodName: st.GetLabels()[LabelPodName], PodNamespace: st.GetLabels()[LabelPodNamespace],
	}
	if st.GetStartedAt() > 0 {
		out.StartedAt = time.Unix(0, st.GetStartedAt())
	}
	if vi.RuntimeSpec != nil && vi.RuntimeSpec.Linux != nil {
		out.CgroupsPath = vi.RuntimeSpec.Linux.CgroupsPath
	}
	out.RestartCount = int(out.Attempt)
	if n, err := strconv.Atoi(st.GetAnnotations()[AnnotationRestartCount]); err == nil {
		out.RestartCount = n
	}
	if l := st.GetResources().GetLinux(); l != nil {
		out.Resources = Resources{CPUPeriod: l.CpuPeriod, CPUQuota: l.CpuQuota, CPUShares: l.CpuShares, MemoryLimit: l.MemoryLimitInBytes, MemoryHigh: memoryHigh(l.Unified)}
	}
	return out, nil
}

// Update sets the container's CPU and memory through the runtime
// (UpdateContainerResources), which both changes the cgroup and the
// runtime's own record of the container's resources.
func (c *Client) Update(ctx context.Context, id string, r Resources) error {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err := c.rt.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: r.linux(nil),
	})
	return wrap("CRI UpdateContainerResources "+id, err)
}

// Restart replaces the container by a new attempt of it with resources r:
// it creates the next attempt from the config the runtime recorded (with r
// and the restart count raised), stops the container, starts the new one
// and removes the old one. It returns the new container. This is what the
// kubelet does for a resize whose policy is RestartContainer; only this
// container is restarted, not its pod. Once the old container is stopped,
// creating and starting the new one are retried (a start that timed out is
// checked, as it may have completed); an error is a *RestartError, which
// says whether a container was left running.
func (c *Client) Restart(ctx context.Context, id string, r Resources, stopTimeout time.Duration) (Container, error) {
	_, vi, err := c.status(ctx, id)
	if err != nil {
		return Container{}, err
	}
	if vi.Config == nil || vi.SandboxID == "" {
		return Container{}, fmt.Errorf("%w: the runtime does not report container %s's config (verbose status info)", ErrRestart, id)
	}
	sctx, cancel := c.ctx(ctx)
	sb, err := c.rt.PodSandboxStatus(sctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: vi.SandboxID, Verbose: true})
	cancel()
	if err != nil {
		return Container{}, wrap("CRI PodSandboxStatus "+vi.SandboxID, err)
	}
	var sbInfo struct {
		Config *runtimeapi.PodSandboxConfig `json:"config"`
	}
	if err := json.Unmarshal([]byte(sb.Info["info"]), &sbInfo); err != nil || sbInfo.Config == nil {
		return Container{}, fmt.Errorf("%w: the runtime does not report sandbox %s's config", ErrRestart, vi.SandboxID)
	}
	cfg := vi.Config
	if cfg.Metadata == nil {
		return Container{}, fmt.Errorf("%w: container %s has no metadata", ErrRestart, id)
	}
	if cfg.Linux == nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{}
	}
	cfg.Linux.Resources = r.linux(cfg.Linux.Resources)
	cfg.Metadata.Attempt++
	if cfg.Annotations == nil {
		cfg.Annotations = map[string]string{}
	}
	n, _ := strconv.Atoi(cfg.Annotations[AnnotationRestartCount])
	cfg.Annotations[AnnotationRestartCount] = strconv.Itoa(n + 1)

	create := func() (string, error) {
		cctx, cancel := c.ctx(ctx)
		defer cancel()
		created, err := c.rt.CreateContainer(cctx, &runtimeapi.CreateContainerRequest{PodSandboxId: vi.SandboxID, Config: cfg, SandboxConfig: sbInfo.Config})
		if err != nil {
			return "", wrap("CRI CreateContainer", err)
		}
		return created.ContainerId, nil
	}
	// The next attempt is created before the old one is stopped, so that a
	// runtime that cannot create it leaves the old one running.
	newID, err := create()
	if err != nil {
		return Container{}, &RestartError{Running: id, Stage: "create", Err: err}
	}
	stopCtx, cancel := context.WithTimeout(ctx, stopTimeout+c.timeout)
	_, err = c.rt.StopContainer(stopCtx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(stopTimeout / time.Second)})
	cancel()
	if err != nil {
		c.remove(ctx, newID)
		running := id
		if st, serr := c.Get(ctx, id); serr == nil && !st.Running() {
			running = ""
		}
		return Container{}, &RestartError{Running: running, Stage: "stop", Err: wrap("CRI StopContainer "+id, err)}
	}
	// The old container is stopped: from here the restart retries until a
	// new one runs or its tries run out.
	var errs []error
	for try := 0; ; try++ {
		if newID == "" {
			if newID, err = create(); err != nil {
				errs = append(errs, fmt.Errorf("create: %w", err))
			}
		}
		if newID != "" {
			cctx, cancel := c.ctx(ctx)
			_, err = c.rt.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: newID})
			cancel()
			if err == nil {
				break
			}
			// A start that timed out here may have completed in the runtime.
			if st, serr := c.Get(ctx, newID); serr == nil && st.Running() {
				break
			}
			errs = append(errs, fmt.Errorf("start %s: %w", newID, wrap("CRI StartContainer", err)))
			c.remove(ctx, newID)
			newID = ""
			cfg.Metadata.Attempt++ // a new name for the next try
		}
		if try+1 >= restartTries || ctx.Err() != nil {
			return Container{}, &RestartError{Stage: "start", Err: errors.Join(errs...)}
		}
		select {
		case <-ctx.Done():
		case <-time.After(restartBackoff << try):
		}
	}
	c.remove(ctx, id)
	return c.Get(ctx, newID)
}

// remove removes a container, best effort: a container left behind is
// garbage the runtime's own collection or the kubelet removes.
func (c *Client) remove(ctx context.Context, id string) {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	_, _ = c.rt.RemoveContainer(cctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
}

// How often Restart tries to create and start the next attempt once the
// old one is stopped, and the pause before the second try (doubled after).
const (
	restartTries   = 4
	restartBackoff = 250 * time.Millisecond
)

// RestartError is a restart that did not complete, with the container it
// left running: the old one (Running is its ID) when the runtime failed
// before stopping it, none ("") when the old one was stopped and no new
// attempt could be started. It matches ErrRestart.
type RestartError struct {
	Running string
	Stage   string // create, stop or start
	Err     error
}

func (e *RestartError) Error() string {
	left := "no running container is left (the old one is stopped)"
	if e.Running != "" {
		left = "container " + e.Running + " is still running with its old resources"
	}
	return fmt.Sprintf("%v at %s: %v; %s", ErrRestart, e.Stage, e.Err, left)
}

func (e *RestartError) Unwrap() []error { return []error{ErrRestart, e.Err} }
