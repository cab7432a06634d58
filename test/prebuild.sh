#!/usr/bin/env bash
# Builds, at low priority, what test-k8s and test-node will need, so that
# `make test` can do it while the single-vCPU VM suite leaves a core idle
# (test/all.sh starts it in the background). Everything it builds is cached
# (the Kubernetes binaries under /var/cache/resize-agent-k8s, the rest in Go's
# build cache), and the foreground steps build it again themselves if this
# failed or was killed: it only saves time, it decides nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
start=$SECONDS
step() { echo "prebuild: $* ($((SECONDS - start)) s)" >&2; }
step "kube-apiserver, etcd"
nice -n 10 test/k8s/build.sh
if [[ ${TEST_NODE:-1} != 0 ]]; then
	step "kubelet, kubectl, kube-controller-manager, kube-scheduler, CNI"
	nice -n 10 test/node/build.sh
fi
# The packages of the agent's image binaries as `make image` builds them
# (host arch only: the node is this machine's arch) and of the node and
# API server tests, compiled into Go's cache but not linked: linking is
# all the later builds do then, and linking here too cost 20 s of every
# warm run before the node could start (go list -export compiles).
step "the agent's static binaries' packages"
CGO_ENABLED=0 nice -n 10 go list -trimpath -export -deps ./cmd/resize-agent ./cmd/resizectl >/dev/null
step "the test binaries' packages"
nice -n 10 go list -export -test -deps ./test/node ./test/k8s >/dev/null
step "done"
