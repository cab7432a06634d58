#!/usr/bin/env bash
# make bench: the Go microbenchmarks on the host, then the resize
# benchmarks in the VM harness (real cgroup v2 kernel, containerd, runc, one
# vCPU as in the other VM runs), then docs/benchmarks.md's bench block rewritten
# from the results.
#
#   BENCH_N          resizes per method, and the scale of the other runs (default 1000)
#   BENCH_N_RUNTIME  resizes per method that goes through containerd (default 200:
#                    under TCG on a loaded host one round of those four takes ~2-3 s,
#                    so 1000 would take 35-50 min alone)
#   BENCH_REST       how long the agent is sampled at rest (default 60s; the
#                    row with 1,001 containers at least 5 minutes, the drift
#                    sweep's period, see driftSweeps in cmd/resize-agent/run.go)
#   BENCH_COUNT      -count of the microbenchmarks (default 6, the fewest for which
#                    benchstat gives a 95% confidence interval)
#   BENCH_NODE       0 leaves out the Kubernetes resize on the real node (test/node
#                    TestResizeBench in the make test-node VM, about 10 minutes warm)
#   NODE_BENCH_N     resizes per block there (default 4; four blocks, two per mode)
#   BENCH_README     file to render into (default docs/benchmarks.md; "-" renders nothing)
#   RESIZE_AGENT_LOAD_IDLE, RESIZE_AGENT_LOAD_MB, GOMEMLIMIT  the load test's idle
#                    timeout (default 60s, the DaemonSet's), history (100 MiB) and
#                    the daemon's Go memory limit (none, as deployed)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=${GOFLAGS:--buildvcs=false}

N=${BENCH_N:-1000}
N_RUNTIME=${BENCH_N_RUNTIME:-200}
REST=${BENCH_REST:-60s}
COUNT=${BENCH_COUNT:-6}
README=${BENCH_README:-docs/benchmarks.md}
# benchstat, pinned, fetched through the module proxy once (Go's cache).
BENCHSTAT=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

out=bin/bench
payload=$out/payload
rm -rf "$out"
mkdir -p "$payload/bin" "$out/vm"
start=$(date +%s)
load() { cut -d' ' -f1-3 /proc/loadavg; }
qemus() { pgrep -c -f '^qemu-system-x86_64 ' || true; }
load_before=$(load)
qemu_before=$(qemus)

echo "== building (static)"
CGO_ENABLED=0 go build -trimpath -o "$payload/bin/" ./cmd/...
CGO_ENABLED=0 go build -trimpath -o "$payload/bin/bench" ./test/bench
go build -o "$out/bench-host" ./test/bench

echo "== Go microbenchmarks (host, -count=$COUNT)"
go test -run='^$' -bench=. -benchmem -count="$COUNT" ./cgroup ./agent/intent ./agent/admission | tee "$out/micro.txt"
if GOFLAGS= go run "$BENCHSTAT" "$out/micro.txt" >"$out/benchstat.txt" 2>"$out/benchstat.err"; then
	cat "$out/benchstat.txt"
else
	echo "benchstat unavailable ($(head -n1 "$out/benchstat.err")); the bench page gets the raw lines"
	: >"$out/benchstat.txt"
fi

# The daemon under issue 15's load, on the host: a 100 MB history, 10,000 idle
# connections and 1,000 watch streams at once (cmd/resize-agent
# TestDaemonUnderLoad, a few minutes: answers wait out the 60 s idle timeout).
# A broken bound fails make bench at the end, after the rest has run.
echo "== the daemon under load (host; RESIZE_AGENT_LOAD_IDLE=${RESIZE_AGENT_LOAD_IDLE:-60s})"
load_rc=0
RESIZE_AGENT_LOAD=1 go test -count=1 -run='^TestDaemonUnderLoad$' -v -timeout=30m ./cmd/resize-agent \
	2>&1 | grep -v '^{' | tee "$out/load.txt" || load_rc=$?

echo "== resize benchmarks in the VM (N=$N, N_RUNTIME=$N_RUNTIME; host load $(load), $(qemus) qemu running)"
test/vm/vm.sh prepare
vm_start=$(date +%s)
# One vCPU: see test/run-vm-tests.sh (TCG and BPF attach with two).
test/vm/vm.sh run --quiet --payload "$payload" --containerd --mem 2G --cpus 1 --timeout 1800 \
	--collect /tmp/bench-out:"$out/vm" -- \
	bench run -out /tmp/bench-out -n "$N" -n-runtime "$N_RUNTIME" -rest "$REST"
vm_secs=$(($(date +%s) - vm_start))
# Where the agent's CPU goes: the in-process profile, cut to the agent's goroutines.
go tool pprof -top -cum -nodecount=30 -tagfocus=side=agent "$payload/bin/bench" "$out/vm/cpu.pprof" >"$out/profile.txt" 2>&1 || true
go tool pprof -top -nodecount=30 -tagfocus=side=agent "$payload/bin/bench" "$out/vm/cpu.pprof" >"$out/profile-flat.txt" 2>&1 || true
# The same resize through pods/resize, the kubelet alone and with the agent
# beside it, on the real node (issue 16 target 6). A failure here leaves the
# table out and fails make bench at the end, after the rest is rendered.
node_rc=0
node_flag=()
if [[ ${BENCH_NODE:-1} != 0 ]]; then
	echo "== a Kubernetes resize on the real node, the kubelet alone and with the agent (host load $(load))"
	node_start=$(date +%s)
	if make image IMAGE_ARCHS="$(go env GOARCH)" &&
		NODE_BENCH_OUT=$PWD/$out/node.json test/node/run.sh -test.run '^TestResizeBench$' 2>&1 | tee "$out/node.txt"; then
		node_flag=(-node "$out/node.json")
	else
		node_rc=1
	fi
	echo "== the node part took $(($(date +%s) - node_start)) s"
fi
load_after=$(load)
qemu_after=$(qemus)
secs=$(($(date +%s) - start))
host="$(nproc) cores, load average $load_before before and $load_after after (1, 5, 15 min); other QEMU VMs running: $qemu_before at the start, $qemu_after at the end"
echo "== done in ${secs}s (VM ${vm_secs}s); $host"
if [[ $README != - ]]; then
	"$out/bench-host" render -results "$out/vm/results.json" -readme "$README" \
		-micro "$out/micro.txt" -benchstat "$out/benchstat.txt" -profile "$out/profile.txt" \
		-count "$COUNT" -host "$host" "${node_flag[@]}" -run-time "$((secs / 60)) min $((secs % 60)) s (the VM part $((vm_secs / 60)) min $((vm_secs % 60)) s)"
	echo "== $README: bench block rewritten"
fi
if ((node_rc != 0)); then
	echo "== the node part failed: see $out/node.txt" >&2
	exit 1
fi
if ((load_rc != 0)); then
	echo "== the daemon under load broke a bound: see $out/load.txt" >&2
	exit "$load_rc"
fi
