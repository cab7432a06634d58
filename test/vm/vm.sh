#!/usr/bin/env bash
# QEMU VM test harness for resize-agent: a real cgroup v2 machine (Debian's
# 6.1 kernel booted from an initramfs) with optional containerd 2.x + runc.
#
#   test/vm/vm.sh prepare [--net]   # --net: also the modules run --net needs
#   test/vm/vm.sh run [--payload DIR]... [--containerd] [--systemd] [--collect GUESTDIR:HOSTDIR]...
#                     [--mem 2G] [--cpus 2] [--timeout SECONDS] [--env KEY=VALUE]...
#                     [--quiet] [--console-log FILE] [--containerd-log]
#                     [--net] [--guestfwd IP:PORT=HOSTPORT]... [--hostfwd [HOSTIP:]HOSTPORT=PORT]...
#                     -- CMD [ARGS...]
#   test/vm/vm.sh accel        # prints kvm or tcg (what `run` would use)
#   test/vm/vm.sh clean        # removes the cache
#
# Container runtime: containerd and runc are built from the Go module proxy
# (containerd $VM_CONTAINERD_VERSION, default v2.2.9, CGO_ENABLED=0 static;
# runc $VM_RUNC_VERSION, default v1.4.4, static-pie with cgo + libseccomp, i.e.
# with the seccomp build tag). If that build fails and VM_RUNTIME_SOURCE=auto
# (the default), the harness falls back to Debian 12's containerd (1.6.20) and
# runc (1.1.5) packages (fetched with apt-get download, shared libraries copied
# into the initramfs). VM_RUNTIME_SOURCE=gomod|debian forces one of the two.
#
# See test/vm/README.md for details.
set -euo pipefail
shopt -s extglob

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${VM_CACHE:-/var/cache/resize-agent-vm}
CONTAINERD_VERSION=${VM_CONTAINERD_VERSION:-v2.2.9}
RUNC_VERSION=${VM_RUNC_VERSION:-v1.4.4}
CRICTL_VERSION=${VM_CRICTL_VERSION:-v1.37.0}
RUNTIME_SOURCE=${VM_RUNTIME_SOURCE:-auto}
KVM_PROBE_TIMEOUT=${VM_KVM_PROBE_TIMEOUT:-20}

export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
# The Go builds below are host-native builds in throw-away modules: do not
# inherit a caller's cross-compilation, workspace or module-mode settings.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false GOWORK=off GOOS=linux GOARCH=amd64
unset GOAMD64 GOEXPERIMENT

msg() { echo "[vm.sh] $*" >&2; }
die() {
	echo "[vm.sh] ERROR: $*" >&2
	exit 125
}
now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# sha256 of some files (for cache stamps).
hashof() { cat "$@" | sha256sum | cut -c1-16; }

# ---------------------------------------------------------------------------
# Host packages
# ---------------------------------------------------------------------------
APT_UPDATED=0
apt_update_once() {
	if [[ $APT_UPDATED == 0 ]]; then
		msg "apt-get update"
		apt-get update -qq >&2 || die "apt-get update failed"
		APT_UPDATED=1
	fi
}

