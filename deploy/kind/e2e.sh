#!/usr/bin/env bash
# End-to-end on kind: build the agent's image, load it into a kind cluster,
# install the agent with kustomize (deploy/overlays/kind), start a pod,
# resize it through the agent's annotation and wait until the container's
# cgroup holds the new limit and the resize conditions say it is done; then
# ask for a resize that can never fit and wait for PodResizePending /
# Infeasible; then run the node e2e suite of test/node (what make test-node
# runs on the VM node) against the same cluster.
#
# Needs docker, kind and kubectl on PATH and a cgroup v2 host (kind nodes
# share the host's cgroup tree). Run from anywhere:
#   deploy/kind/e2e.sh
# Environment:
#   CLUSTER=resize-agent   the kind cluster (created if missing)
#   KEEP=1                 keep the test namespace (the cluster is always
#                          kept; delete it with: kind delete cluster --name "$CLUSTER")
#   TIMEOUT=120            seconds to wait for each step
#   IMAGE_BUILD=archive    make image + kind load image-archive (default), or
#                          docker: docker build -f deploy/Dockerfile + kind load docker-image
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
CLUSTER=${CLUSTER:-resize-agent}
IMAGE=resize-agent:dev
NS=resize-agent-e2e
POD=e2e-burner
TIMEOUT=${TIMEOUT:-120}
ANN=resize.resizer.io/resources

say() { printf '\n==> %s\n' "$*"; }
die() {
	printf '\ne2e: FAILED: %s\n' "$*" >&2
	if command -v kubectl >/dev/null; then
		echo "--- agent logs (last 40 lines) ---" >&2
		kubectl --context "kind-$CLUSTER" -n resize-agent logs ds/resize-agent --tail=40 >&2 || true
		echo "--- pod $NS/$POD ---" >&2
		kubectl --context "kind-$CLUSTER" -n "$NS" describe pod "$POD" >&2 || true
	fi
	exit 1
}
need() { command -v "$1" >/dev/null || die "$1 is not installed or not on PATH ($2)"; }
need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable (is it running, may this user use it?)"
if [[ $(docker info --format '{{.CgroupVersion}}' 2>/dev/null) != 2 ]]; then
	die "the Docker host is not on cgroup v2; the agent resizes cgroup v2 only"
fi
k() { kubectl --context "kind-$CLUSTER" "$@"; }

# wait_for DESCRIPTION COMMAND...: retry until COMMAND succeeds or TIMEOUT.
wait_for() {
	local what=$1 start=$SECONDS
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS - start < TIMEOUT)) || die "timed out after ${TIMEOUT}s waiting for $what"
		sleep 2
	done
	echo "ok: $what ($((SECONDS - start)) s)"
}

say "kind cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
	echo "using the existing cluster"
else
	kind create cluster --name "$CLUSTER" --config "$here/cluster.yaml" --wait 120s
fi

say "building $IMAGE"
if [[ ${IMAGE_BUILD:-archive} == docker ]]; then
	docker build -f "$root/deploy/Dockerfile" -t "$IMAGE" "$root"
	kind load docker-image "$IMAGE" --name "$CLUSTER"
else
	# The image without Docker (make image): an OCI archive for amd64 and arm64.
	make -C "$root" image IMAGE="docker.io/library/$IMAGE" IMAGE_ARCHIVE="$root/bin/resize-agent-image.tar"
	kind load image-archive "$root/bin/resize-agent-image.tar" --name "$CLUSTER"
fi

say "installing the agent (deploy/overlays/kind)"
k apply -k "$root/deploy/overlays/kind"
k -n resize-agent rollout restart ds/resize-agent >/dev/null # pick up a rebuilt image
k -n resize-agent rollout status ds/resize-agent --timeout "${TIMEOUT}s" || die "the agent's DaemonSet did not become ready"

say "a pod to resize"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f -
k -n "$NS" delete pod "$POD" --ignore-not-found --wait=true
k -n "$NS" apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $POD
spec:
  nodeSelector:
    resize-agent.resizer.io/e2e: "true"
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: busybox:1.36
      command: ["sh", "-c", "while :; do :; done"]
      resources:
        requests: {cpu: 100m, memory: 32Mi}
        limits: {cpu: 500m, memory: 64Mi}
