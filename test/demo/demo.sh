#!/usr/bin/env bash
# The main job: build the agent, start it next to a running container,
# resize the container in place (with the kernel's own files and the
# container's CPU use as proof), ask for a resize that can never fit
# (Infeasible), and show the metrics.
#
# Where this host has usable cgroup v2 controllers it runs here; otherwise
# (a cgroup v1 or hybrid host, such as our CI machines) it runs the same
# script inside the VM harness, with containerd and a demo container.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=${GOFLAGS:--buildvcs=false}

payload=bin/demo-payload
rm -rf "$payload"
mkdir -p "$payload/bin"
CGO_ENABLED=0 go build -trimpath -o "$payload/bin/" ./cmd/...
cp test/demo/demo-guest.sh "$payload/demo.sh"

usable_cgroup2() {
	[[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]] &&
		grep -qw cpu /sys/fs/cgroup/cgroup.controllers &&
		grep -qw memory /sys/fs/cgroup/cgroup.controllers
}

if usable_cgroup2 && [[ ${DEMO_FORCE_VM:-0} != 1 ]]; then
	echo "== this host has cgroup v2 with cpu and memory: running the demo here"
	PATH="$PWD/$payload/bin:$PATH" exec sh "$payload/demo.sh"
fi
echo "== this host's /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup) (cgroup v1 or hybrid): the agent refuses to run here:"
"$payload/bin/resize-agent" --socket "$(mktemp -u)" --metrics-address "" 2>&1 | tail -n 2 || true
echo "== so the demo runs in the VM harness (Debian kernel, pure cgroup v2, containerd)"
test/vm/vm.sh prepare
# One vCPU: see test/run-vm-tests.sh (TCG and BPF attach with two vCPUs).
exec test/vm/vm.sh run --quiet --payload "$payload" --containerd --mem 1G --cpus 1 --timeout 600 -- sh /payload/demo.sh
