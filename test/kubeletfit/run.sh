#!/usr/bin/env bash
# Compares agent/kube/fit with the kubelet's own resize admission: main.go
# builds kubelet 1.37.2's allocation manager with its resize and predicate
# admit handlers (as pkg/kubelet/allocation's tests do) and asks it and
# fit.Predict for the verdict on random nodes (pods with sidecars, init
# containers, overhead, pod-level requests, other pods' pending resizes,
# actuated requests above allocated). Verdict and condition message must be
# equal every time.
#
# It runs in a module of its own, next to the kube-apiserver build of
# test/k8s/build.sh (same k8s.io/kubernetes version and staging pins, so
# the build cache is shared): k8s.io/kubernetes is not a dependency of this
# repository. fit's sources are copied in rather than required, so that
# this repository's newer dependency versions do not rebuild the kubelet.
#   test/kubeletfit/run.sh [seed-argument]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
CACHE=${RESIZE_AGENT_K8S_CACHE:-/var/cache/resize-agent-k8s}
test/k8s/build.sh # writes $CACHE/build/go.mod (k8s.io/kubernetes, staging pins); cached after the first run
dir=$CACHE/kubeletfit
mkdir -p "$dir/fit"
sed 's/^module kas$/module kubeletfit/' "$CACHE/build/go.mod" >"$dir/go.mod"
cp "$CACHE/build/go.sum" "$dir/go.sum"
cp agent/kube/fit/fit.go agent/kube/fit/admit.go "$dir/fit/"
sed 's#"github.com/resizer/resize-agent/agent/kube/fit"#"kubeletfit/fit"#' test/kubeletfit/main.go >"$dir/main.go"
(cd "$dir" && nice go build -o kubeletfit main.go)
"$dir/kubeletfit" "$@"