EOF
k -n "$NS" wait pod "$POD" --for=condition=Ready --timeout "${TIMEOUT}s" || die "the test pod did not start"
# The container's own cgroup is the root of its cgroup namespace.
cgfile() { k -n "$NS" exec "$POD" -c app -- cat "/sys/fs/cgroup/$1"; }
echo "before: cpu.max=$(cgfile cpu.max) cpu.weight=$(cgfile cpu.weight) memory.max=$(cgfile memory.max)"

say "resize through the annotation: cpu limit 500m -> 250m, request 100m -> 200m"
k -n "$NS" annotate pod "$POD" --overwrite "$ANN={\"app\": {\"requests\": {\"cpu\": \"200m\"}, \"limits\": {\"cpu\": \"250m\"}}}"
cpu_is() { [[ $(cgfile cpu.max) == "$1" ]]; }
wait_for "cpu.max = 25000 100000 in the container's cgroup" cpu_is "25000 100000"
no_resize_conditions() {
	[[ -z $(k -n "$NS" get pod "$POD" -o jsonpath='{.status.conditions[?(@.type=="PodResizePending")].type}{.status.conditions[?(@.type=="PodResizeInProgress")].type}') ]]
}
wait_for "no PodResizePending / PodResizeInProgress condition (resize done)" no_resize_conditions
# The kubelet actuates the agent's pods/resize patch; the agent reads the
# cgroup files back and says so with its own Event reason.
completed_event() {
	k -n "$NS" get events --field-selector "involvedObject.name=$POD,reason=ResizeVerified" -o name | grep -q .
}
wait_for "a ResizeVerified event on the pod (the agent read the kubelet's resize back)" completed_event
echo "after: cpu.max=$(cgfile cpu.max) cpu.weight=$(cgfile cpu.weight)"

say "a resize that can never fit: a 4096-CPU request"
k -n "$NS" annotate pod "$POD" --overwrite "$ANN={\"app\": {\"requests\": {\"cpu\": \"4096\"}, \"limits\": {\"cpu\": \"4096\"}}}"
# The kubelet says Infeasible; from 1.36 the API server's
# PodResizeValidator refuses the agent's patch before (ResizeRefused).
infeasible() {
	[[ $(k -n "$NS" get pod "$POD" -o jsonpath='{.status.conditions[?(@.type=="PodResizePending")].reason}') == Infeasible ]] ||
		k -n "$NS" get events --field-selector "involvedObject.name=$POD,reason=ResizeRefused" -o name | grep -q .
}
wait_for "PodResizePending=True reason Infeasible, or the patch refused" infeasible
echo "message: $(k -n "$NS" get pod "$POD" -o jsonpath='{.status.conditions[?(@.type=="PodResizePending")].message}')"
cpu_is "25000 100000" || die "an infeasible resize changed cpu.max to $(cgfile cpu.max)"
k -n "$NS" get events --field-selector "involvedObject.name=$POD" \
	-o custom-columns=TYPE:.type,REASON:.reason,FROM:.source.component,MESSAGE:.message

say "the node e2e suite (test/node), as make test-node runs it on the VM node"
need go "https://go.dev/doc/install"
e2e_node=$(k get nodes -l resize-agent.resizer.io/e2e=true -o jsonpath='{.items[0].metadata.name}')
kubeconfig=$(mktemp)
kind get kubeconfig --name "$CLUSTER" >"$kubeconfig"
(cd "$root" && RESIZE_AGENT_NODE_KUBECONFIG=$kubeconfig RESIZE_AGENT_REQUIRE_NODE=1 KUBECTL=$(command -v kubectl) \
	RESIZE_AGENT_NODE_NAME=$e2e_node RESIZE_AGENT_NODE_OVERLAY=$root/deploy/overlays/kind \
	RESIZE_AGENT_NODE_BUSYBOX=busybox:1.36 go test -count=1 -timeout 20m -v ./test/node/) ||
	{ rm -f "$kubeconfig"; die "the node e2e suite failed"; }
rm -f "$kubeconfig"

if [[ ${KEEP:-} != 1 ]]; then
	k delete namespace "$NS" --wait=false >/dev/null
fi
printf '\ne2e: PASSED (cluster %s kept; kind delete cluster --name %s)\n' "$CLUSTER" "$CLUSTER"
