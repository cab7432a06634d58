package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// Exit codes, the meanings resizectl resize gives them (docs/api.md):
// 0 done (Completed, or Deferred: the kubelet holds the resize and retries
// it), 1 error (the API server refused the patch, or no verdict in time),
// 2 usage (bad flags or values; nothing was sent), 3 the resize ended
// Infeasible or Error.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitOutcome = 3
)

const usage = `Resize a container of a pod in place, through the pods/resize subresource.

usage: kubectl resize POD [-c CONTAINER] [-n NAMESPACE]
         [--cpu-request Q] [--cpu-limit Q] [--memory-request Q] [--memory-limit Q]
         [--timeout 2m] [--wait=true] [--agent-wait 10s] [-o json|yaml]
         [kubectl's connection flags: --kubeconfig, --context, --as, ...]

Waits for the kubelet's verdict (Completed, Deferred, Infeasible, Error) and
prints it with the resize agent's measurement of the resize, when an agent
on the node reports one.
Exit status: 0 Completed or Deferred (or accepted, with --wait=false),
1 error (the API server refused the resize, or no verdict within --timeout),
2 usage (nothing was sent), 3 Infeasible or Error.

flags:
`

// usageError is bad input: reported with exit code 2, nothing sent.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// change is one resource value the user asked for.
type change struct {
	flag     string
	resource corev1.ResourceName
	limit    bool // limits, else requests
	value    resource.Quantity
}

type options struct {
	pod, container string
	changes        []change
	output         string
	wait           bool
	timeout        time.Duration
	agentWait      time.Duration
	poll           time.Duration // between reads of the pod; not a flag
	config         *genericclioptions.ConfigFlags
}

// parseOptions reads and checks the flags; every value is validated
// before anything is sent.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := pflag.NewFlagSet("kubectl resize", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage+fs.FlagUsages()) }
	o := &options{config: genericclioptions.NewConfigFlags(true)}
	o.config.AddFlags(fs)
	fs.StringVarP(&o.container, "container", "c", "", "the container to resize (default: the only one, or the pod's kubectl.kubernetes.io/default-container)")
	vals := map[string]*string{}
	for _, f := range []struct{ name, help string }{
		{"cpu-request", "requests.cpu, e.g. 500m"},
		{"cpu-limit", "limits.cpu, e.g. 2"},
		{"memory-request", "requests.memory, e.g. 256Mi"},
		{"memory-limit", "limits.memory, e.g. 1Gi"},
	} {
		vals[f.name] = fs.String(f.name, "", f.help)
	}
	fs.StringVarP(&o.output, "output", "o", "", "output format: json or yaml (default: text)")
	fs.BoolVar(&o.wait, "wait", true, "wait for the kubelet's verdict")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the kubelet's verdict")
	fs.DurationVar(&o.agentWait, "agent-wait", 10*time.Second, "how long, after the verdict, to wait for the resize agent's measurement (0: don't)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	switch fs.NArg() {
	case 1:
	case 0:
		return nil, usagef("give the pod to resize: kubectl resize POD [flags]")
	default:
		return nil, usagef("one pod at a time, got %d arguments: %q", fs.NArg(), fs.Args())
	}
	o.pod = fs.Arg(0)
	// kubectl's TYPE/NAME form, for pods only.
	if typ, name, ok := strings.Cut(o.pod, "/"); ok {
		switch typ {
		case "pod", "pods", "po":
			o.pod = name
		default:
			return nil, usagef("%q: only pods can be resized", fs.Arg(0))
		}
	}
	if o.pod == "" {
		return nil, usagef("empty pod name")
	}
	switch o.output {
	case "", "json", "yaml":
	default:
		return nil, usagef("-o %q: use json or yaml (or nothing, for text)", o.output)
	}
	if o.timeout <= 0 {
		return nil, usagef("--timeout %s: must be positive", o.timeout)
	}
	if o.agentWait < 0 {
		return nil, usagef("--agent-wait %s: must not be negative", o.agentWait)
	}
	for _, c := range []change{
		{flag: "cpu-request", resource: corev1.ResourceCPU},
		{flag: "cpu-limit", resource: corev1.ResourceCPU, limit: true},
		{flag: "memory-request", resource: corev1.ResourceMemory},
		{flag: "memory-limit", resource: corev1.ResourceMemory, limit: true},
	} {
		v := *vals[c.flag]
		if !fs.Changed(c.flag) {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, usagef("--%s %q: %w", c.flag, v, err)
		}
		if q.Sign() < 0 {
			return nil, usagef("--%s %s: must not be negative", c.flag, v)
		}
		c.value = q
		o.changes = append(o.changes, c)
	}
	if len(o.changes) == 0 {
		return nil, usagef("nothing to change: give --cpu-request, --cpu-limit, --memory-request or --memory-limit")
	}
	return o, nil
}
