#!/usr/bin/env bash
# Builds what the node tests need besides test/k8s/build.sh's kube-apiserver
# and etcd, from the Go module proxy, once per version, into
# $RESIZE_AGENT_K8S_CACHE/bin (default /var/cache/resize-agent-k8s/bin):
#   kubelet, kubectl, kube-controller-manager, kube-scheduler (a DaemonSet's
#       pods are placed by the scheduler), in one go build with the flags
#       build.sh uses for kube-apiserver, so that they share its build cache
#       (cgo on: a static kubelet would compile most of Kubernetes again; the
#       VM harness copies the kubelet's shared libraries into the guest)
#   cni/bridge, cni/host-local, cni/loopback from
#       github.com/containernetworking/plugins, static
# k8s.io/kubernetes is required as test/k8s/build.sh does: every staging
# module it replaces with ./staging/... pinned to its published v0.Y.Z twin.
# A second run with the same versions does nothing. Builds run under nice.
#   test/node/build.sh [kubelet kubectl kube-controller-manager kube-scheduler cni]   (default: all)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
CNI_VERSION=${CNI_VERSION:-1.10.0} # github.com/containernetworking/plugins
CACHE=${RESIZE_AGENT_K8S_CACHE:-/var/cache/resize-agent-k8s}
BIN=$CACHE/bin
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local

log() { printf 'node-build: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
command -v go >/dev/null || die "go not found (expected in /usr/local/go/bin)"
mkdir -p "$BIN/cni"

# Its own lock (not build.lock): these builds may run beside test/k8s's.
exec 9>"$CACHE/node-build.lock"
flock 9

stamp_ok() { [[ -x $BIN/$1 && -f $BIN/$1.version && $(<"$BIN/$1.version") == "$2" ]]; }

# k8s_module DIR: a throw-away module requiring k8s.io/kubernetes, with the
# staging replacements pinned (kept when it already says the same).
k8s_module() {
	local dir=$1 mod staging
	mkdir -p "$dir"
	mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[[ -f $mod ]] || die "cannot download k8s.io/kubernetes@v$K8S_VERSION from the module proxy"
	staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$mod" | sort -u)
	[[ -n $staging ]] || die "no staging replacements found in $mod"
	{
		printf 'module k8snode\n\ngo %s\n\nrequire k8s.io/kubernetes v%s\n\n' "$(go env GOVERSION | sed 's/^go//')" "$K8S_VERSION"
		for m in $staging; do printf 'replace %s => %s v0.%s\n' "$m" "$m" "${K8S_VERSION#1.}"; done
	} >"$dir/go.mod.want"
	if ! cmp -s <(grep -v '^go ' "$dir/go.mod.want") <(grep -v '^go ' "$dir/go.mod" 2>/dev/null); then
		mv "$dir/go.mod.want" "$dir/go.mod"
		rm -f "$dir/go.sum"
	else
		rm -f "$dir/go.mod.want"
	fi
}

# build_k8s CGO NAME...: k8s.io/kubernetes/cmd/NAME for each NAME not cached.
build_k8s() {
	local cgo=$1 names=() n pkgs=() v=k8s.io/component-base/version start=$SECONDS
	shift
	for n in "$@"; do
		if stamp_ok "$n" "v$K8S_VERSION"; then log "$n v$K8S_VERSION cached"; else names+=("$n"); fi
	done
	((${#names[@]})) || return 0
	k8s_module "$CACHE/node-build"
	for n in "${names[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$n"); done
	log "building ${names[*]} v$K8S_VERSION (CGO_ENABLED=$cgo; many minutes the first time)"
	rm -rf "$CACHE/node-build/out" && mkdir -p "$CACHE/node-build/out"
	(cd "$CACHE/node-build" && CGO_ENABLED=$cgo nice -n 10 go build -o out/ \
		-ldflags "-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=${K8S_VERSION%%.*} -X $v.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $v.gitTreeState=clean" \
		"${pkgs[@]}") || die "building ${names[*]} failed (see above)"
	for n in "${names[@]}"; do
		mv "$CACHE/node-build/out/$n" "$BIN/$n"
		echo "v$K8S_VERSION" >"$BIN/$n.version"
	done
	log "${names[*]} built in $((SECONDS - start)) s"
}

build_cni() {
	local dir=$CACHE/cni-build p start=$SECONDS
	stamp_ok cni/bridge "v$CNI_VERSION" && stamp_ok cni/host-local "v$CNI_VERSION" && stamp_ok cni/loopback "v$CNI_VERSION" &&
		{ log "CNI plugins v$CNI_VERSION cached"; return; }
	mkdir -p "$dir"
	if ! grep -q "github.com/containernetworking/plugins v$CNI_VERSION" "$dir/go.mod" 2>/dev/null; then
		rm -f "$dir/go.mod" "$dir/go.sum"
		(cd "$dir" && go mod init cnibuild >/dev/null 2>&1 && go get "github.com/containernetworking/plugins@v$CNI_VERSION") ||
			die "cannot fetch github.com/containernetworking/plugins@v$CNI_VERSION from the module proxy"
	fi
	log "building CNI plugins v$CNI_VERSION (bridge, host-local, loopback)"
	rm -rf "$dir/out" && mkdir -p "$dir/out"
	(cd "$dir" && CGO_ENABLED=0 nice -n 10 go build -o out/ -ldflags "-s -w" \
		github.com/containernetworking/plugins/plugins/main/bridge \
		github.com/containernetworking/plugins/plugins/ipam/host-local \
		github.com/containernetworking/plugins/plugins/main/loopback) || die "building the CNI plugins failed (see above)"
	for p in bridge host-local loopback; do
		mv "$dir/out/$p" "$BIN/cni/$p"
		echo "v$CNI_VERSION" >"$BIN/cni/$p.version"
	done
	log "CNI plugins built in $((SECONDS - start)) s"
}

want=("$@")
((${#want[@]})) || want=(cni kubectl kube-controller-manager kube-scheduler kubelet)
k8s=()
for w in "${want[@]}"; do
	case $w in
	cni) build_cni ;;
	kubelet | kubectl | kube-controller-manager | kube-scheduler) k8s+=("$w") ;;
	*) die "unknown component $w (kubelet, kubectl, kube-controller-manager, kube-scheduler, cni)" ;;
	esac
done
((${#k8s[@]} == 0)) || build_k8s "$(go env CGO_ENABLED)" "${k8s[@]}"
