#!/usr/bin/env bash
# make test: every test, in an order that keeps a run short on two cores.
# The real Kubernetes node is the longest part (about 18 minutes of one TCG
# vCPU), so it starts first, in the background: the Kubernetes builds
# (test/prebuild.sh, at low priority; a minute when warm), then make
# test-node. In the foreground meanwhile: the host tests, the VM suite (one
# vCPU, beside the node's) and the real API server tests. The node's
# output is printed whole when it ends (bin/node.log), with a heartbeat
# meanwhile. The fuzzers run beside the VM suite, at nice 19. Warm on
# 2026-12-07 all of it took 1,130-1,328 s (19-22 min) in five runs; in
# one, host tests done at 221 s, VM suite at 1,122 s, API server and
# fuzzers at 1,176 s, node at 1,196 s.
# Cold on 2026-12-07 (before the node's tests were cut down), 3,283 s (55
# min): host tests 1,703 s (their compiles beside the node's builds), VM
# suite 2,646 s, API server 3,048 s, node 3,248 s. TEST_NODE=0 leaves the node out (a quicker
# run while working on something else; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
mark() { echo "test: $* at $((SECONDS - start)) s" >&2; }

mkdir -p bin
rm -f bin/node.log bin/prebuild.log bin/host-suite.log bin/vm-suite.log bin/k8s-suite.log bin/fuzz.log bin/fuzz.rc
# Its own process group, so that an interrupted run stops its builds and
# its VM too. The node's tests get a longer bound than alone, as they share
# the host.
setsid bash -c '
	test/prebuild.sh >bin/prebuild.log 2>&1 || {
		# Not fatal: make test-node builds what it needs and says why not.
		echo "test: the background prebuild failed; its log:"
		tail -n 30 bin/prebuild.log
	}
	[[ ${TEST_NODE:-1} == 0 ]] && exit 0
	echo "test: node suite starts at $(date -u +%T)"
	NODE_TEST_TIMEOUT=${NODE_TEST_TIMEOUT:-45m} make test-node
' >bin/node.log 2>&1 &
bg=$!
trap 'kill -- -"$bg" 2>/dev/null || true' EXIT

rc=0
# At a lower priority than the node's VM beside them: the node is the
# longest part.
nice -n 5 make test-unit test-monitoring 2>&1 | tee bin/host-suite.log || rc=$?
mark "host tests done (exit $rc)"
# The fuzzers beside the VM suite, at the lowest priority: they have no
# time bounds to miss, and take what the two VMs leave idle (about 180
# core-seconds, 90 s of the host's two cores, which the VM suite waited
# for when they ran before it).
setsid bash -c 'nice -n 19 make fuzz >bin/fuzz.log 2>&1; echo $? >bin/fuzz.rc' &
fuzzer=$!
trap 'kill -- -"$bg" -"$fuzzer" 2>/dev/null || true' EXIT
v=0
make test-vm 2>&1 | tee bin/vm-suite.log || v=$?
mark "VM suite done (exit $v)"
k=0
make test-k8s 2>&1 | tee bin/k8s-suite.log || k=$?
mark "API server tests done (exit $k)"
((v == 0 && k == 0)) || rc=1
wait "$fuzzer" || true
cat bin/fuzz.log
f=$(cat bin/fuzz.rc 2>/dev/null || echo 1)
mark "fuzzers done (exit $f)"
((f == 0)) || rc=1

# The node (or the builds) may still be running: wait, with a heartbeat,
# since CI shows nothing else meanwhile.
while kill -0 "$bg" 2>/dev/null; do
	sleep 10
	if (((SECONDS - start) % 120 < 10)); then
		echo "test: waiting for the node suite ($((SECONDS - start)) s): $(grep -c '^--- \(PASS\|FAIL\)' bin/node.log || true) tests done" >&2
	fi
done
nrc=0
wait "$bg" || nrc=$?
trap - EXIT
cat bin/node.log
if [[ ${TEST_NODE:-1} == 0 ]]; then
	echo "test: the real node (make test-node) not run: TEST_NODE=0" >&2
else
	mark "node tests done (exit $nrc)"
fi
# The last lines CI shows: which tests failed, wherever they ran.
if ((rc != 0 || nrc != 0)); then
	echo "test: failed (host/VM/API server exit $rc, node exit $nrc); failing tests:" >&2
	grep -h -- '--- FAIL' bin/host-suite.log bin/fuzz.log bin/vm-suite.log bin/vm-*.log bin/k8s-suite.log bin/node.log 2>/dev/null | sort -u >&2 || true
	exit 1
fi
