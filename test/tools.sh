#!/usr/bin/env bash
# Builds the command-line tools the tests use from the Go module proxy, once
# per version, into $RESIZE_AGENT_TOOLS (default
# /var/cache/resize-agent-tools/bin), and prints the binary's path.
#   test/tools.sh promtool|prometheus|helm
# promtool and prometheus are built without Prometheus' service discovery
# plugins (-tags remove_all_sd): the rule checks and the node test's
# static scrape of a port-forward need none of them, and they are most of
# the build time. prometheus is built without its web UI's assets (no
# builtinassets tag): the tests use only its HTTP API.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="-buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN=local
BIN=${RESIZE_AGENT_TOOLS:-/var/cache/resize-agent-tools}/bin
mkdir -p "$BIN"

case ${1:-} in
promtool) pkg=github.com/prometheus/prometheus/cmd/promtool version=${PROMTOOL_VERSION:-v0.316.0} tags=remove_all_sd ;;
prometheus) pkg=github.com/prometheus/prometheus/cmd/prometheus version=${PROMTOOL_VERSION:-v0.316.0} tags=remove_all_sd ;;
helm) pkg=helm.sh/helm/v4/cmd/helm version=${HELM_VERSION:-v4.3.2} tags= ;;
*) echo "usage: $0 promtool|prometheus|helm" >&2; exit 2 ;;
esac

exec 9>"$BIN/.$1.lock"
flock 9
if [[ -x $BIN/$1 && -f $BIN/$1.version && $(<"$BIN/$1.version") == "$version" ]]; then
	echo "$BIN/$1"
	exit 0
fi
start=$SECONDS
GOBIN=$BIN nice go install -trimpath -tags "$tags" -ldflags '-s -w' "$pkg@$version" >&2
echo "$version" >"$BIN/$1.version"
echo "tools: $1 $version built in $((SECONDS - start)) s" >&2
echo "$BIN/$1"
