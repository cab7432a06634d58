#!/usr/bin/env bash
# Runs the kubelet's e2e resize cases (this package) in the VM harness: the
# agent in standalone mode against the guest's real containerd and kernel.
# Wrap it in the VM lock: flock /tmp/vm.lock test/e2eresize/run-vm.sh
#
# Environment (all optional):
#   E2E_RESIZE_ALL=1         all 56 cases, not the default 29
#   E2E_RESIZE_CASES=REGEXP  only the cases whose name matches (Go regexp)
#   E2E_RESIZE_PARALLEL=N    cases run side by side (4)
#   E2E_RESIZE_TIMEOUT=MIN   the test binary's -test.timeout in minutes (30)
#   E2E_RESIZE_CPUS, E2E_RESIZE_MEM  the VM's vCPUs (2) and memory (3G)
#   E2E_RESIZE_AGENT_LOG=1   the agent's log on the console
#   E2E_RESIZE_MONITOR=0     no load/pressure/top lines every minute
# Times and counts of the last runs: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=${GOFLAGS:--buildvcs=false}

minutes=${E2E_RESIZE_TIMEOUT:-30}
[[ $minutes =~ ^[0-9]+$ ]] || { echo "E2E_RESIZE_TIMEOUT must be a number of minutes" >&2; exit 2; }

payload=bin/e2eresize-payload
rm -rf "$payload"
mkdir -p "$payload/tests"
CGO_ENABLED=0 go test -c -trimpath -o "$payload/tests/test_e2eresize.test" ./test/e2eresize
cp test/vm-tests-guest.sh "$payload/run-tests.sh"
# What the guest is doing while the cases run, to tell a slow runtime from
# a loaded host: load, free memory, pressure (psi=1 on the kernel's command
# line) and the busiest processes, every minute.
cat >"$payload/monitor.sh" <<'EOF'
if [ "${E2E_RESIZE_MONITOR:-1}" = 1 ]; then
	(
		while sleep 60; do
			echo "[monitor] uptime $(cut -d' ' -f1 /proc/uptime)s load $(cut -d' ' -f1-3 /proc/loadavg) $(grep MemAvailable /proc/meminfo | tr -s ' ')"
			for r in cpu memory io; do echo "[monitor] psi $r $(head -1 /proc/pressure/$r 2>/dev/null)"; done
			top -b -n1 | sed -n '4,10p' | cut -c1-150 | sed 's/^/[monitor] /'
		done
	) &
fi
sh /payload/run-tests.sh
EOF

envs=(--env RESIZE_AGENT_REQUIRE_CGROUP2=1 --env "VM_TEST_TIMEOUT_test_e2eresize=${minutes}m")
for v in E2E_RESIZE_ALL E2E_RESIZE_CASES E2E_RESIZE_PARALLEL E2E_RESIZE_AGENT_LOG E2E_RESIZE_MONITOR; do
	[[ -n ${!v:-} ]] && envs+=(--env "$v=${!v}")
done
test/vm/vm.sh prepare
VM_KERNEL_ARGS="psi=1 ${VM_KERNEL_ARGS:-}" test/vm/vm.sh run --payload "$payload" --containerd \
	--mem "${E2E_RESIZE_MEM:-3G}" --cpus "${E2E_RESIZE_CPUS:-2}" --timeout $((minutes * 60 + 300)) \
	"${envs[@]}" -- sh /payload/monitor.sh