HOST_PACKAGES=(qemu-system-x86 busybox-static cpio kmod xz-utils binutils gcc libc6-dev libseccomp-dev pkg-config ca-certificates)
ensure_host_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$p")
		fi
	done
	if ((${#missing[@]})); then
		apt_update_once
		msg "apt-get install ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
			die "apt-get install ${missing[*]} failed"
	fi
	command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found"
	[[ -x /bin/busybox ]] || die "/bin/busybox (busybox-static) not found"
	command -v go >/dev/null || die "go not found (expected in PATH or /usr/local/go/bin)"
}

# ---------------------------------------------------------------------------
# Kernel (Debian linux-image-amd64) and modules
# ---------------------------------------------------------------------------
# Modules the guest loads (with their dependencies, from modules.dep):
# overlay for containerd's overlayfs snapshotter, virtio-pci + virtio_console
# for --collect (virtio-serial ports), loop + ext4 (with crc32c) for a filesystem whose
# files have real page cache (the guest's own are on tmpfs); veth/bridge are
# not needed (no CNI).
GUEST_MODULES=(overlay virtio_pci virtio_console loop crc32c_generic ext4)
KDIR=$CACHE/kernel

# QEMU can boot the uncompressed ELF vmlinux through its PVH entry point
# (CONFIG_PVH=y in Debian's kernel). That skips the bzImage's xz
# decompression, which takes ~2.5 s under TCG.
extract_vmlinux() {
	local off
	[[ -f $KDIR/vmlinux || -f $KDIR/vmlinux.failed ]] && return
	rm -f "$KDIR/vmlinux.tmp"
	off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$KDIR/vmlinuz" | head -1 | cut -d: -f1 || true)
	if [[ -n $off ]] && command -v xz >/dev/null; then
		# xz complains about the data after the stream; the ELF is checked below.
		tail -c +$((off + 1)) "$KDIR/vmlinuz" | xz -dc >"$KDIR/vmlinux.tmp" 2>/dev/null || true
	fi
	if [[ -s $KDIR/vmlinux.tmp && $(head -c 4 "$KDIR/vmlinux.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]] &&
		readelf -n "$KDIR/vmlinux.tmp" 2>/dev/null | grep -q 'Xen'; then
		mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
	else
		rm -f "$KDIR/vmlinux.tmp"
		touch "$KDIR/vmlinux.failed"
		msg "note: could not extract an ELF vmlinux with a PVH note; booting the bzImage"
	fi
}

# The kernel image qemu boots.
boot_kernel() {
	if [[ -f $KDIR/vmlinux && ${VM_BOOT_BZIMAGE:-0} != 1 ]]; then echo "$KDIR/vmlinux"; else echo "$KDIR/vmlinuz"; fi
}

ensure_kernel() {
	# The cache is for this list of modules: another list prepares again.
	if [[ -f $KDIR/ready && -f $KDIR/vmlinuz && $(cat "$KDIR/wanted" 2>/dev/null) == "${GUEST_MODULES[*]}" ]]; then
		extract_vmlinux
		return
	fi
	apt_update_once
	local pkg
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	[[ -n $pkg ]] || die "cannot resolve linux-image-amd64 to a versioned kernel package"
	msg "fetching $pkg"
	rm -rf "$KDIR.tmp"
	mkdir -p "$KDIR.tmp/deb"
	chown _apt "$KDIR.tmp/deb" 2>/dev/null || true
	(cd "$KDIR.tmp/deb" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
	dpkg-deb -x "$KDIR.tmp/deb"/*.deb "$KDIR.tmp/x"
	local kver
	kver=$(ls "$KDIR.tmp/x/lib/modules")
	[[ -n $kver && -f $KDIR.tmp/x/boot/vmlinuz-$kver ]] || die "unexpected layout of $pkg"
	depmod -b "$KDIR.tmp/x" "$kver"
	local mdir=$KDIR.tmp/x/lib/modules/$kver
	# Resolve each wanted module and its dependencies into load order.
	local order=() seen=" " m path d
	resolve() { # $1 = module path relative to $mdir
		local p=$1 dd
		[[ $seen == *" $p "* ]] && return
		dd=$(awk -v m="$p:" '$1 == m { $1 = ""; print }' "$mdir/modules.dep")
		for d in $dd; do resolve "$d"; done
		seen+="$p "
		order+=("$p")
	}
	for m in "${GUEST_MODULES[@]}"; do
		path=$(awk -F: -v m="/$m.ko" 'index($1, m) && substr($1, length($1) - length(m) + 1) == m { print $1; exit }' "$mdir/modules.dep")
		if [[ -z $path ]]; then
			if grep -q "/$m.ko$" "$mdir/modules.builtin"; then continue; fi
			die "module $m not found in $pkg"
		fi
		resolve "$path"
	done
	mkdir -p "$KDIR.tmp/out/lib/modules/$kver"
	cp "$KDIR.tmp/x/boot/vmlinuz-$kver" "$KDIR.tmp/vmlinuz"
	for m in "${order[@]}"; do
		mkdir -p "$KDIR.tmp/out/lib/modules/$kver/$(dirname "$m")"
		cp "$mdir/$m" "$KDIR.tmp/out/lib/modules/$kver/$m"
	done
	printf '%s\n' "${order[@]}" >"$KDIR.tmp/modules.list"
	echo "$kver" >"$KDIR.tmp/kver"
	echo "$pkg" >"$KDIR.tmp/package"
	echo "${GUEST_MODULES[*]}" >"$KDIR.tmp/wanted"
	rm -rf "$KDIR.tmp/x" "$KDIR.tmp/deb"
	rm -rf "$KDIR"
	mv "$KDIR.tmp" "$KDIR"
	touch "$KDIR/ready"
	extract_vmlinux
	msg "kernel $kver ready (modules: ${order[*]})"
}

# Modules for run --net, kept apart from GUEST_MODULES (whose list is the
# kernel cache's key, shared by every run): virtio_net (+ failover,
# net_failover) for the NIC, bridge (+ stp, llc) and veth for CNI's bridge
# plugin. Taken from the same kernel package as $KDIR, into $NETK/<kver>.
NET_MODULES=(virtio_net bridge veth)
NETK=$CACHE/kernel-net
ensure_net_modules() {
	local kver pkg d
	kver=$(cat "$KDIR/kver")
	pkg=$(cat "$KDIR/package")
	d=$NETK/$kver
	[[ -f $d/ready && $(cat "$d/wanted" 2>/dev/null) == "${NET_MODULES[*]}" ]] && return
	apt_update_once
	rm -rf "$d.tmp"
	mkdir -p "$d.tmp/deb"
	chown _apt "$d.tmp/deb" 2>/dev/null || true
	msg "fetching $pkg for the --net modules (${NET_MODULES[*]})"
	(cd "$d.tmp/deb" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
	dpkg-deb -x "$d.tmp/deb"/*.deb "$d.tmp/x"
	[[ -d $d.tmp/x/lib/modules/$kver ]] || die "$pkg has no modules for $kver"
	depmod -b "$d.tmp/x" "$kver"
	local mdir=$d.tmp/x/lib/modules/$kver order=() seen=" " m path
	# Dependencies the base modules already load are loaded again harmlessly
	# (insmod reports "File exists", which the guest ignores).
	resolve_net() {
		local p=$1 dd x
		[[ $seen == *" $p "* ]] && return
		dd=$(awk -v m="$p:" '$1 == m { $1 = ""; print }' "$mdir/modules.dep")
		for x in $dd; do resolve_net "$x"; done
		seen+="$p "
		order+=("$p")
	}
	for m in "${NET_MODULES[@]}"; do
		path=$(awk -F: -v m="/$m.ko" 'index($1, m) && substr($1, length($1) - length(m) + 1) == m { print $1; exit }' "$mdir/modules.dep")
		if [[ -z $path ]]; then
			grep -q "/$m.ko$" "$mdir/modules.builtin" && continue
			die "module $m not found in $pkg"
		fi
		resolve_net "$path"
	done
	local s=$d.tmp/stage
	mkdir -p "$s/harness"
	for m in "${order[@]}"; do
		mkdir -p "$s/lib/modules/$kver/$(dirname "$m")"
		cp "$mdir/$m" "$s/lib/modules/$kver/$m"
	done
	printf '%s\n' "${order[@]}" >"$s/harness/modules-net"
	mkcpio "$s" "$d.tmp/net.cpio"
	echo "${NET_MODULES[*]}" >"$d.tmp/wanted"
	rm -rf "$d.tmp/x" "$d.tmp/deb" "$s"
	rm -rf "$d"
	mv "$d.tmp" "$d"
	touch "$d/ready"
	msg "--net modules ready: ${order[*]}"
}

# ---------------------------------------------------------------------------
# containerd + runc (+ crictl)
# ---------------------------------------------------------------------------
RT=$CACHE/runtime
gobuild_module() { # dir modpath version
	local dir=$1 modpath=$2 ver=$3
	mkdir -p "$dir"
	cat >"$dir/go.mod" <<EOF
module vmharness/build

go $(go env GOVERSION | sed 's/^go//')
EOF
	cat >"$dir/tools.go" <<EOF
//go:build tools

package tools

import _ "$modpath"
EOF
	(cd "$dir" && go get "$modpath@$ver" && go mod tidy)
}

build_gomod_runtime() { # outdir
	local out=$1 b=$CACHE/build
	mkdir -p "$out" "$b"
	msg "building containerd $CONTAINERD_VERSION (go module proxy, CGO_ENABLED=0)"
	local t0
	t0=$(now)
	gobuild_module "$b/containerd-$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/containerd "$CONTAINERD_VERSION" >&2 || return 1
	(cd "$b/containerd-$CONTAINERD_VERSION" && CGO_ENABLED=0 go build -trimpath \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION#v} -X github.com/containerd/containerd/v2/version.Revision=goproxy" \
		-o "$out/" \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr) >&2 || return 1
	msg "containerd built in $(elapsed "$t0" "$(now)")s"
	msg "building runc $RUNC_VERSION (go module proxy, cgo, static-pie, seccomp)"
	t0=$(now)
	gobuild_module "$b/runc-$RUNC_VERSION" github.com/opencontainers/runc "$RUNC_VERSION" >&2 || return 1
	(cd "$b/runc-$RUNC_VERSION" && CGO_ENABLED=1 go build -trimpath -buildmode=pie \
		-tags "seccomp urfave_cli_no_docs netgo osusergo" \
		-ldflags "-s -w -X main.gitCommit=goproxy-$RUNC_VERSION -linkmode external -extldflags -static-pie" \
		-o "$out/runc" github.com/opencontainers/runc) >&2 || return 1
	msg "runc built in $(elapsed "$t0" "$(now)")s"
	"$out/runc" --version >&2 || return 1
	# crictl: optional convenience for CRI-level debugging in the guest.
	if [[ ${VM_WITH_CRICTL:-1} == 1 ]]; then
		msg "building crictl $CRICTL_VERSION (optional)"
		t0=$(now)
		if gobuild_module "$b/crictl-$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl "$CRICTL_VERSION" >&2 &&
			(cd "$b/crictl-$CRICTL_VERSION" && CGO_ENABLED=0 go build -trimpath \
				-ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
				-o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl) >&2; then
			msg "crictl built in $(elapsed "$t0" "$(now)")s"
		else
			msg "warning: crictl build failed; continuing without crictl"
			rm -f "$out/crictl"
		fi
	fi
	echo "gomod containerd=$CONTAINERD_VERSION runc=$RUNC_VERSION" >"$out/SOURCE"
}

# Copy the shared libraries of a dynamically linked binary under $2.
copy_libs() { # binary rootdir
	local lib
	for lib in $(ldd "$1" 2>/dev/null | awk '/=> \// { print $3 } /^\t\// { print $1 }'); do
		mkdir -p "$2$(dirname "$lib")"
		cp -L "$lib" "$2$lib"
	done
}

build_debian_runtime() { # outdir
	local out=$1 d=$CACHE/build/debian
	apt_update_once
	rm -rf "$d"
	mkdir -p "$d/deb" "$out"
	msg "fetching Debian containerd + runc packages (fallback)"
	chown _apt "$d/deb" 2>/dev/null || true # silences apt's "unsandboxed" warning
	(cd "$d/deb" && apt-get download containerd runc >&2) || return 1
	local f bin
	for f in "$d"/deb/*.deb; do dpkg-deb -x "$f" "$d/x" || return 1; done
	cp "$d/x/usr/bin/containerd" "$d/x/usr/bin/containerd-shim-runc-v2" "$d/x/usr/bin/ctr" "$out/" || return 1
	cp "$d/x/usr/sbin/runc" "$out/runc" || return 1
	mkdir -p "$out/libroot"
	for bin in "$out"/containerd "$out"/containerd-shim-runc-v2 "$out"/ctr "$out"/runc; do
		copy_libs "$bin" "$out/libroot" || return 1
	done
	echo "debian containerd=$(dpkg-deb -f "$d"/deb/containerd_*.deb Version) runc=$(dpkg-deb -f "$d"/deb/runc_*.deb Version)" >"$out/SOURCE"
}

ensure_runtime() {
	local key
	case $RUNTIME_SOURCE in
	auto | gomod) key=gomod-$CONTAINERD_VERSION-$RUNC_VERSION ;;
	debian) key=debian ;;
	*) die "VM_RUNTIME_SOURCE must be auto, gomod or debian" ;;
	esac
	if [[ $RUNTIME_SOURCE == auto && ! -f $RT/$key/ready && -f $RT/debian/ready && -f $RT/$key.failed ]]; then
		key=debian
	fi
	if [[ ! -f $RT/$key/ready ]]; then
		rm -rf "${RT:?}/$key"
		if [[ $key == debian ]]; then
			build_debian_runtime "$RT/$key" || die "fetching Debian containerd/runc failed"
		elif build_gomod_runtime "$RT/$key"; then
			:
		elif [[ $RUNTIME_SOURCE == auto ]]; then
			msg "WARNING: building containerd/runc from the Go module proxy failed; falling back to Debian's containerd 1.6 + runc 1.1"
			touch "$RT/$key.failed"
			rm -rf "${RT:?}/$key"
			key=debian
			[[ -f $RT/$key/ready ]] || build_debian_runtime "$RT/$key" || die "fetching Debian containerd/runc failed"
		else
			die "building containerd/runc from the Go module proxy failed"
		fi
		touch "$RT/$key/ready"
	fi
	RUNTIME_DIR=$RT/$key
}

# ---------------------------------------------------------------------------
# systemd (for run --systemd): Debian's systemd + libsystemd-shared packages
# (apt-get download + dpkg-deb -x), their other shared libraries as the host's
# ldd resolves them. No dbus-daemon: as root, systemctl, runc and the agent
# talk to systemd over its private socket /run/systemd/private.
# ---------------------------------------------------------------------------
SD=$CACHE/systemd
SYSTEMD_FILES=(lib/systemd/systemd lib/systemd/systemd-shutdown lib/systemd/systemd-executor
	bin/systemctl usr/bin/systemd-run usr/bin/systemd-cgls usr/bin/systemd-analyze
	etc/systemd/system.conf)
ensure_systemd() {
	[[ -f $SD/ready ]] && return
	apt_update_once
	rm -rf "$SD.tmp"
	mkdir -p "$SD.tmp/deb"
	chown _apt "$SD.tmp/deb" 2>/dev/null || true
	msg "fetching Debian systemd + libsystemd-shared packages"
	(cd "$SD.tmp/deb" && apt-get download systemd libsystemd-shared >&2) || return 1
	local f x=$SD.tmp/x s=$SD.tmp/stage
	for f in "$SD.tmp"/deb/*.deb; do dpkg-deb -x "$f" "$x" || return 1; done
	[[ -x $x/lib/systemd/systemd ]] || return 1
	mkdir -p "$s"
	for f in "${SYSTEMD_FILES[@]}"; do
		[[ -e $x/$f ]] || continue
		mkdir -p "$s/$(dirname "$f")"
		cp -a "$x/$f" "$s/$f"
	done
	local sdlib=usr/lib/x86_64-linux-gnu/systemd
	mkdir -p "$s/$sdlib"
	cp -a "$x/$sdlib"/*.so "$s/$sdlib/"
	# The packages' own libraries first, the rest from the host.
	for f in "${SYSTEMD_FILES[@]}"; do
		[[ -f $s/$f && $f != etc/* ]] || continue
		LD_LIBRARY_PATH=$x/$sdlib copy_libs "$s/$f" "$s" || return 1
	done
	rm -rf "$s/$x" # copy_libs puts the package's libsystemd-* under their extraction path
	find "$s" -depth -type d -empty -delete
	mkdir -p "$s/etc/systemd/system" "$s/var/lib/systemd"
	: >"$s/etc/machine-id"
	printf 'PRETTY_NAME="vmharness (Debian systemd %s)"\nID=vmharness\n' \
		"$(dpkg-deb -f "$SD.tmp"/deb/systemd_*.deb Version)" >"$s/etc/os-release"
	dpkg-deb -f "$SD.tmp"/deb/systemd_*.deb Version >"$SD.tmp/version"
	mkcpio "$s" "$SD.tmp/systemd.cpio"
	rm -rf "$x" "$s" "$SD.tmp/deb"
	rm -rf "$SD"
	mv "$SD.tmp" "$SD"
	touch "$SD/ready"
	msg "systemd $(cat "$SD/version") staged"
}

# ---------------------------------------------------------------------------
# OCI images (busybox, pause)
# ---------------------------------------------------------------------------
IMG=$CACHE/images
IMAGES_REV=1 # bump when ensure_images changes what goes into the images
ensure_images() {
	local h
	h=$( (echo "images-rev-$IMAGES_REV"; cat "$HERE/ociimage/main.go" "$HERE/pause.c" /bin/busybox) | sha256sum | cut -c1-16)
	if [[ -f $IMG/ready && $(cat "$IMG/ready") == "$h" ]]; then return; fi
	msg "building OCI images"
	rm -rf "$IMG"
	mkdir -p "$IMG/tools"
	(cd "$HERE" && go build -o "$IMG/tools/ociimage" ./ociimage) >&2 ||
		(cd "$HERE/ociimage" && GO111MODULE=off GOFLAGS='' go build -o "$IMG/tools/ociimage" main.go) >&2 ||
		die "building test/vm/ociimage failed"
	gcc -static -Os -s -o "$IMG/tools/pause" "$HERE/pause.c" || die "gcc -static pause.c failed"

	local r=$IMG/rootfs-busybox a
	mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/root" "$r/var" "$r/run" "$r/usr/bin" "$r/usr/sbin" "$r/sbin"
	chmod 1777 "$r/tmp"
	cp /bin/busybox "$r/bin/busybox"
	for a in $(/bin/busybox --list); do
		[[ $a == busybox ]] || ln -sf busybox "$r/bin/$a"
	done
	echo 'root:x:0:0:root:/root:/bin/sh' >"$r/etc/passwd"
	echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >>"$r/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
	"$IMG/tools/ociimage" -rootfs "$r" -name localhost/resize-agent/busybox:latest \
		-cmd '["/bin/sh"]' -env PATH=/usr/sbin:/usr/bin:/sbin:/bin -o "$IMG/busybox.tar"

	r=$IMG/rootfs-pause
	mkdir -p "$r"
	cp "$IMG/tools/pause" "$r/pause"
	"$IMG/tools/ociimage" -rootfs "$r" -name localhost/resize-agent/pause:latest \
		-entrypoint '["/pause"]' -o "$IMG/pause.tar"
	rm -rf "$IMG/rootfs-busybox" "$IMG/rootfs-pause"
	echo "$h" >"$IMG/ready"
}

# ---------------------------------------------------------------------------
# Initramfs pieces (cpio newc, uncompressed: fastest to unpack under TCG)
# ---------------------------------------------------------------------------
CP=$CACHE/cpio
mkcpio() { # dir out
	(cd "$1" && find . -mindepth 1 -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) >"$2.tmp"
	mv "$2.tmp" "$2"
}

ensure_cpios() {
	mkdir -p "$CP"
	local kver h s
	kver=$(cat "$KDIR/kver")
	# base: busybox, kernel modules, /dev/console.
	h=$(hashof /bin/busybox "$KDIR/modules.list" "$KDIR/kver")
	if [[ ! -f $CP/base.cpio || $(cat "$CP/base.stamp" 2>/dev/null) != "$h" ]]; then
		s=$CP/stage-base
		rm -rf "$s"
		mkdir -p "$s/bin" "$s/dev" "$s/proc" "$s/sys" "$s/tmp" "$s/run" "$s/etc" "$s/root" "$s/var" "$s/harness" "$s/usr/local/bin"
		cp /bin/busybox "$s/bin/busybox"
		ln -s busybox "$s/bin/sh"
		mknod -m 600 "$s/dev/console" c 5 1
		mknod -m 666 "$s/dev/null" c 1 3
		cp -a "$KDIR/out/lib" "$s/"
		cp "$KDIR/modules.list" "$s/harness/modules"
		mkcpio "$s" "$CP/base.cpio"
		rm -rf "$s"
		echo "$h" >"$CP/base.stamp"
	fi
	# containerd: runtime binaries and images.
	h=$(hashof "$RUNTIME_DIR/SOURCE" "$IMG/ready")
	if [[ ! -f $CP/containerd.cpio || $(cat "$CP/containerd.stamp" 2>/dev/null) != "$h" ]]; then
		s=$CP/stage-containerd
		rm -rf "$s"
		mkdir -p "$s/usr/local/bin" "$s/images"
		cp "$RUNTIME_DIR"/containerd "$RUNTIME_DIR"/containerd-shim-runc-v2 "$RUNTIME_DIR"/ctr "$RUNTIME_DIR"/runc "$s/usr/local/bin/"
		[[ -x $RUNTIME_DIR/crictl ]] && cp "$RUNTIME_DIR/crictl" "$s/usr/local/bin/"
		[[ -d $RUNTIME_DIR/libroot ]] && cp -a "$RUNTIME_DIR/libroot/." "$s/"
		cp "$IMG/busybox.tar" "$IMG/pause.tar" "$s/images/"
		mkcpio "$s" "$CP/containerd.cpio"
		rm -rf "$s"
		echo "$h" >"$CP/containerd.stamp"
	fi
	# probe: busybox + an init that prints a marker (for the KVM probe).
	if [[ ! -f $CP/probe.cpio ]]; then
		s=$CP/stage-probe
		rm -rf "$s"
		mkdir -p "$s/bin" "$s/dev"
		cp /bin/busybox "$s/bin/busybox"
		mknod -m 600 "$s/dev/console" c 5 1
		printf '#!/bin/busybox sh\n/bin/busybox echo VMHARNESS-PROBE-OK\n/bin/busybox poweroff -f\n' >"$s/init"
		chmod 755 "$s/init"
		mkcpio "$s" "$CP/probe.cpio"
		rm -rf "$s"
	fi
}

# Serialise cache updates between concurrent vm.sh invocations.
lock_cache() {
	mkdir -p "$CACHE"
	exec {CACHE_LOCK_FD}>"$CACHE/.lock"
	flock "$CACHE_LOCK_FD"
}
unlock_cache() { exec {CACHE_LOCK_FD}>&-; }

cmd_prepare() {
	local t0
	t0=$(now)
	lock_cache
	ensure_host_packages
	ensure_kernel
	ensure_runtime
	ensure_images
	ensure_cpios
	(ensure_systemd) || msg "warning: systemd packages not available (run --systemd will fail)"
	unlock_cache
	msg "prepare done in $(elapsed "$t0" "$(now)")s (cache $CACHE; runtime: $(cat "$RUNTIME_DIR/SOURCE"))"
}

# Quiet variant used by `run`: only does work when something is missing.
ensure_prepared() {
	if [[ -f $KDIR/ready && -f $IMG/ready && -f $CP/base.cpio && -f $CP/containerd.cpio && -f $CP/probe.cpio ]] &&
		command -v qemu-system-x86_64 >/dev/null; then
		lock_cache
		ensure_runtime
		ensure_images
		ensure_cpios
		unlock_cache
		return
	fi
	cmd_prepare
}

# ---------------------------------------------------------------------------
# Accelerator probe (KVM has been seen to hang here: hard timeout, then TCG)
# ---------------------------------------------------------------------------
probe_kvm() {
	[[ -r /dev/kvm && -w /dev/kvm ]] || return 1
	local d log pid i ok=1
	d=$(mktemp -d "${TMPDIR:-/tmp}/vmprobe.XXXXXX")
	log=$d/console
	# The wrapper subshell keeps bash's "Aborted"/"Killed" job notices in $log.
	(
		qemu-system-x86_64 -accel kvm -cpu host -m 256M -smp 1 \
			-kernel "$(boot_kernel)" -initrd "$CP/probe.cpio" \
			-append "console=ttyS0 loglevel=3 panic=-1 rdinit=/init" \
			-nographic -nic none -no-reboot </dev/null &
		echo $! >"$d/pid"
		wait $!
	) >"$log" 2>&1 &
	for ((i = 0; i < 50; i++)); do [[ -s $d/pid ]] && break; sleep 0.02; done
	pid=$(cat "$d/pid" 2>/dev/null || echo "$!")
	for ((i = 0; i < KVM_PROBE_TIMEOUT * 10; i++)); do
		if grep -q VMHARNESS-PROBE-OK "$log" 2>/dev/null; then
			ok=0
			break
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		# Give a successful guest a moment to power off, then kill hard.
		[[ $ok == 0 ]] && sleep 1
		kill -9 "$pid" 2>/dev/null || true
	fi
	# Do not wait(): a qemu stuck in the kernel may never be reaped.
	disown "$pid" 2>/dev/null || true
	rm -rf "$d"
	return $ok
}

resolve_accel() {
	case ${VM_ACCEL:-auto} in
	kvm | tcg) ACCEL=$VM_ACCEL ;;
	auto)
		if probe_kvm; then ACCEL=kvm; else ACCEL=tcg; fi
		export VM_ACCEL=$ACCEL # cached for this run (and child vm.sh calls)
		;;
	*) die "VM_ACCEL must be auto, kvm or tcg" ;;
	esac
}

cmd_accel() {
	ensure_prepared >/dev/null
	resolve_accel
	echo "$ACCEL"
}

# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------
# Console filter (awk; see cmd_run). Files under w: console.log (everything),
# booted (host time of the first init line), status, setupfailed.
# shellcheck disable=SC2016
CONSOLE_AWK='
{
	gsub(/\r/, "")
	if (!booted) gsub(/\033(c|\[[0-9;?]*[A-Za-z])/, "")
	print > (w "/console.log")
	if (clog != "") { print > clog; fflush(clog) }
	if (!booted && index($0, "VMHARNESS-INIT")) {
		booted = 1
		cmd = "date +%s.%N"; cmd | getline tb; close(cmd)
		print tb > (w "/booted"); close(w "/booted")
		printf "[vm.sh] guest init started: boot took %.1fs (%s)\n", tb - t0, info > "/dev/stderr"
		fflush("/dev/stderr")
		if (quiet) next
	}
	if (match($0, /VMHARNESS-EXIT=[0-9]+$/)) {
		print substr($0, RSTART + 15) > (w "/status"); close(w "/status")
	}
	if (index($0, "VMHARNESS-SETUP-FAILED: ") == 1) {
		print substr($0, 25) > (w "/setupfailed"); close(w "/setupfailed")
	}
	if (quiet) {
		if (!booted) next
		if ($0 ~ /^\[ *[0-9]+\.[0-9]+\] /) next
		if (index($0, "[vmharness] ") == 1 && $0 !~ /ERROR|warning/) next
	}
	print
	fflush()
}'

squote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

usage() {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

cmd_run() {
	local payloads=() collects=() envs=() guestfwds=() hostfwds=() net=0 containerd=0 systemd=0 mem=2G cpus=2 timeout=600 quiet=0 console_log="" ctd_log=${VM_CONTAINERD_LOG:-0}
	while (($#)); do
		case $1 in
		--payload) payloads+=("$2"); shift 2 ;;
		--payload=*) payloads+=("${1#*=}"); shift ;;
		--collect) collects+=("$2"); shift 2 ;;
		--collect=*) collects+=("${1#*=}"); shift ;;
		--env) envs+=("$2"); shift 2 ;;
		--env=*) envs+=("${1#*=}"); shift ;;
		--containerd) containerd=1; shift ;;
		--net) net=1; shift ;;
		--guestfwd) guestfwds+=("$2"); net=1; shift 2 ;;
		--guestfwd=*) guestfwds+=("${1#*=}"); net=1; shift ;;
		--hostfwd) hostfwds+=("$2"); net=1; shift 2 ;;
		--hostfwd=*) hostfwds+=("${1#*=}"); net=1; shift ;;
		--systemd) systemd=1; shift ;;
		--containerd-log) ctd_log=1; shift ;;
		--mem) mem=$2; shift 2 ;;
		--mem=*) mem=${1#*=}; shift ;;
		--cpus) cpus=$2; shift 2 ;;
		--cpus=*) cpus=${1#*=}; shift ;;
		--timeout) timeout=$2; shift 2 ;;
		--timeout=*) timeout=${1#*=}; shift ;;
		--quiet) quiet=1; shift ;;
		--console-log) console_log=$2; shift 2 ;;
		--console-log=*) console_log=${1#*=}; shift ;;
		--) shift; break ;;
		-h | --help) usage ;;
		*) die "run: unknown option $1 (the command goes after --)" ;;
		esac
	done
	(($#)) || die "run: no command given (usage: vm.sh run [options] -- CMD [ARGS...])"
	[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
	[[ $cpus =~ ^[0-9]+$ ]] || die "--cpus must be a number"
	local p c
	for p in "${payloads[@]}"; do [[ -d $p ]] || die "--payload $p: not a directory"; done
	for c in "${collects[@]}"; do [[ $c == /*:* ]] || die "--collect $c: expected /GUESTDIR:HOSTDIR"; done
	for c in "${envs[@]}"; do [[ $c =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $c: expected KEY=VALUE"; done
	local ipre='([0-9]{1,3}\.){3}[0-9]{1,3}' portre='[0-9]{1,5}'
	for c in "${guestfwds[@]}"; do
		[[ $c =~ ^$ipre:$portre=$portre$ ]] || die "--guestfwd $c: expected GUESTIP:PORT=HOSTPORT"
	done
	for c in "${hostfwds[@]}"; do
		[[ $c =~ ^($ipre:)?$portre=$portre$ ]] || die "--hostfwd $c: expected [HOSTIP:]HOSTPORT=GUESTPORT"
	done

	ensure_prepared
	if ((systemd)); then
		lock_cache
		ensure_systemd || die "fetching/staging Debian's systemd failed"
		unlock_cache
	fi
	if ((net)); then
		lock_cache
		ensure_net_modules
		unlock_cache
	fi
	resolve_accel

	local work
	work=$(mktemp -d "${TMPDIR:-/tmp}/vmrun.XXXXXX")
	WATCHDOG_PID=""
	# shellcheck disable=SC2064
	trap "cleanup_run '$work'" EXIT
	trap 'exit 130' INT TERM

	# Per-run initramfs part: /init, /harness/*, /payload.
	local s=$work/stage i
	mkdir -p "$s/harness" "$s/payload/bin"
	cp "$HERE/guest-init.sh" "$s/init"
	chmod 755 "$s/init"
	for p in "${payloads[@]}"; do
		cp -al "$p/." "$s/payload/" 2>/dev/null || cp -a "$p/." "$s/payload/"
	done
	# The guest has no libc: bring the shared libraries (and the dynamic
	# loader) of dynamically linked payload executables, as ldd sees them here.
	local f
	while IFS= read -r -d '' f; do
		[[ $(head -c 4 "$f" | od -An -tx1 | tr -d ' \n') == 7f454c46 ]] || continue
		readelf -l "$f" 2>/dev/null | grep -q 'Requesting program interpreter' || continue
		copy_libs "$f" "$s"
	done < <(find "$s/payload" -type f -perm -u+x -print0)
	{
		echo "VMH_CONTAINERD=$containerd"
		echo "VMH_CONTAINERD_LOG=$ctd_log"
		echo "VMH_SYSTEMD=$systemd"
		echo "VMH_NET=$net"
		echo "VMH_NCOLLECT=${#collects[@]}"
		for i in "${!collects[@]}"; do
			echo "VMH_COLLECT_$i=$(squote "${collects[$i]%%:*}")"
		done
	} >"$s/harness/config"
	{
		for c in "${envs[@]}"; do echo "export ${c%%=*}=$(squote "${c#*=}")"; done
	} >"$s/harness/env"
	{
		local a line=""
		for a in "$@"; do line+="$(squote "$a") "; done
		echo "$line"
	} >"$s/harness/cmd"
	mkcpio "$s" "$work/run.cpio"
	rm -rf "$s"
	local parts=("$CP/base.cpio")
	((containerd)) && parts+=("$CP/containerd.cpio")
	((systemd)) && parts+=("$SD/systemd.cpio")
	((net)) && parts+=("$NETK/$(cat "$KDIR/kver")/net.cpio")
	cat "${parts[@]}" "$work/run.cpio" >"$work/initrd"
	local sdargs=""
	# systemd as PID 1: our own target only, status lines off under --quiet.
	((systemd)) && sdargs="systemd.unit=vmharness.target systemd.firstboot=0 systemd.show_status=$( ((quiet)) && echo error || echo auto)"

	# no_timer_check: under TCG on a loaded host the guest's IO-APIC timer
	# check can miss its ticks and panic ("IO-APIC + timer doesn't work").
	local qemu=(qemu-system-x86_64 -m "$mem" -smp "$cpus"
		-kernel "$(boot_kernel)" -initrd "$work/initrd"
		-append "console=ttyS0 loglevel=3 panic=-1 rdinit=/init edd=off mitigations=off tsc=reliable no_timer_check $sdargs ${VM_KERNEL_ARGS:-}"
		-nographic -no-reboot)
	if ((net)); then
		# User networking, restricted: the guest (10.0.2.15) reaches nothing
		# but the guestfwd addresses, each connection a new `busybox nc` to
		# the host's loopback port (a tcp: chardev would carry one
		# connection, opened at start); hostfwd reaches the guest's ports.
		local netdev=user,id=net0,restrict=on fwd host guest
		for fwd in "${guestfwds[@]}"; do
			netdev+=",guestfwd=tcp:${fwd%%=*}-cmd:/bin/busybox nc 127.0.0.1 ${fwd#*=}"
		done
		for fwd in "${hostfwds[@]}"; do
			host=${fwd%%=*} guest=${fwd#*=}
			[[ $host == *:* ]] || host=127.0.0.1:$host
			netdev+=",hostfwd=tcp:$host-10.0.2.15:$guest"
		done
		qemu+=(-netdev "$netdev" -device virtio-net-pci,netdev=net0)
	else
		qemu+=(-nic none)
	fi
	if [[ $ACCEL == kvm ]]; then
		qemu+=(-accel kvm -cpu host)
	else
		# shellcheck disable=SC2054 # commas are qemu's
		qemu+=(-accel tcg,thread=multi -cpu max)
	fi
	if ((${#collects[@]})); then
		qemu+=(-device virtio-serial-pci)
		for i in "${!collects[@]}"; do
			: >"$work/collect$i.tar"
			qemu+=(-chardev "file,id=collect$i,path=$work/collect$i.tar"
				-device "virtserialport,chardev=collect$i,name=vmharness.collect$i")
		done
	fi

	[[ -n $console_log ]] && : >"$console_log"
	local t0 tboot="" tend status="" booted=0 setup_failed=""
	t0=$(now)
	# Watchdog: kills qemu at the deadline (and ends soon after qemu does).
	(
		end=$(($(date +%s) + timeout))
		for ((i = 0; i < 250; i++)); do [[ -s $work/qemu.pid ]] && break; sleep 0.02; done
		qp=$(cat "$work/qemu.pid" 2>/dev/null) || exit 0
		# QEMU's CPU time (utime + stime, in clock ticks), last seen alive:
		# how busy the guest kept its host core, for the test budget.
		local st ticks=0
		while kill -0 "$qp" 2>/dev/null; do
			if (($(date +%s) >= end)); then
				: >"$work/timedout"
				kill -9 "$qp" 2>/dev/null
				exit 0
			fi
			if read -r st <"/proc/$qp/stat" 2>/dev/null; then
				st=${st##*) }
				read -r -a st <<<"$st"
				ticks=$((st[11] + st[12]))
				echo "$ticks" >"$work/qemu.ticks"
			fi
			sleep 0.2
		done
	) &
	WATCHDOG_PID=$!
	# The console goes through awk (a bash read loop manages only ~100 KB/s):
	# strip CRs, keep a full log, spot the markers, apply --quiet.
	local awk=(awk)
	awk -W version 2>&1 | grep -q mawk && awk=(awk -W interactive)
	(
		"${qemu[@]}" &
		echo $! >"$work/qemu.pid"
		wait $!
	) </dev/null 2>"$work/qemu.err" |
		"${awk[@]}" -v t0="$t0" -v quiet="$quiet" -v w="$work" -v clog="$console_log" \
			-v info="accel $ACCEL, $cpus cpus, $mem$( ((systemd)) && echo ', systemd')" "$CONSOLE_AWK" || true
	for ((i = 0; i < 250; i++)); do [[ -s $work/qemu.pid ]] && break; sleep 0.02; done
	QEMU_PID=$(cat "$work/qemu.pid" 2>/dev/null || true)
	kill -0 "$QEMU_PID" 2>/dev/null && sleep 0.2
	kill -9 "$QEMU_PID" 2>/dev/null || true
	rm -f "$work/qemu.pid"
	wait "$WATCHDOG_PID" 2>/dev/null || true
	QEMU_PID=""
	WATCHDOG_PID=""
	tend=$(now)
	[[ -s $work/booted ]] && booted=1 && tboot=$(cat "$work/booted")
	[[ -s $work/status ]] && status=$(cat "$work/status")
	[[ -s $work/setupfailed ]] && setup_failed=$(cat "$work/setupfailed")
	if [[ -e $work/timedout ]]; then
		if ((quiet)); then
			msg "last console lines:"
			tail -n 20 "$work/console.log" | sed 's/^/[console] /' >&2
		fi
		if ((!booted)); then
			msg "######## VM did not boot: timed out after $timeout s (accel $ACCEL) ########"
		else
			msg "######## timed out after $timeout s (accel $ACCEL) ########"
		fi
		exit 124
	fi

	for i in "${!collects[@]}"; do
		local hdir=${collects[$i]#*:}
		if [[ -s $work/collect$i.tar ]]; then
			mkdir -p "$hdir"
			tar -xf "$work/collect$i.tar" -C "$hdir" --no-same-owner ||
				msg "ERROR: --collect ${collects[$i]}: cannot unpack"
		else
			msg "warning: --collect ${collects[$i]}: nothing received"
		fi
	done

	if ((!booted)) || [[ -z $status ]]; then
		local panic
		panic=$(grep -m1 'Kernel panic' "$work/console.log" || true)
		if ((quiet)); then
			msg "last console lines:"
			tail -n 40 "$work/console.log" | sed 's/^/[console] /' >&2
		fi
		[[ -s $work/qemu.err ]] && sed 's/^/[qemu] /' "$work/qemu.err" >&2
		if ((!booted)); then
			msg "######## VM did not boot (qemu exited after $(elapsed "$t0" "$tend")s)${panic:+: $panic} ########"
		else
			msg "######## VM died without reporting an exit status after $(elapsed "$t0" "$tend")s: ${panic:-kernel panic or init crash?} ########"
		fi
		exit 125
	fi
	[[ -n $setup_failed ]] && msg "######## guest setup failed: $setup_failed ########"
	local cpu=""
	[[ -s $work/qemu.ticks ]] && cpu=$(awk -v t="$(cat "$work/qemu.ticks")" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf ", QEMU CPU %.0fs", t / hz }')
	msg "exit status $status; total $(elapsed "$t0" "$tend")s (boot $(elapsed "$t0" "$tboot")s, accel $ACCEL$cpu)"
	exit "$status"
}

cleanup_run() {
	if [[ -s $1/qemu.pid ]]; then
		kill -9 "$(cat "$1/qemu.pid")" 2>/dev/null || true
	fi
	if [[ -n ${WATCHDOG_PID:-} ]]; then
		kill "$WATCHDOG_PID" 2>/dev/null || true
		wait "$WATCHDOG_PID" 2>/dev/null || true
	fi
	if [[ ${VM_KEEP:-0} == 1 ]]; then
		msg "kept $1"
	else
		rm -rf "$1"
	fi
}

main() {
	(($#)) || usage
	[[ $(id -u) == 0 ]] || die "must run as root (apt-get, mknod)"
	local sub=$1
	shift
	case $sub in
	prepare)
		[[ ${1:-} == "" || ${1:-} == --net ]] || die "prepare: unknown option $1"
		cmd_prepare
		if [[ ${1:-} == --net ]]; then
			lock_cache
			ensure_net_modules
			unlock_cache
		fi
		;;
	run) cmd_run "$@" ;;
	accel) cmd_accel ;;
	clean) rm -rf "$CACHE" ;;
	-h | --help | help) usage ;;
	*) die "unknown subcommand $sub" ;;
	esac
}

main "$@"
