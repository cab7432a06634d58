#!/usr/bin/env bash
# The Kubernetes integration tests: builds (once, cached under
# /var/cache/resize-agent-k8s) a real kube-apiserver v1.37.2 and etcd v3.7.0
# from the Go module proxy, then runs test/k8s, where the intake and its
# status run against them on loopback as deploy's service account, and the
# manifests under deploy/ are checked. Any skip there is a failure here.
#   test/k8s/run.sh [go test flags, e.g. -run TestKubernetesIntake]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export RESIZE_AGENT_K8S_CACHE=${RESIZE_AGENT_K8S_CACHE:-/var/cache/resize-agent-k8s}
export RESIZE_AGENT_K8S_BIN=$RESIZE_AGENT_K8S_CACHE/bin
export RESIZE_AGENT_REQUIRE_APISERVER=1

start=$SECONDS
if ! command -v openssl >/dev/null; then
	echo "k8s: installing openssl (the test makes the control plane's certificates with it)" >&2
	if [[ $(id -u) != 0 ]]; then
		echo "k8s: openssl is missing and this is not root: install it (apt-get install openssl)" >&2
		exit 1
	fi
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
fi
mkdir -p "$RESIZE_AGENT_K8S_CACHE"
test/k8s/build.sh
echo "k8s: control plane binaries ready in $((SECONDS - start)) s" >&2
# helm v4 for the chart's tests (lint, and its output against deploy/base).
RESIZE_AGENT_HELM=$(test/tools.sh helm)
export RESIZE_AGENT_HELM RESIZE_AGENT_REQUIRE_HELM=1

# Bounded: the whole package in well under 5 minutes once built.
status=0
nice go test -count=1 -timeout 6m -v "$@" ./test/k8s/ || status=$?
echo "k8s: done in $((SECONDS - start)) s (exit $status)" >&2
exit "$status"
