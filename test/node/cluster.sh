#!/usr/bin/env bash
# The node test's cluster, run by test/node/run.sh inside a private network
# namespace (unshare --net): etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler on the host, a VM (test/vm/vm.sh run --systemd
# --containerd) that is the node, then the e2e tests of test/node against
# the kubeconfig. Exits non-zero if any of it fails, the node included.
#
# Addresses. The namespace's lo holds 127.0.0.1, 10.0.2.100 (the API
# server's advertised address) and 10.0.2.15 (the guest's address, so that
# the API server's connections to the kubelet, to the node's InternalIP,
# land on QEMU's hostfwd). In the guest, QEMU's restricted user network
# answers only:
#   10.0.2.100:6443  the API server (the kubelet's kubeconfig)
#   10.0.2.97:443    the API server as the `kubernetes` Service's ClusterIP
#                    (the first address of --service-cluster-ip-range), so
#                    that pods reach it with no kube-proxy
# and the host reaches the guest's 10250 (kubelet: exec, logs,
# port-forward) and 7000 (this script's control port: "stop").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
: "${RESIZE_AGENT_K8S_BIN:?}" "${NODE_IMAGE_ARCHIVE:?}"
BIN=$RESIZE_AGENT_K8S_BIN
NODE=${NODE_NAME:-vm-node}
NODE_CPUS=${NODE_CPUS:-1}
NODE_MEM=${NODE_MEM:-3G}
READY_TIMEOUT=${NODE_READY_TIMEOUT:-300}
work=$(mktemp -d "${TMPDIR:-/tmp}/resize-node.XXXXXX")
logs=${NODE_LOGS:-$root/bin/node-logs}
rm -rf "$logs" && mkdir -p "$logs"
pids=()

