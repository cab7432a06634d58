#!/bin/busybox sh
# Guest /init for the resize-agent VM test harness (see test/vm/vm.sh).
# Runs under busybox sh as PID 1 of a QEMU guest booted from an initramfs.
#
# Stage 1 (PID 1 in the kernel's initramfs rootfs): runc cannot pivot_root
# out of the initramfs rootfs, so copy everything into a fresh tmpfs and
# switch_root into it. Stage 2 (PID 1 in the tmpfs root): mount the API
# filesystems and cgroup2, load modules, optionally start containerd, run the
# command from /harness/cmd, send back collected directories, print
# VMHARNESS-EXIT=<status> and power off.
#
# With VMH_SYSTEMD=1 (vm.sh run --systemd), stage 2 only writes a few unit
# files and execs Debian's systemd as PID 1, which mounts the API filesystems
# and cgroup2 itself; its unit vmharness.service runs this script again as
# stage 3, which does the rest of stage 2's work (no mounts) as a service.
#
# Files written by vm.sh into the initramfs:
#   /harness/config   shell variables (VMH_*), sourced below
#   /harness/cmd      the command, as a shell script (already quoted)
#   /harness/modules  kernel module paths (relative to /lib/modules/<ver>), load order
B=/bin/busybox

if [ "$1" != stage2 ] && [ "$1" != stage3 ]; then
	$B echo
	$B echo "VMHARNESS-INIT stage1"
	$B mkdir -p /newroot
	$B mount -t tmpfs -o mode=0755,size=90% tmpfs /newroot
	for e in /* /.[!.]*; do
		case "$e" in
		/newroot | '/.[!.]*') ;;
		*) $B cp -a "$e" /newroot/ ;;
		esac
	done
	# shellcheck disable=SC2093 # the lines below only run if exec fails
	exec $B switch_root /newroot /init stage2
	$B echo "VMHARNESS-SETUP-FAILED: switch_root failed"
	$B echo "VMHARNESS-EXIT=125"
	$B poweroff -f
fi

# ---- stage 2 ----
export PATH=/payload/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
$B mkdir -p /usr/bin /usr/sbin /sbin /root
$B --install -s /bin 2>/dev/null

# shellcheck disable=SC1091
. /harness/config

log() { [ "${VMH_QUIET:-0}" = 1 ] || echo "[vmharness] $*"; }
fail() {
	echo "VMHARNESS-SETUP-FAILED: $*"
	echo "VMHARNESS-EXIT=125"
	poweroff -f
	sleep 10
}

if [ "${VMH_SYSTEMD:-0}" = 1 ] && [ "$1" = stage2 ]; then
	mkdir -p /etc/systemd/system /etc/systemd/system.conf.d /var/lib /var/log /run /tmp
	# Accounting on for every unit, so that systemd enables the cpu, memory,
	# io and pids controllers all the way down (as on a kubelet node).
	cat >/etc/systemd/system.conf.d/vmharness.conf <<EOF
[Manager]
DefaultCPUAccounting=yes
DefaultMemoryAccounting=yes
DefaultIOAccounting=yes
DefaultTasksAccounting=yes
DefaultStandardOutput=tty
EOF
	cat >/etc/systemd/system/vmharness.target <<EOF
[Unit]
Description=vmharness
Requires=vmharness.service
AllowIsolate=yes
EOF
	cat >/etc/systemd/system/vmharness.service <<EOF
[Unit]
Description=vmharness command
DefaultDependencies=no
OnFailure=vmharness-failed.service

[Service]
Type=simple
ExecStart=/bin/busybox sh /init stage3
StandardInput=null
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/console
TTYReset=no
TTYVHangup=no
Delegate=yes
KillMode=process
TimeoutStartSec=infinity
EOF
	# If the unit cannot even start, say so and end the VM (else: timeout).
	cat >/etc/systemd/system/vmharness-failed.service <<EOF
[Unit]
Description=vmharness command failed to run
DefaultDependencies=no

[Service]
Type=oneshot
StandardOutput=tty
TTYPath=/dev/console
ExecStart=/bin/busybox sh -c 'echo "VMHARNESS-SETUP-FAILED: vmharness.service failed"; echo VMHARNESS-EXIT=125; /bin/busybox poweroff -f'
EOF
	mount -t proc proc /proc
	log "stage2: exec systemd ($(cut -d' ' -f1 /proc/uptime)s since kernel start)"
	# shellcheck disable=SC2093
	exec /lib/systemd/systemd
	fail "exec /lib/systemd/systemd failed"
fi

mkdir -p /proc /sys /dev /tmp /run /var/lib /var/log /etc
if [ "$1" = stage3 ]; then
	# stdout is the console (a tty): no pager, no colours, no size probing.
	export SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 SYSTEMD_URLIFY=0 TERM=dumb COLUMNS=250
	log "stage3 (systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(cut -d' ' -f1 /proc/uptime)s since kernel start)"
	mounted() { grep -q " $1 " /proc/mounts; }
	mounted /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null
	mounted /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
	mounted /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
else
mount -t proc proc /proc
mount -t sysfs sysfs /sys
log "stage2 up ($(cut -d' ' -f1 /proc/uptime)s since kernel start)"
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
ln -sf pts/ptmx /dev/ptmx 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t mqueue mqueue /dev/mqueue 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || fail "cannot mount cgroup2"
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
# Like systemd: shared propagation on / (what kubelet/containerd expect).
mount --make-rshared /

ln -sf /proc/self/fd /dev/fd 2>/dev/null
ln -sf /proc/self/fd/0 /dev/stdin 2>/dev/null
ln -sf /proc/self/fd/1 /dev/stdout 2>/dev/null
ln -sf /proc/self/fd/2 /dev/stderr 2>/dev/null
fi

hostname vmharness
echo vmharness >/etc/hostname
[ -e /etc/hosts ] || printf '127.0.0.1 localhost vmharness\n::1 localhost\n' >/etc/hosts
[ -e /etc/resolv.conf ] || : >/etc/resolv.conf
[ -e /etc/passwd ] || echo 'root:x:0:0:root:/root:/bin/sh' >/etc/passwd
[ -e /etc/group ] || echo 'root:x:0:' >/etc/group
ip link set lo up 2>/dev/null

# Kernel modules, in dependency order.
kver=$(uname -r)
if [ -f /harness/modules ]; then
	while read -r m; do
		[ -n "$m" ] || continue
		insmod "/lib/modules/$kver/$m" 2>/tmp/insmod.err ||
			grep -q 'File exists' /tmp/insmod.err ||
			echo "[vmharness] warning: insmod $m: $(cat /tmp/insmod.err)"
	done </harness/modules
fi

# run --net: the NIC's modules, and the address slirp expects (no DHCP;
# no default route: with restrict=on only the forwarded addresses answer).
if [ "${VMH_NET:-0}" = 1 ]; then
	while read -r m; do
		[ -n "$m" ] || continue
		insmod "/lib/modules/$kver/$m" 2>/tmp/insmod.err ||
			grep -q 'File exists' /tmp/insmod.err ||
			echo "[vmharness] warning: insmod $m: $(cat /tmp/insmod.err)"
	done </harness/modules-net
	i=0
	until ip link show eth0 >/dev/null 2>&1 || [ $i -gt 50 ]; do sleep 0.1; i=$((i + 1)); done
	ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 || fail "cannot configure eth0"
	log "eth0 10.0.2.15/24"
fi

# cgroup v2: delegate controllers from the root (systemd does it itself).
if [ "$1" = stage3 ]; then
	log "cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.subtree_control) (systemd)"
else
want="cpuset cpu io memory pids hugetlb"
ctrl=""
for c in $want; do
	if grep -qw "$c" /sys/fs/cgroup/cgroup.controllers; then ctrl="$ctrl +$c"; fi
done
# shellcheck disable=SC2086
echo $ctrl >/sys/fs/cgroup/cgroup.subtree_control || fail "cannot enable controllers:$ctrl"
log "cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
fi

if [ "${VMH_CONTAINERD:-0}" = 1 ]; then
	snap=native
	if grep -qw overlay /proc/filesystems; then snap=overlayfs; fi
	export CONTAINERD_SNAPSHOTTER=$snap
	mkdir -p /etc/containerd /var/lib/containerd /run/containerd /opt/cni/bin /etc/cni/net.d
	sdcg=false
	[ "$1" = stage3 ] && sdcg=true
	ctdver=$(containerd --version 2>/dev/null | cut -d' ' -f3)
	case "$ctdver" in
	v1.* | 1.*)
		# Debian fallback (containerd 1.6): config format version 2.
		cat >/etc/containerd/config.toml <<EOF
version = 2
root = '/var/lib/containerd'
state = '/run/containerd'

[grpc]
  address = '/run/containerd/containerd.sock'

[plugins]
  [plugins.'io.containerd.grpc.v1.cri']
    sandbox_image = 'localhost/resize-agent/pause:latest'
    disable_tcp_service = true
    [plugins.'io.containerd.grpc.v1.cri'.containerd]
      snapshotter = '$snap'
      default_runtime_name = 'runc'
      [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]
          BinaryName = '/usr/local/bin/runc'
          SystemdCgroup = $sdcg
    [plugins.'io.containerd.grpc.v1.cri'.cni]
      bin_dir = '/opt/cni/bin'
      conf_dir = '/etc/cni/net.d'
EOF
		;;
	*)
		cat >/etc/containerd/config.toml <<EOF
version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[grpc]
  address = '/run/containerd/containerd.sock'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = '$snap'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'localhost/resize-agent/pause:latest'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/usr/local/bin/runc'
          SystemdCgroup = $sdcg
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/opt/cni/bin']
      conf_dir = '/etc/cni/net.d'

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
EOF
		;;
	esac
	log "starting containerd ($ctdver), snapshotter $snap, SystemdCgroup=$sdcg"
	containerd --config /etc/containerd/config.toml >/var/log/containerd.log 2>&1 &
	echo $! >/run/containerd.pid
	i=0
	until ctr version >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 600 ] || ! kill -0 "$(cat /run/containerd.pid)" 2>/dev/null; then
			tail -n 50 /var/log/containerd.log
			fail "containerd did not come up"
		fi
		sleep 0.1
	done
	log "containerd is up after $((i / 10)).$((i % 10))s"
	for img in /images/*.tar; do
		[ -e "$img" ] || continue
		ctr -n k8s.io images import --snapshotter "$snap" "$img" >/tmp/import.log 2>&1 || {
			cat /tmp/import.log
			tail -n 30 /var/log/containerd.log
			fail "ctr images import $img failed"
		}
	done
	log "images: $(ctr -n k8s.io images ls -q | tr '\n' ' ')"
	printf 'runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 60\n' >/etc/crictl.yaml
	export CONTAINERD_ADDRESS=/run/containerd/containerd.sock
	export CONTAINERD_NAMESPACE=k8s.io
	export CONTAINER_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock
	export IMAGE_SERVICE_ENDPOINT=unix:///run/containerd/containerd.sock
fi

# Extra environment from vm.sh --env.
# shellcheck disable=SC1091
[ -f /harness/env ] && . /harness/env
export VMHARNESS=1

mkdir -p /payload
cd /payload || fail "no /payload"
log "running command"
sh /harness/cmd </dev/null
rc=$?
cd /

# Send collected directories back over virtio-serial ports named
# vmharness.collect<N> (host side: a chardev file per port).
n=0
gdir=""
while [ "$n" -lt "${VMH_NCOLLECT:-0}" ]; do
	eval "gdir=\$VMH_COLLECT_$n"
	dev=""
	for p in /sys/class/virtio-ports/*; do
		[ -e "$p/name" ] || continue
		if [ "$(cat "$p/name")" = "vmharness.collect$n" ]; then dev=/dev/${p##*/}; fi
	done
	if [ -z "$dev" ]; then
		echo "[vmharness] ERROR: collect $gdir: no virtio port vmharness.collect$n"
		[ "$rc" != 0 ] || rc=125
	elif [ -d "$gdir" ]; then
		tar -C "$gdir" -cf - . >"$dev" || echo "[vmharness] ERROR: collect $gdir: tar failed"
	else
		echo "[vmharness] warning: collect $gdir: not a directory in the guest"
	fi
	n=$((n + 1))
done

if [ "${VMH_CONTAINERD:-0}" = 1 ] && [ "${VMH_CONTAINERD_LOG:-0}" = 1 ]; then
	echo "----- containerd log -----"
	cat /var/log/containerd.log
	echo "----- end containerd log -----"
fi

echo "VMHARNESS-EXIT=$rc"
poweroff -f
sleep 10
