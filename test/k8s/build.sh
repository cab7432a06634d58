#!/usr/bin/env bash
# Builds the real control plane the Kubernetes integration test runs
# against, from the Go module proxy, once per version: kube-apiserver
# (k8s.io/kubernetes/cmd/kube-apiserver, every staging module k8s.io/X
# pinned to its v0.x twin) and etcd (go.etcd.io/etcd/server/v3). The
# binaries land in $RESIZE_AGENT_K8S_CACHE/bin (default
# /var/cache/resize-agent-k8s/bin); a second run with the same versions
# does nothing. Builds run under nice: the machine is shared.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}  # k8s.io/kubernetes v1.37.2, staging v0.37.2
ETCD_VERSION=${ETCD_VERSION:-3.7.0} # what Kubernetes 1.37 ships with
CACHE=${RESIZE_AGENT_K8S_CACHE:-/var/cache/resize-agent-k8s}
BIN=$CACHE/bin
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local

log() { printf 'k8s-build: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v go >/dev/null || die "go not found (expected in /usr/local/go/bin)"
mkdir -p "$BIN"

# One build at a time, even from parallel test runs.
exec 9>"$CACHE/build.lock"
flock 9

stamp_ok() { [[ -x $BIN/$1 && -f $BIN/$1.version && $(<"$BIN/$1.version") == "$2" ]]; }

build_apiserver() {
	local dir=$CACHE/build staging
	stamp_ok kube-apiserver "v$K8S_VERSION" && { log "kube-apiserver v$K8S_VERSION cached"; return; }
	mkdir -p "$dir"
	# k8s.io/kubernetes replaces its staging modules with ./staging paths,
	# which do not exist in the module zip: pin each to its published twin.
	local mod
	mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[[ -f $mod ]] || die "cannot download k8s.io/kubernetes@v$K8S_VERSION from the module proxy"
	staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$mod" | sort -u)
	[[ -n $staging ]] || die "no staging replacements found in $mod"
	{
		printf 'module kas\n\ngo %s\n\nrequire k8s.io/kubernetes v%s\n\n' "$(go env GOVERSION | sed 's/^go//')" "$K8S_VERSION"
		for m in $staging; do printf 'replace %s => %s v0.%s\n' "$m" "$m" "${K8S_VERSION#1.}"; done
	} >"$dir/go.mod.want"
	# Keep an existing go.mod (and its go.sum) when it says the same.
	if ! cmp -s <(grep -v '^go ' "$dir/go.mod.want") <(grep -v '^go ' "$dir/go.mod" 2>/dev/null); then
		mv "$dir/go.mod.want" "$dir/go.mod"
		rm -f "$dir/go.sum"
	else
		rm -f "$dir/go.mod.want"
	fi
	log "building kube-apiserver v$K8S_VERSION (several minutes the first time)"
	local v=k8s.io/component-base/version start=$SECONDS
	(cd "$dir" && nice -n 10 go build -o "$BIN/kube-apiserver.tmp" \
		-ldflags "-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=${K8S_VERSION%%.*} -X $v.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $v.gitTreeState=clean" \
		k8s.io/kubernetes/cmd/kube-apiserver) || die "building kube-apiserver failed (see above)"
	mv "$BIN/kube-apiserver.tmp" "$BIN/kube-apiserver"
	echo "v$K8S_VERSION" >"$BIN/kube-apiserver.version"
	log "kube-apiserver built in $((SECONDS - start)) s"
}

build_etcd() {
	local dir=$CACHE/etcd-build
	stamp_ok etcd "v$ETCD_VERSION" && { log "etcd v$ETCD_VERSION cached"; return; }
	mkdir -p "$dir"
	if ! grep -q "go.etcd.io/etcd/server/v3 v$ETCD_VERSION" "$dir/go.mod" 2>/dev/null; then
		rm -f "$dir/go.mod" "$dir/go.sum"
		(cd "$dir" && go mod init etcdbuild >/dev/null 2>&1 && go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION") ||
			die "cannot fetch go.etcd.io/etcd/server/v3@v$ETCD_VERSION from the module proxy"
	fi
	log "building etcd v$ETCD_VERSION"
	local start=$SECONDS
	(cd "$dir" && nice -n 10 go build -o "$BIN/etcd.tmp" -ldflags "-s -w" go.etcd.io/etcd/server/v3) || die "building etcd failed (see above)"
	mv "$BIN/etcd.tmp" "$BIN/etcd"
	echo "v$ETCD_VERSION" >"$BIN/etcd.version"
	log "etcd built in $((SECONDS - start)) s"
}

build_etcd
build_apiserver
"$BIN/kube-apiserver" --version >&2
"$BIN/etcd" --version | sed -n 1p >&2
