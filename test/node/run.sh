#!/usr/bin/env bash
# make test-node: a real Kubernetes node in the VM harness and the e2e
# tests of test/node against it. Builds (cached, under
# /var/cache/resize-agent-k8s) kube-apiserver and etcd (test/k8s/build.sh),
# kubelet, kubectl, kube-controller-manager, kube-scheduler and the CNI
# plugins (test/node/build.sh), all from the Go module proxy; the agent's
# image is bin/resize-agent-image.tar (make image). Then, in a private
# network namespace, test/node/cluster.sh brings up the control plane and
# the node and runs the tests. Fails if anything cannot be brought up.
# Runs one VM: wrap it as the other VM runs are, flock /tmp/vm.lock make test-node.
#   test/node/run.sh [go test flags, e.g. -test.run TestNode]
# Environment: NODE_CPUS (1), NODE_MEM (3G), NODE_LOGS (bin/node-logs),
# NODE_CGROUP_DRIVER (systemd, as kind; or cgroupfs),
# K8S_VERSION (1.37.2; every component the same version).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export RESIZE_AGENT_K8S_CACHE=${RESIZE_AGENT_K8S_CACHE:-/var/cache/resize-agent-k8s}
export RESIZE_AGENT_K8S_BIN=$RESIZE_AGENT_K8S_CACHE/bin
export NODE_IMAGE_ARCHIVE=${NODE_IMAGE_ARCHIVE:-$PWD/bin/resize-agent-image.tar}

[[ $(id -u) == 0 ]] || { echo "node: must run as root (network namespace, VM)" >&2; exit 1; }
for c in openssl unshare ip; do
	command -v "$c" >/dev/null || { echo "node: $c is needed" >&2; exit 1; }
done
[[ -f $NODE_IMAGE_ARCHIVE ]] || { echo "node: no image at $NODE_IMAGE_ARCHIVE (make image)" >&2; exit 1; }
start=$SECONDS
test/k8s/build.sh
test/node/build.sh
echo "node: Kubernetes binaries ready in $((SECONDS - start)) s" >&2
# --net: the node VM's NIC and bridge modules come from a Debian package
# that run --net would otherwise fetch inside the namespace below, which has
# no network (a cold machine failed there: "Temporary failure resolving").
test/vm/vm.sh prepare --net
# The test binary is built here: the namespace has no route to the module proxy.
go test -c -o bin/node.test ./test/node
status=0
NODE_TEST_BIN=$PWD/bin/node.test unshare --net -- test/node/cluster.sh "$@" || status=$?
echo "node: done in $((SECONDS - start)) s (exit $status)" >&2
exit "$status"
