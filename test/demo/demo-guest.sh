#!/bin/sh
# The demo itself, run as root on a cgroup v2 machine (the VM harness, or a
# host that has cgroup v2). Uses containerd's ctr for the demo container when
# containerd is running, otherwise a plain process in a cgroup of its own.
set -eu
CG=/sys/fs/cgroup
SOCK=/run/resize-agent/agent.sock
METRICS=127.0.0.1:9847
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ctl() { echo "\$ resizectl $*"; resizectl --socket "$SOCK" "$@"; }

cpu_usage() { awk '/^usage_usec/ {print $2}' "$CG$1/cpu.stat"; }
# CPUs used by cgroup $1 over 3 s, as a decimal.
cpu_rate() {
	u0=$(cpu_usage "$1"); t0=$(date +%s%N 2>/dev/null || echo 0)
	sleep 3
	u1=$(cpu_usage "$1"); t1=$(date +%s%N 2>/dev/null || echo 0)
	if [ "$t0" = 0 ] || [ "$t1" = "$t0" ]; then
		awk -v a="$u0" -v b="$u1" 'BEGIN { printf "%.2f", (b - a) / 3e6 }'
	else
		awk -v a="$u0" -v b="$u1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%.2f", (b - a) * 1000 / (e - s) }'
	fi
}

say "starting a demo container that burns CPU"
if command -v ctr >/dev/null && ctr version >/dev/null 2>&1; then
	ctr -n demo run -d localhost/resize-agent/busybox:latest demo /bin/busybox sh -c 'while :; do :; done'
	sleep 1
	PID=$(ctr -n demo task ls | awk '$1 == "demo" {print $2}')
	ctr -n demo task ls
	RUNTIME=containerd
else
	mkdir -p "$CG/resize-demo"
	echo "+cpu +memory" >"$CG/resize-demo/cgroup.subtree_control" 2>/dev/null || true
	mkdir -p "$CG/resize-demo/demo"
	sh -c 'while :; do :; done' &
	PID=$!
	echo "$PID" >"$CG/resize-demo/demo/cgroup.procs"
	RUNTIME="plain process"
fi
CGPATH=$(sed -n 's/^0:://p' "/proc/$PID/cgroup")
echo "container ($RUNTIME) pid $PID runs in cgroup $CGPATH"
echo "kernel's values now: cpu.max=\"$(cat "$CG$CGPATH/cpu.max")\" cpu.weight=$(cat "$CG$CGPATH/cpu.weight") memory.max=$(cat "$CG$CGPATH/memory.max")"
echo "it uses $(cpu_rate "$CGPATH") CPUs"

say "starting resize-agent (capacity detected from this machine)"
resize-agent --socket "$SOCK" --metrics-address "$METRICS" --cpu-reserved 100m --memory-reserved 128Mi >/tmp/agent.log 2>&1 &
AGENT=$!
i=0
until [ -S "$SOCK" ]; do
	i=$((i + 1)); [ $i -lt 100 ] || { cat /tmp/agent.log; exit 1; }
	sleep 0.1
done
ctl node

say "resize in place: cpu 250m request / 300m limit, memory 64Mi / 128Mi"
ctl resize demo --cgroup "$CGPATH" --cpu-request 250m --cpu-limit 300m --memory-request 64Mi --memory-limit 128Mi
echo "kernel's values now: cpu.max=\"$(cat "$CG$CGPATH/cpu.max")\" cpu.weight=$(cat "$CG$CGPATH/cpu.weight") memory.max=$(cat "$CG$CGPATH/memory.max")"
echo "the container now uses $(cpu_rate "$CGPATH") CPUs (limit 0.3)"

say "resize in place again: cpu limit up to 800m"
ctl resize demo --cgroup "$CGPATH" --cpu-limit 800m
echo "kernel's cpu.max=\"$(cat "$CG$CGPATH/cpu.max")\"; the container now uses $(cpu_rate "$CGPATH") CPUs (limit 0.8)"

say "a resize that can never fit this node: Infeasible"
ctl resize demo --cgroup "$CGPATH" --cpu-request 64 --cpu-limit 64 || echo "(resizectl exit status $?: the intent did not complete)"
echo "kernel's cpu.max is unchanged: \"$(cat "$CG$CGPATH/cpu.max")\""

say "the container was never restarted"
NOWPID=$(sed -n 1p "$CG$CGPATH/cgroup.procs")
echo "pid before: $PID, pid in the cgroup now: $NOWPID"
[ "$RUNTIME" = containerd ] && ctr -n demo task ls
[ "$NOWPID" = "$PID" ] || { echo "the container's process changed"; exit 1; }

say "intents and managed containers"
ctl list
ctl containers

say "metrics (http://$METRICS/metrics)"
wget -qO- "http://$METRICS/metrics" | grep -E '^resize_agent_(resize_duration_seconds_(count|sum)|resizes_total|intents_in_flight|node_|managed|cgroup_writes)' 

say "stopping the agent"
kill -TERM "$AGENT"
wait "$AGENT" || true
tail -n 12 /tmp/agent.log
if [ "$RUNTIME" = containerd ]; then
	ctr -n demo task kill -s KILL demo >/dev/null 2>&1 || true
else
	kill "$PID" 2>/dev/null || true
fi
say "demo done"
