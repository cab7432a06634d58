#!/usr/bin/env bash
# make test: every test, in an order that keeps a cold run short on two
# cores. The host tests first (they use both cores); then the VM suite
# (one vCPU under TCG) with the Kubernetes builds beside it at low priority
# (test/prebuild.sh); then the real API server tests, and last the real
# Kubernetes node (make test-node). TEST_NODE=0 leaves the node out (a
# quicker run while working on something else; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
mark() { echo "test: $* at $((SECONDS - start)) s" >&2; }

make test-unit fuzz test-monitoring
mark "host tests done"

mkdir -p bin
# Its own process group, so that a failing VM suite stops its builds too.
setsid test/prebuild.sh >bin/prebuild.log 2>&1 &
pre=$!
trap 'kill -- -"$pre" 2>/dev/null || true' EXIT
make test-vm
mark "VM suite done"
if wait "$pre"; then
	mark "prebuild done"
else
	# Not fatal here: the next steps build what they need and say why not.
	echo "test: the background prebuild failed; its log:" >&2
	tail -n 30 bin/prebuild.log >&2 || true
fi
trap - EXIT

make test-k8s
mark "API server tests done"
if [[ ${TEST_NODE:-1} != 0 ]]; then
	make test-node
	mark "node tests done"
else
	echo "test: the real node (make test-node) not run: TEST_NODE=0" >&2
fi
