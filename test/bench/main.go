// Command bench measures resize-agent against the tools a user would
// otherwise use for the same change (runc, containerd, CRI, a bare write of
// the cgroup file), inside the VM harness's cgroup v2 kernel with
// containerd, and renders the results into docs/benchmarks.md.
//
//	bench run -out DIR [-n 1000] [-n-runtime 1000]   (in the guest, as root)
//	bench render -results FILE -readme docs/benchmarks.md [-micro FILE] [-benchstat FILE] [-host TEXT]
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bench run|render [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		fs := flag.NewFlagSet("run", flag.ExitOnError)
		var c config
		fs.StringVar(&c.out, "out", "/tmp/bench-out", "directory for results.json and the agent logs")
		fs.IntVar(&c.n, "n", 1000, "resizes per method in the latency comparison, and the scale of the other runs")
		fs.IntVar(&c.nRuntime, "n-runtime", 0, "resizes per method that goes through containerd (default: -n)")
		fs.IntVar(&c.workers, "workers", 16, "concurrent API clients in the throughput runs")
		fs.DurationVar(&c.rest, "rest", time.Minute, "how long the agent's cost at rest is sampled (the row with 1,001 containers: at least the drift sweep's 5 minutes)")
		fs.StringVar(&c.bpf, "bpf", "on", "the daemon's --bpf for the latency and throughput runs")
		_ = fs.Parse(os.Args[2:])
		if c.nRuntime <= 0 || c.nRuntime > c.n {
			c.nRuntime = c.n
		}
		err = runGuest(c)
	case "render":
		fs := flag.NewFlagSet("render", flag.ExitOnError)
		var r renderConfig
		fs.StringVar(&r.results, "results", "", "results.json from a guest run")
		fs.StringVar(&r.readme, "readme", "docs/benchmarks.md", "file whose bench block is rewritten")
		fs.StringVar(&r.micro, "micro", "", "go test -bench output")
		fs.StringVar(&r.benchstat, "benchstat", "", "benchstat's summary of it (optional)")
		fs.StringVar(&r.host, "host", "", "what the host was doing (load)")
		fs.StringVar(&r.runtime, "run-time", "", "how long make bench took")
		fs.StringVar(&r.profile, "profile", "", "go tool pprof -top output of the agent's profile (optional)")
		fs.StringVar(&r.count, "count", "6", "the -count the microbenchmarks ran with")
		fs.StringVar(&r.node, "node", "", "test/node TestResizeBench's JSON (optional)")
		_ = fs.Parse(os.Args[2:])
		err = render(r)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
