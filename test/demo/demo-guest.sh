#!/bin/sh
# The demo itself, run as root on a cgroup v2 machine (the VM harness, or a
# host that has cgroup v2). Runs the demo pod through CRI (crictl and
# containerd) when they are there, otherwise plain processes in cgroups.
set -eu
CG=/sys/fs/cgroup
SOCK=/run/resize-agent/agent.sock
METRICS=127.0.0.1:9847
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ctl() { echo "\$ resizectl $*"; resizectl --socket "$SOCK" "$@"; }

cpu_usage() { awk '/^usage_usec/ {print $2}' "$CG$1/cpu.stat"; }
uptime_s() { awk '{print $1}' /proc/uptime; }
# CPUs used by cgroup $1 over 3 s (usage_usec over the uptime clock).
cpu_rate() {
	u0=$(cpu_usage "$1"); t0=$(uptime_s)
	sleep 3
	u1=$(cpu_usage "$1"); t1=$(uptime_s)
	awk -v a="$u0" -v b="$u1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e6 / (e - s) }'
}

say "starting a demo pod with a container that burns CPU"
UID_=demo-0000-1111-2222-333344445555
if command -v crictl >/dev/null && crictl version >/dev/null 2>&1; then
	# Through CRI, as the kubelet would on a kind node: a host-network pod
	# under the kubelet's cgroupfs layout, containers with the kubelet's labels.
	cat >/tmp/pod.json <<JSON
{"metadata":{"name":"demo","namespace":"default","uid":"$UID_"},
 "labels":{"io.kubernetes.pod.uid":"$UID_","io.kubernetes.pod.name":"demo","io.kubernetes.pod.namespace":"default"},
 "log_directory":"/tmp/pods/demo",
 "linux":{"cgroup_parent":"/kubepods/burstable/pod$UID_","security_context":{"namespace_options":{"network":2}}}}
JSON
	ctrjson() {
		cat <<JSON
{"metadata":{"name":"$1"},"image":{"image":"localhost/resize-agent/busybox:latest"},
 "command":["/bin/busybox","sh","-c","$2"],"log_path":"$1.log",
 "labels":{"io.kubernetes.pod.uid":"$UID_","io.kubernetes.pod.name":"demo","io.kubernetes.pod.namespace":"default","io.kubernetes.container.name":"$1"},
 "linux":{"resources":{"cpu_period":100000,"cpu_shares":2}}}
JSON
	}
	ctrjson busy 'while :; do :; done' >/tmp/busy.json
	ctrjson batch 'sleep 3600' >/tmp/batch.json
	POD=$(crictl runp /tmp/pod.json)
	CID=$(crictl create "$POD" /tmp/busy.json /tmp/pod.json)
	crictl start "$CID" >/dev/null
	BATCH=$(crictl create "$POD" /tmp/batch.json /tmp/pod.json)
	crictl start "$BATCH" >/dev/null
	crictl ps
	PID=$(crictl inspect -o go-template --template '{{.info.pid}}' "$CID")
	TARGET="--pod-uid $UID_"
	RUNTIME="containerd $(containerd --version | cut -d' ' -f3) via CRI"
else
	mkdir -p "$CG/resize-demo"
	echo "+cpu +memory" >"$CG/cgroup.subtree_control" 2>/dev/null || true
	echo "+cpu +memory" >"$CG/resize-demo/cgroup.subtree_control" 2>/dev/null || true
	mkdir -p "$CG/resize-demo/busy" "$CG/resize-demo/batch"
	sh -c 'while :; do :; done' &
	PID=$!
	echo "$PID" >"$CG/resize-demo/busy/cgroup.procs"
	TARGET="--cgroup /resize-demo/busy"
	RUNTIME="plain process (no container runtime here)"
fi
CGPATH=$(sed -n 's/^0:://p' "/proc/$PID/cgroup")
echo "container busy ($RUNTIME): pid $PID in cgroup $CGPATH"
echo "kernel's values now: cpu.max=\"$(cat "$CG$CGPATH/cpu.max")\" cpu.weight=$(cat "$CG$CGPATH/cpu.weight") memory.max=$(cat "$CG$CGPATH/memory.max")"
echo "it uses $(cpu_rate "$CGPATH") CPUs"