say() { printf '[node] %s\n' "$*" >&2; }
t0=${EPOCHREALTIME/,/.}
since() { awk -v a="$t0" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }'; }
cleanup() {
	local rc=$?
	set +e
	if [[ -n ${vmpid:-} ]] && kill -0 "$vmpid" 2>/dev/null; then
		stop_guest
		for _ in $(seq 1 60); do kill -0 "$vmpid" 2>/dev/null || break; sleep 1; done
		# vm.sh waits for QEMU before it acts on a signal: end QEMU first.
		kill_tree "$vmpid"
		wait "$vmpid" 2>/dev/null
	fi
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	# kube-apiserver's graceful shutdown can take a minute: 10 s, then KILL.
	for _ in $(seq 1 20); do
		local alive=0
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		((alive)) || break
		sleep 0.5
	done
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	cp "$work"/*.log "$logs/" 2>/dev/null
	((rc == 0)) || say "FAILED (exit $rc); logs in $logs"
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# kill_tree PID: PID and its descendants, children first.
kill_tree() {
	local c
	for c in $(ps -o pid= --ppid "$1"); do kill_tree "$c"; done
	kill "$1" 2>/dev/null
}

# descendants PID: the PIDs below PID (vm.sh's QEMU).
descendants() {
	local c
	for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done
}

stop_guest() {
	# One connection to the guest's control port; it powers off on "stop".
	{ exec 3<>/dev/tcp/10.0.2.15/7000 && echo stop >&3 && exec 3>&-; } 2>/dev/null || true
}

ip link set lo up
ip addr add 10.0.2.100/32 dev lo
ip addr add 10.0.2.15/32 dev lo
# Connections to 10.0.2.15 leave from 127.0.0.1, not from 10.0.2.15 itself:
# slirp gives a hostfwd connection from a loopback peer the source 10.0.2.2
# in the guest, but one from 10.0.2.15 arrives with the guest's own address
# as its source and the guest drops it.
ip route replace local 10.0.2.15 dev lo proto kernel scope host src 127.0.0.1 table local

# ---- certificates (openssl) ----
cd "$work"
ssl() { openssl "$@" >/dev/null 2>&1 || { say "openssl $*: failed"; openssl "$@"; exit 1; }; }
ssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=resize-node-ca -keyout ca.key -out ca.crt
# cert NAME SUBJECT [SANS]: a key and a certificate signed by the CA.
cert() {
	ssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr"
	if [[ -n ${3:-} ]]; then printf 'subjectAltName=%s\n' "$3" >"$1.ext"; else : >"$1.ext"; fi
	ssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt"
}
cert apiserver /CN=kube-apiserver \
	"IP:127.0.0.1,IP:10.0.2.100,IP:10.0.2.97,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=resize-node-admin"
cert kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert node "/O=system:nodes/CN=system:node:$NODE"
ssl genrsa -out sa.key 2048
ssl rsa -in sa.key -pubout -out sa.pub

kubeconfig() { # out server user
	cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $3
  user:
    client-certificate-data: $(base64 -w0 "$3.crt")
    client-key-data: $(base64 -w0 "$3.key")
contexts:
- name: node
  context: {cluster: node, user: $3}
current-context: node
KC
}
kubeconfig admin.conf https://127.0.0.1:6443 admin
kubeconfig kubelet.conf https://10.0.2.100:6443 node
export KUBECONFIG=$work/admin.conf
k() { "$BIN/kubectl" "$@"; }

# ---- control plane ----
"$BIN/etcd" --name=node --data-dir="$work/etcd" --listen-client-urls=http://127.0.0.1:2379 \
	--advertise-client-urls=http://127.0.0.1:2379 --listen-peer-urls=http://127.0.0.1:2380 \
	--initial-advertise-peer-urls=http://127.0.0.1:2380 --initial-cluster=node=http://127.0.0.1:2380 \
	--unsafe-no-fsync --log-level=warn >etcd.log 2>&1 &
pids+=($!)
# test/k8s's flags, plus: Node authorization and NodeRestriction (the
# kubelet's identity), privileged pods (the agent), the kubelet's client
# certificate and its InternalIP (exec, logs, port-forward; the node's
# hostname resolves nowhere here), and the Service range whose first
# address the guest reaches.
"$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
	--bind-address=0.0.0.0 --secure-port=6443 --advertise-address=10.0.2.100 \
	--tls-cert-file=apiserver.crt --tls-private-key-file=apiserver.key --client-ca-file=ca.crt \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
	--kubelet-client-certificate=kubelet-client.crt --kubelet-client-key=kubelet-client.key \
	--kubelet-preferred-address-types=InternalIP \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file=sa.pub --service-account-signing-key-file=sa.key \
	--service-cluster-ip-range=10.0.2.96/28 --cert-dir="$work/apiserver-certs" --profiling=false --v=1 \
	>kube-apiserver.log 2>&1 &
pids+=($!)
for i in $(seq 1 240); do
	k get --raw /readyz >/dev/null 2>&1 && break
	kill -0 "${pids[1]}" 2>/dev/null || { tail -30 kube-apiserver.log >&2; exit 1; }
	((i < 240)) || { say "kube-apiserver not ready after 120 s"; exit 1; }
	sleep 0.5
done
say "kube-apiserver ready ($(since) s)"
# The DaemonSet, ServiceAccount and token controllers, and the
# kube-root-ca.crt publisher (projected service account volumes).
"$BIN/kube-controller-manager" --kubeconfig=admin.conf --authentication-kubeconfig=admin.conf \
	--authorization-kubeconfig=admin.conf --root-ca-file=ca.crt --service-account-private-key-file=sa.key \
	--use-service-account-credentials=false --leader-elect=false --bind-address=127.0.0.1 \
	--controllers='*' --v=1 >kube-controller-manager.log 2>&1 &
pids+=($!)
"$BIN/kube-scheduler" --kubeconfig=admin.conf --authentication-kubeconfig=admin.conf \
	--authorization-kubeconfig=admin.conf --leader-elect=false --bind-address=127.0.0.1 --v=1 \
	>kube-scheduler.log 2>&1 &
pids+=($!)

# ---- the node ----
payload=$work/payload
mkdir -p "$payload/bin" "$payload/cni" "$payload/kubernetes"
cp "$BIN/kubelet" "$payload/bin/"
cp "$BIN"/cni/bridge "$BIN"/cni/host-local "$BIN"/cni/loopback "$payload/cni/"
cp ca.crt kubelet.conf "$payload/kubernetes/"
cp "$NODE_IMAGE_ARCHIVE" "$payload/resize-agent-image.tar"
cp "$here/guest.sh" "$payload/guest.sh"
say "booting the node VM ($NODE_CPUS vCPU, $NODE_MEM)"
"$root/test/vm/vm.sh" run --systemd --containerd --mem "$NODE_MEM" --cpus "$NODE_CPUS" \
	--timeout "${NODE_VM_TIMEOUT:-2400}" --payload "$payload" --env "NODE_NAME=$NODE" \
	--env "NODE_CGROUP_DRIVER=${NODE_CGROUP_DRIVER:-systemd}" \
	--guestfwd 10.0.2.100:6443=6443 --guestfwd 10.0.2.97:443=6443 \
	--hostfwd 10.0.2.15:10250=10250 --hostfwd 10.0.2.15:7000=7000 \
	--collect "/var/log/node:$logs/guest" --console-log "$work/console.log" \
	-- sh /payload/guest.sh >"$work/vm.log" 2>&1 &
vmpid=$!
tvm=${EPOCHREALTIME/,/.}
for i in $(seq 1 $((READY_TIMEOUT * 2))); do
	if [[ $(k get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; then
		break
	fi
	if ! kill -0 "$vmpid" 2>/dev/null; then
		say "the VM ended before the node was Ready"
		tail -40 "$work/vm.log" >&2
		exit 1
	fi
	((i < READY_TIMEOUT * 2)) || { say "node $NODE not Ready after $READY_TIMEOUT s"; tail -40 "$work/console.log" >&2; exit 1; }
	sleep 0.5
done
ready=$(awk -v a="$tvm" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }')
booted=$(sed -n 's/.*guest init started: boot took \([0-9.]*\)s.*/\1/p' "$work/vm.log" | head -1)
say "node $NODE Ready $ready s after the VM started (kernel to init ${booted:-?} s)"
echo "node_ready_seconds $ready" >"$logs/timings.txt"

# ---- the e2e tests ----
cd "$root/test/node" # where go test runs them
status=0
RESIZE_AGENT_NODE_KUBECONFIG=$KUBECONFIG RESIZE_AGENT_REQUIRE_NODE=1 KUBECTL=$BIN/kubectl \
	RESIZE_AGENT_NODE_TIMINGS=$logs/timings.txt \
	nice "${NODE_TEST_BIN:?}" -test.count=1 -test.timeout "${NODE_TEST_TIMEOUT:-30m}" -test.v "$@" || status=$?
k get pods -A -o wide >"$logs/pods.txt" 2>&1 || true
# The host's side of the budget: CPU seconds of the control plane and of
# the node's QEMU (its vCPU thread is most of it).
{
	echo "CPU seconds of the cluster's processes, $(since) s after it began:"
	list=$(echo "${pids[@]}" $(descendants "$vmpid") | tr ' ' ,)
	ps -o times=,comm= -p "$list" | sort -rn
} >"$logs/cpu-host.txt" 2>&1 || true
say "tests done (exit $status) at $(since) s"
exit "$status"
