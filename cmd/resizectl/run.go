package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
)

// Exit codes.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitOutcome = 3 // the intent ended Failed, Infeasible or Superseded
)

const usage = `usage: resizectl [--socket PATH | --address URL [--ca-file F]] [--token-file F] COMMAND [flags]

commands:
  resize NAME (--cgroup PATH | --pod-uid UID | --container-id ID) [--pod-cgroup PATH]
         [--cpu-request Q] [--cpu-limit Q]
         [--memory-request Q] [--memory-limit Q] [--cpu-policy P] [--memory-policy P]
         [--allow-memory-below-usage] [--id ID] [--wait=true] [--timeout 30s]
                     submit a resize intent and wait until it settles
  get ID             show one intent
  list               list intents [--container NAME] [--state STATE]
  watch              stream intent changes [--intent ID] [--container NAME]
  containers         list managed containers with their live cgroup values
  node               show allocatable, allocated and free capacity
  forget NAME        stop managing a container
  kube-resizes       list the Kubernetes resizes measured on the node [--pod NS/NAME]

every command takes -o table|json. Exit status: 0 done (Completed or
Deferred), 1 error, 2 usage, 3 the intent ended Failed, Infeasible or Superseded.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := flag.NewFlagSet("resizectl", flag.ContinueOnError)
	g.SetOutput(stderr)
	g.Usage = func() { fmt.Fprint(stderr, usage) }
	socket := g.String("socket", envOr("RESIZE_AGENT_SOCKET", "/run/resize-agent/agent.sock"), "agent API socket")
	address := g.String("address", os.Getenv("RESIZE_AGENT_ADDRESS"), "agent API URL (https://host:port, or http:// on loopback), instead of the socket")
	tokenFile := g.String("token-file", "", "bearer token file, for --address")
	caFile := g.String("ca-file", "", "CA certificate that signed the agent's, for an https:// --address")
	if err := g.Parse(args); err != nil {
		return exitUsage
	}
	if g.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	target := *socket
	if *address != "" {
		target = *address
	}
	c := api.NewClient(target)
	if *caFile != "" {
		b, err := os.ReadFile(*caFile)
		pool := x509.NewCertPool()
		if err == nil && !pool.AppendCertsFromPEM(b) {
			err = fmt.Errorf("%s: no PEM certificate", *caFile)
		}
		if err != nil {
			fmt.Fprintln(stderr, "resizectl:", err)
			return exitError
		}
		c.WithTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintln(stderr, "resizectl:", err)
			return exitError
		}
		c.WithToken(strings.TrimSpace(string(b)))
	}
	cmd, rest := g.Arg(0), g.Args()[1:]
	fs := flag.NewFlagSet("resizectl "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "table", "output: table or json")
	var code int
	var err error
	switch cmd {
	case "resize":
		code, err = resize(ctx, c, fs, rest, out, stdout)
	case "get":
		err = withArg(fs, rest, "ID", func(id string) error {
			it, err := c.Get(ctx, id)
			if err != nil {
				return err
			}
			return print(stdout, *out, it, func(w io.Writer) { intentTable(w, []intent.Intent{it}) })
		})
	case "list":
		ctr := fs.String("container", "", "only this container (name or cgroup path)")
		st := fs.String("state", "", "only intents in this state")
		if err = parse(fs, rest, 0); err == nil {
			var list []intent.Intent
			if list, err = c.List(ctx, *ctr, intent.State(*st)); err == nil {
				err = print(stdout, *out, list, func(w io.Writer) { intentTable(w, list) })
			}
		}
	case "watch":
		id := fs.String("intent", "", "only this intent")
		ctr := fs.String("container", "", "only this container")
		if err = parse(fs, rest, 0); err == nil {
			err = watch(ctx, c, api.Filter{IntentID: *id, Container: *ctr}, *out, stdout)
		}
	case "containers":
		if err = parse(fs, rest, 0); err == nil {
			var cs []api.ContainerInfo
			if cs, err = c.Containers(ctx); err == nil {
				err = print(stdout, *out, cs, func(w io.Writer) { containerTable(w, cs) })
			}
		}
	case "node":
		if err = parse(fs, rest, 0); err == nil {
			var n api.NodeInfo
			if n, err = c.Node(ctx); err == nil {
				err = print(stdout, *out, n, func(w io.Writer) { nodeTable(w, n) })
			}
		}
	case "kube-resizes":
		pod := fs.String("pod", "", "only this pod (namespace/name)")
		if err = parse(fs, rest, 0); err == nil {
			var l []api.KubeResize
			if l, err = c.KubeResizes(ctx, *pod); err == nil {
				err = print(stdout, *out, l, func(w io.Writer) {
					fmt.Fprintln(w, "POD	GENERATION	OUTCOME	SUMMARY")
					for _, r := range l {
						fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", safe(r.Pod), r.Generation, safe(r.Outcome), safe(r.Summary))
					}
				})
			}
		}
	case "forget":
		err = withArg(fs, rest, "NAME", func(name string) error { return c.Forget(ctx, name) })
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "resizectl: unknown command %q\n%s", cmd, usage)
		return exitUsage
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "resizectl:", safe(err.Error()))
		return exitUsage
	case errors.Is(err, flag.ErrHelp):
		return exitUsage
	case err != nil:
		fmt.Fprintln(stderr, "resizectl:", safe(err.Error()))
		return exitError
	}
	return code
}

type usageError struct{ error }

func parse(fs *flag.FlagSet, args []string, n int) error {
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() != n {
		return usageError{fmt.Errorf("%s: expected %d argument(s), got %d", fs.Name(), n, fs.NArg())}
	}
	return nil
}

// withArg parses "CMD ARG [flags]" as well as "CMD [flags] ARG".
func withArg(fs *flag.FlagSet, args []string, name string, f func(string) error) error {
	var arg string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		arg, args = args[0], args[1:]
		if err := parse(fs, args, 0); err != nil {
			return err
		}
	} else {
		if err := parse(fs, args, 1); err != nil {
			return usageError{fmt.Errorf("%s: needs %s", fs.Name(), name)}
		}
		arg = fs.Arg(0)
	}
	return f(arg)
}

func resize(ctx context.Context, c *api.Client, fs *flag.FlagSet, args []string, out *string, stdout io.Writer) (int, error) {
	cg := fs.String("cgroup", "", "the container's cgroup, relative to the cgroup root")
	podUID := fs.String("pod-uid", "", "find the container NAME of this pod through the runtime")
	cid := fs.String("container-id", "", "find the container by its runtime ID")
	pod := fs.String("pod-cgroup", "", "the pod-level cgroup to manage with it")
	cpuReq := fs.String("cpu-request", "", "requests.cpu, e.g. 500m")
	cpuLim := fs.String("cpu-limit", "", "limits.cpu, e.g. 2")
	memReq := fs.String("memory-request", "", "requests.memory, e.g. 256Mi")
	memLim := fs.String("memory-limit", "", "limits.memory, e.g. 1Gi")
	cpuPol := fs.String("cpu-policy", "", "resizePolicy for cpu: NotRequired or RestartContainer")
	memPol := fs.String("memory-policy", "", "resizePolicy for memory: NotRequired or RestartContainer")
	below := fs.Bool("allow-memory-below-usage", false, "allow a memory limit below current usage")
	id := fs.String("id", "", "intent ID, for idempotent retries")
	wait := fs.Bool("wait", true, "wait until the intent settles (terminal or Deferred)")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait")
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
		if err := parse(fs, args, 0); err != nil {
			return 0, err
		}
	} else {
		if err := parse(fs, args, 1); err != nil {
			return 0, usageError{errors.New("resize: needs NAME")}
		}
		name = fs.Arg(0)
	}
	s := intent.Spec{ID: *id, Target: intent.Target{Name: name, CgroupPath: *cg, PodUID: *podUID, ContainerID: *cid, PodCgroupPath: *pod}, AllowMemoryBelowUsage: *below}
	set := func(l *corev1.ResourceList, res corev1.ResourceName, flagName, v string) error {
		if v == "" {
			return nil
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return usageError{fmt.Errorf("--%s %q: %w", flagName, v, err)}
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[res] = q
		return nil
	}
	for _, e := range []error{
		set(&s.Resources.Requests, corev1.ResourceCPU, "cpu-request", *cpuReq),
		set(&s.Resources.Limits, corev1.ResourceCPU, "cpu-limit", *cpuLim),
		set(&s.Resources.Requests, corev1.ResourceMemory, "memory-request", *memReq),
		set(&s.Resources.Limits, corev1.ResourceMemory, "memory-limit", *memLim),
	} {
		if e != nil {
			return 0, e
		}
	}
	for res, p := range map[corev1.ResourceName]string{corev1.ResourceCPU: *cpuPol, corev1.ResourceMemory: *memPol} {
		if p != "" {
			s.ResizePolicy = append(s.ResizePolicy, corev1.ContainerResizePolicy{ResourceName: res, RestartPolicy: corev1.ResourceResizeRestartPolicy(p)})
		}
	}
	if *cg == "" && *podUID == "" && *cid == "" {
		return 0, usageError{errors.New("resize: give --cgroup, --pod-uid or --container-id")}
	}
	var it intent.Intent
	var err error
	if *wait {
		// The server waits for the outcome in the same request; a watch
		// covers what is left should it answer before then (its watch
		// streams at their cap, or an agent without ?wait).
		wctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		it, _, err = c.SubmitWait(ctx, s, *timeout)
		if err == nil && !it.Status.State.Settled() {
			it, err = c.WaitSettled(wctx, it.ID)
		}
	} else {
		it, _, err = c.Submit(ctx, s)
	}
	if err != nil {
		return 0, err
	}
	if err := print(stdout, *out, it, func(w io.Writer) { intentTable(w, []intent.Intent{it}) }); err != nil {
		return 0, err
	}
	switch it.Status.State {
	case intent.Failed, intent.Infeasible, intent.Superseded:
		return exitOutcome, nil
	}
	return exitOK, nil
}

func watch(ctx context.Context, c *api.Client, f api.Filter, out string, stdout io.Writer) error {
	enc := json.NewEncoder(jsonSafe{stdout})
	header := false
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	err := c.Watch(ctx, f, func(e api.Event) bool {
		if out == "json" {
			_ = enc.Encode(e)
			return true
		}
		if !header {
			fmt.Fprintln(tw, "TIME\tEVENT\tINTENT\tCONTAINER\tSTATE\tREASON\tMESSAGE")
			header = true
		}
		it := e.Intent
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", it.Status.UpdatedAt.Format("15:04:05.000"), safe(e.Type), safe(it.ID),
			safe(it.Spec.Target.Name), safe(string(it.Status.State)), safe(it.Status.Reason), safe(it.Status.Message))
		tw.Flush()
		return true
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func print(w io.Writer, format string, v any, table func(io.Writer)) error {
	switch format {
	case "json":
		enc := json.NewEncoder(jsonSafe{w})
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "table", "":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	}
	return usageError{fmt.Errorf("-o %q: use table or json", format)}
}

func intentTable(w io.Writer, list []intent.Intent) {
	fmt.Fprintln(w, "ID\tORIGIN\tCONTAINER\tSTATE\tREASON\tREQUESTS\tLIMITS\tAGE\tMESSAGE")
	for _, it := range list {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", safe(it.ID), safe(originOf(it)), safe(it.Spec.Target.Name), safe(string(it.Status.State)), safe(it.Status.Reason),
			list2(it.Spec.Resources.Requests), list2(it.Spec.Resources.Limits), age(it.Status.AcceptedAt), safe(it.Status.Message))
	}
}

func list2(l corev1.ResourceList) string {
	var parts []string
	for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := l[k]; ok {
			parts = append(parts, string(k)+"="+q.String())
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func age(t time.Time) string {
	return time.Since(t).Round(time.Millisecond).String()
}

func containerTable(w io.Writer, cs []api.ContainerInfo) {
	fmt.Fprintln(w, "NAME\tCGROUP\tQOS\tREQUESTS (cpu/mem)\tLIMITS (cpu/mem)\tCPU.MAX\tCPU.WEIGHT\tMEMORY.MAX\tMEMORY.CURRENT\tCPU STALL\tTHROTTLED\tOOM KILLS\tPENDING\tDRIFT")
	for _, c := range cs {
		cpuMax, weight, memMax, memCur := "?", "?", "?", "?"
		if v := c.Cgroup; v != nil {
			cpuMax, weight, memMax, memCur = v.CPUMax, fmt.Sprint(v.CPUWeight), v.MemoryMax, intent.FormatMemory(v.MemoryCurrent)
		}
		pending := c.PendingIntent
		if pending == "" {
			pending = "-"
		}
		stall, throttled, ooms := "-", "-", "-"
		if p := c.Pressure; p != nil && len(p.Sources) > 0 {
			stall = fmt.Sprintf("%.2fs (%s)", p.CPUStallSeconds, p.Sources[0])
			throttled = fmt.Sprintf("%d/%d", p.ThrottledPeriods, p.Periods)
			ooms = fmt.Sprint(p.OOMKills)
		}
		r := c.Resources
		fmt.Fprintf(w, "%s\t%s\t%s\t%s/%s\t%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", safe(c.Name), safe(c.CgroupPath), safe(string(c.QOSClass)),
			orDash(r.CPURequest, intent.FormatCPU), orDash(r.MemoryRequest, intent.FormatMemory),
			orDash(r.CPULimit, intent.FormatCPU), orDash(r.MemoryLimit, intent.FormatMemory), safe(cpuMax), weight, safe(memMax), memCur,
			safe(stall), throttled, ooms, safe(pending), safe(driftCell(c.Drift)))
	}
}

// originOf is who asked for the intent; "-" for one the agent held before
// intents carried their origin.
func originOf(it intent.Intent) string {
	if it.Origin == "" {
		return "-"
	}
	return string(it.Origin)
}

func orDash(v int64, f func(int64) string) string {
	if v == 0 {
		return "-"
	}
	return f(v)
}

func nodeTable(w io.Writer, n api.NodeInfo) {
	fmt.Fprintln(w, "RESOURCE\tALLOCATABLE\tALLOCATED\tFREE")
	fmt.Fprintf(w, "cpu\t%s\t%s\t%s\n", intent.FormatCPU(n.Allocatable.MilliCPU), intent.FormatCPU(n.Allocated.MilliCPU), intent.FormatCPU(n.Free.MilliCPU))
	fmt.Fprintf(w, "memory\t%s\t%s\t%s\n", intent.FormatMemory(n.Allocatable.Memory), intent.FormatMemory(n.Allocated.Memory), intent.FormatMemory(n.Free.Memory))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// driftCell sums up a container's drift: the files found changed, with the
// agent's values, and what the agent did.
func driftCell(d *api.DriftInfo) string {
	if d == nil {
		return "-"
	}
	var parts []string
	for _, f := range d.Files {
		name := f.File
		if f.Cgroup != "" && !strings.HasSuffix(f.Cgroup, "/") {
			name = path.Base(f.Cgroup) + "/" + f.File
		}
		parts = append(parts, fmt.Sprintf("%s=%q(want %q)", name, f.Found, f.Expected))
	}
	return strings.Join(parts, ",") + " " + d.Action + " since " + d.FirstSeen.Format(time.TimeOnly)
}
