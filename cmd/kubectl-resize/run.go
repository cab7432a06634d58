package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// clientFunc makes the user's client and default namespace from kubectl's
// connection flags; tests pass a fake.
type clientFunc func(cf *genericclioptions.ConfigFlags, stderr io.Writer) (kubernetes.Interface, string, error)

// newClient loads the user's kubeconfig with kubectl's rules (KUBECONFIG,
// ~/.kube/config, --kubeconfig, --context, -n, --as, ...): the resize is
// sent with the user's own identity and rights.
func newClient(cf *genericclioptions.ConfigFlags, stderr io.Writer) (kubernetes.Interface, string, error) {
	cfg, err := cf.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	cfg.WarningHandler = rest.NewWarningWriter(stderr, rest.WarningWriterOptions{})
	cfg.UserAgent = "kubectl-resize"
	ns, _, err := cf.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	c, err := kubernetes.NewForConfig(cfg)
	return c, ns, err
}

// result is what the plugin prints, as text or as -o json|yaml.
type result struct {
	Namespace  string `json:"namespace"`
	Pod        string `json:"pod"`
	Container  string `json:"container"`
	Node       string `json:"node,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	// Verdict: Completed, Deferred, Infeasible, Error (the kubelet's),
	// Refused (the API server's), Accepted (--wait=false), Timeout.
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Spec is the container's resources as the API server stored them.
	Spec corev1.ResourceRequirements `json:"spec"`
	// Status is status.containerStatuses[].resources at the verdict.
	Status         *corev1.ResourceRequirements `json:"status,omitempty"`
	RestartCount   int32                        `json:"restartCount"`
	ElapsedSeconds float64                      `json:"elapsedSeconds"`
	ExitCode       int                          `json:"exitCode"`
	Agent          *agentReport                 `json:"agent,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, mk clientFunc) int {
	return runWith(ctx, args, stdout, stderr, mk, 250*time.Millisecond)
}

// runWith is run with the interval between reads of the pod.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, mk clientFunc, poll time.Duration) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "kubectl resize:", safe(err.Error()))
		return exitUsage
	}
	o.poll = poll
	c, ns, err := mk(o.config, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "kubectl resize:", safe(err.Error()))
		return exitError
	}
	res, err := resize(ctx, c, ns, o)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "kubectl resize:", safe(err.Error()))
		return exitUsage
	case err != nil:
		fmt.Fprintln(stderr, "kubectl resize:", safe(err.Error()))
		return exitError
	}
	if res.Verdict == Refused {
		fmt.Fprintf(stderr, "kubectl resize: the API server refused the resize (%s): %s\n", safe(res.Reason), safe(res.Message))
	}
	if err := print(stdout, o.output, res); err != nil {
		fmt.Fprintln(stderr, "kubectl resize:", err)
		return exitError
	}
	return res.ExitCode
}

// resize reads the pod, checks the change, patches pods/resize and waits
// for the verdict. An error is one before the patch (nothing changed) or a
// failure to read the pod; the API server's refusal is a result.
func resize(ctx context.Context, c kubernetes.Interface, ns string, o *options) (result, error) {
	pods := c.CoreV1().Pods(ns)
	p, err := pods.Get(ctx, o.pod, metav1.GetOptions{})
	if err != nil {
		return result{}, err
	}
	t, err := pickContainer(p, o.container)
	if err != nil {
		return result{}, err
	}
	want, err := desired(t.current, o.changes)
	if err != nil {
		return result{}, err
	}
	patch, err := resizePatch(t, o.changes)
	if err != nil {
		return result{}, err
	}
	res := result{Namespace: ns, Pod: p.Name, Container: t.name, Node: p.Spec.NodeName, Spec: want}
	// The agent's Events already there are not about this resize. Listing
	// them may be forbidden to the user: then the agent's part is skipped.
	var before eventSnapshot
	if o.wait && o.agentWait > 0 {
		before, _ = snapshotEvents(ctx, c, p)
	}
	start := time.Now()
	// Preconditioned on the UID read: a pod deleted and made again under
	// the same name is not resized with values meant for the old one.
	patch = withUID(patch, p.UID)
	got, err := pods.Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-resize"}, "resize")
	if err != nil {
		var st apierrors.APIStatus
		if !errors.As(err, &st) {
			return result{}, fmt.Errorf("patch pods/resize: %w", err)
		}
		res.Verdict, res.Reason, res.Message = Refused, string(st.Status().Reason), st.Status().Message
		res.Spec = t.current
		res.ExitCode = exitCode(Refused)
		return res, nil
	}
	res.Generation = got.Generation
	if c := findContainer(got, t); c != nil {
		res.Spec = c.Resources
	}
	if !o.wait {
		res.Verdict, res.ExitCode = Accepted, exitOK
		return res, nil
	}
	r, last, err := waitVerdict(ctx, c, got, t, o)
	if err != nil {
		return result{}, err
	}
	res.ElapsedSeconds = time.Since(start).Seconds()
	res.Verdict, res.Reason, res.Message = r.verdict, r.reason, r.message
	if r.verdict == "" {
		res.Verdict, res.Message = Timeout, fmt.Sprintf("no verdict from the kubelet within %s: %s", o.timeout, r.state)
	}
	if r.status != nil {
		res.Status, res.RestartCount = r.status.Resources, r.status.RestartCount
	}
	res.ExitCode = exitCode(res.Verdict)
	if res.Verdict != Timeout {
		a := waitAgent(ctx, c, last, before, start, o.agentWait, o.poll)
		res.Agent = &a
	}
	return res, nil
}

// withUID turns {"spec":...} into {"metadata":{"uid":...},"spec":...}: the
// API server refuses a patch whose metadata.uid is not the pod's.
func withUID(patch []byte, uid types.UID) []byte {
	return append([]byte(fmt.Sprintf(`{"metadata":{"uid":%q},`, uid)), patch[1:]...)
}

func findContainer(p *corev1.Pod, t target) *corev1.Container {
	list := p.Spec.Containers
	if t.sidecar {
		list = p.Spec.InitContainers
	}
	for i := range list {
		if list[i].Name == t.name {
			return &list[i]
		}
	}
	return nil
}

// waitVerdict reads the pod until the kubelet's verdict on generation
// got.Generation, or the timeout (then the reading has no verdict).
func waitVerdict(ctx context.Context, c kubernetes.Interface, got *corev1.Pod, t target, o *options) (reading, *corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	want := o.changes
	last := got
	var r reading
	for {
		r = readVerdict(last, got.Generation, t, want)
		if r.verdict != "" {
			return r, last, nil
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return r, last, nil
			}
			return r, last, ctx.Err()
		case <-time.After(o.poll):
		}
		p, err := c.CoreV1().Pods(got.Namespace).Get(ctx, got.Name, metav1.GetOptions{})
		switch {
		case err == nil && p.UID != got.UID:
			return r, last, fmt.Errorf("pod %s was deleted and made again while waiting for the verdict", got.Name)
		case err == nil:
			last = p
		case apierrors.IsNotFound(err):
			return r, last, fmt.Errorf("pod %s was deleted while waiting for the verdict", got.Name)
		case ctx.Err() != nil:
			// the timeout, or the user's interrupt: checked above
		default:
			return r, last, fmt.Errorf("reading pod %s: %w", got.Name, err)
		}
	}
}