say "starting resize-agent (capacity detected from this machine)"
# --allow-target-cgroup: the bare-cgroup targets live outside /kubepods.
resize-agent --socket "$SOCK" --metrics-address "$METRICS" --cpu-reserved 100m --memory-reserved 128Mi --allow-target-cgroup /resize-demo >/tmp/agent.log 2>&1 &
AGENT=$!
i=0
until [ -S "$SOCK" ]; do
	i=$((i + 1)); [ $i -lt 100 ] || { cat /tmp/agent.log; exit 1; }
	sleep 0.1
done
ctl node

say "resize in place: cpu 250m request / 300m limit, memory 64Mi / 128Mi"
ctl resize busy $TARGET --cpu-request 250m --cpu-limit 300m --memory-request 64Mi --memory-limit 128Mi
echo "kernel's values now: cpu.max=\"$(cat "$CG$CGPATH/cpu.max")\" cpu.weight=$(cat "$CG$CGPATH/cpu.weight") memory.max=$(cat "$CG$CGPATH/memory.max")"
echo "the container now uses $(cpu_rate "$CGPATH") CPUs (limit 0.3)"

say "resize in place again: cpu limit up to 800m"
ctl resize busy $TARGET --cpu-limit 800m
echo "kernel's cpu.max=\"$(cat "$CG$CGPATH/cpu.max")\"; the container now uses $(cpu_rate "$CGPATH") CPUs (limit 0.8)"

say "a resize that can never fit this node: Infeasible"
ctl resize busy $TARGET --cpu-request 64 --cpu-limit 64 || echo "(resizectl exit status $?: the intent did not complete)"
echo "kernel's cpu.max is unchanged: \"$(cat "$CG$CGPATH/cpu.max")\""

say "a resize that cannot fit yet: Deferred, then Completed once busy shrinks"
if [ -n "${BATCH:-}" ]; then BT="--pod-uid $UID_"; else BT="--cgroup /resize-demo/batch"; fi
# Allocatable less 200m: it fits the node, but not beside busy's 250m;
# it does once busy is down to 100m.
BIG=$(resizectl --socket "$SOCK" node -o json | awk -F'[:,]' '/"milliCPU"/ {print $2 - 200; exit}')m
ctl resize batch $BT --cpu-request "$BIG"
ctl resize busy $TARGET --cpu-request 100m --cpu-limit 800m
sleep 0.5
ctl list --container batch

say "the container was never restarted"
NOWPID=$(sed -n 1p "$CG$CGPATH/cgroup.procs")
echo "pid before: $PID, pid in the cgroup now: $NOWPID"
[ -n "${CID:-}" ] && crictl ps
[ "$NOWPID" = "$PID" ] || { echo "the container's process changed"; exit 1; }

say "intents and managed containers"
ctl list
ctl containers

say "metrics (http://$METRICS/metrics)"
wget -qO- "http://$METRICS/metrics" >/tmp/metrics.txt
grep -E '^resize_agent_(resize_duration_seconds_(count|sum)|resize_phase_duration_seconds_sum\{.*outcome="completed"|resizes_total|intents_in_flight|node_|managed|cgroup_writes|runtime_calls|pressure_source|journal_(syncs_total|records_total|sync_duration_seconds_count|broken))' /tmp/metrics.txt
echo "... and per container (pressure, named as cAdvisor names them):"
grep -E '^(container_cpu_cfs_throttled_(periods|seconds)_total|container_pressure_cpu_waiting_seconds_total|container_oom_events_total|resize_agent_container_runqueue_latency_seconds_(count|sum))\{container="busy"' /tmp/metrics.txt

say "stopping the agent"
kill -TERM "$AGENT"
wait "$AGENT" || true
grep -E 'eBPF|pressure|capabilities|shutting down|level=(WARN|ERROR)' /tmp/agent.log || true
if [ -n "${POD:-}" ]; then
	crictl stopp "$POD" >/dev/null && crictl rmp "$POD" >/dev/null
else
	kill "$PID" 2>/dev/null || true
fi
say "demo done"
