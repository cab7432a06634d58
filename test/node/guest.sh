#!/bin/sh
# In the node VM (test/vm/vm.sh run --systemd --containerd --net), run by
# test/node/cluster.sh: makes the guest a Kubernetes node as kind's nodes
# are (systemd, containerd with the systemd cgroup driver, a kubelet unit),
# then waits for "stop" on the control port 7000 and leaves the kubelet's
# and containerd's logs in /var/log/node (collected by the host).
set -u
NODE=${NODE_NAME:-vm-node}
say() { echo "[node-guest] $*"; }
mkdir -p /var/log/node /etc/kubernetes/manifests /var/lib/kubelet /opt/cni/bin /etc/cni/net.d

# cAdvisor reads the machine ID; systemd leaves an empty file without one.
[ -s /etc/machine-id ] || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >/etc/machine-id
hostname "$NODE"

# Pod network: CNI's bridge + host-local (+ loopback, which containerd
# runs for each pod's lo). The pods' traffic to 10.0.2.0/24 is routed out
# of eth0 with the pod's own address; slirp asks for the pod's MAC by ARP
# when it answers, which proxy ARP on eth0 gives.
cp /payload/cni/* /opt/cni/bin/
cat >/etc/cni/net.d/10-podnet.conflist <<CNI
{
  "cniVersion": "1.0.0",
  "name": "podnet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
CNI
echo 1 >/proc/sys/net/ipv4/ip_forward
echo 1 >/proc/sys/net/ipv4/conf/eth0/proxy_arp

# NODE_CGROUP_DRIVER=cgroupfs: containerd without SystemdCgroup (restarted;
# its images stay), and the kubelet follows it (it takes the driver from the
# CRI runtime); systemd stays PID 1.
driver=${NODE_CGROUP_DRIVER:-systemd}
case $driver in
systemd) ;;
cgroupfs)
	sed -i 's/SystemdCgroup = true/SystemdCgroup = false/' /etc/containerd/config.toml
	kill "$(cat /run/containerd.pid)"
	while ctr version >/dev/null 2>&1; do sleep 0.2; done
	containerd --config /etc/containerd/config.toml >>/var/log/containerd.log 2>&1 &
	echo $! >/run/containerd.pid
	i=0
	until ctr version >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 300 ] || { say "ERROR: containerd did not come back"; exit 1; }
		sleep 0.2
	done
	;;
*) say "ERROR: NODE_CGROUP_DRIVER=$driver: use systemd or cgroupfs"; exit 1 ;;
esac
say "cgroup driver $driver"

# The agent's image, as `kind load image-archive` loads one.
snap=overlayfs
grep -qw overlay /proc/filesystems || snap=native
ctr --namespace=k8s.io images import --all-platforms --digests --snapshotter=$snap - </payload/resize-agent-image.tar ||
	{ say "ERROR: ctr images import of the agent's image failed"; exit 1; }
say "images: $(ctr -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')"

# A filesystem with real page cache for the tests' hostPath volumes (the
# guest's own files are on tmpfs, whose pages are shmem and need swap to be
# reclaimed): ext4 on a loop device (busybox's mke2fs makes it, the ext4
# driver mounts it), its image filled here in the root
# cgroup so that the loop device's writes charge no pod.
mkdir -p /mnt/disk
for i in 0 1 2 3 4 5 6 7; do [ -e /dev/loop$i ] || mknod /dev/loop$i b 7 $i; done
if dd if=/dev/zero of=/var/lib/node-disk.img bs=1M count=384 2>/dev/null &&
	mke2fs -F /var/lib/node-disk.img >/dev/null && mount -t ext4 -o loop /var/lib/node-disk.img /mnt/disk; then
	chmod 1777 /mnt/disk
	say "page cache disk: ext4 at /mnt/disk"
else
	say "WARNING: no ext4 disk at /mnt/disk (loop, ext4): tests that need page cache will fail"
fi

cp /payload/kubernetes/* /etc/kubernetes/
# Where kubeadm and kind write it, and where the agent's DaemonSet reads it
# (deploy/base/daemonset.yaml, --kubelet-config).
cat >/var/lib/kubelet/config.yaml <<KCFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# kind's choices: the systemd driver (kubelet 1.37 takes the driver from
# the CRI runtime; containerd's SystemdCgroup is true under --systemd).
cgroupDriver: $driver
cgroupsPerQOS: true
cgroupRoot: /
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
cpuManagerPolicy: none
memoryManagerPolicy: None
# MemoryQoS is on by default in 1.37 but sets no memory.high without a
# factor (its default became nil): 0.8, not KEP-2570's 0.9, so that the
# agent is seen to take the node's value (TestPodLevelDrift, TestWriteBack,
# TestReclaim).
memoryThrottlingFactor: 0.8
# The guest's root is tmpfs: no filesystem stats for local storage.
localStorageCapacityIsolation: false
readOnlyPort: 0
staticPodPath: /etc/kubernetes/manifests
syncFrequency: 1m
nodeStatusUpdateFrequency: 10s
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: /etc/kubernetes/ca.crt}
# Only holders of a certificate from the test's CA (the API server) reach it.
authorization: {mode: AlwaysAllow}
KCFG
cat >/etc/systemd/system/kubelet.service <<UNIT
[Unit]
Description=kubelet
# The harness boots vmharness.target only: no sysinit.target to order after.
DefaultDependencies=no
[Service]
ExecStart=/payload/bin/kubelet --config=/var/lib/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf --hostname-override=$NODE --node-ip=10.0.2.15 --v=${KUBELET_V:-2}
StandardOutput=append:/var/log/node/kubelet.log
StandardError=inherit
Restart=always
RestartSec=2
UNIT
systemctl daemon-reload
systemctl start kubelet || { say "ERROR: systemctl start kubelet failed"; exit 1; }
say "kubelet started ($(cut -d' ' -f1 /proc/uptime) s since the kernel started)"

# Where the node's one vCPU goes (the node suite's budget is that vCPU):
# CPU seconds by cgroup, every minute and at the end, in
# /var/log/node/cpu.txt. A cgroup's usage includes its removed children's,
# so kubepods.slice holds every test pod's; the busiest live leaves show
# who inside it.
cpu_report() {
	{
		echo "== $(cut -d' ' -f1 /proc/uptime) s since boot; /proc/stat: $(head -1 /proc/stat)"
		find /sys/fs/cgroup -maxdepth 5 -name cpu.stat | while read -r f; do
			u=$(sed -n 's/^usage_usec //p' "$f" 2>/dev/null) # a pod's may be gone by now
			[ "${u:-0}" -ge 1000000 ] && echo "$((u / 1000000)) s ${f%/cpu.stat}"
		done | sort -rn | head -25
	} >>/var/log/node/cpu.txt 2>&1
}
(while sleep 60; do cpu_report; done) &
reporter=$!

deadline=$(($(cut -d. -f1 /proc/uptime) + ${NODE_GUEST_TIMEOUT:-2200}))
rc=0
while :; do
	nc -l -p 7000 >/tmp/ctl 2>/dev/null
	grep -q stop /tmp/ctl && break
	if [ "$(cut -d. -f1 /proc/uptime)" -ge "$deadline" ]; then
		say "ERROR: no stop from the host before the deadline"
		rc=1
		break
	fi
done
say "stopping"
kill $reporter 2>/dev/null
cpu_report
systemctl stop kubelet
cp /var/log/containerd.log /var/log/node/ 2>/dev/null
systemctl status kubelet --no-pager >/var/log/node/kubelet.status 2>&1
exit $rc
