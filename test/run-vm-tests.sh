#!/usr/bin/env bash
# Builds the test binaries that need a real cgroup v2 kernel, boots the VM
# harness with them and runs them there. Exits non-zero if a VM does not
# boot or any test fails; in the VM, a test that would skip for want of
# cgroup v2 fails instead (RESIZE_AGENT_REQUIRE_CGROUP2=1).
#
# By default every package runs in one VM with one vCPU, then test/systemd
# in a VM with systemd as PID 1 (about 13 minutes warm beside the node's VM).
#   VM_PARALLEL=1                   two VMs at once, one vCPU each (the host
#                                   has two cores and TCG runs a vCPU on one
#                                   host thread). Not the
#                                   default yet: in its first two runs, on a
#                                   host also running builds, four tests
#                                   overran bounds set for one VM (their
#                                   bounds are loosened since; the mode has
#                                   not yet had a clean run). Each VM's
#                                   output is printed whole when it ends.
#   VM_TEST_PKGS="./cgroup ./bpf"   those packages, in one VM
#   VM_SYSTEMD_PKGS=none            no systemd VM
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS=${GOFLAGS:--buildvcs=false}

# Times from a warm run under TCG on this machine's two cores, one VM each
# (before the crash test's containers slept: it takes 252 s alone since):
# crash 523 s, soak 64, bpf 26, pressure 21, cgroup 13 (group a: 647 s);
# integration 466 s, resize-agent 139, faults 68 (group b: 673 s).
group_a="./test/crash ./test/soak ./bpf ./agent/pressure ./cgroup"
group_b="./test/integration ./cmd/resize-agent ./test/faults"

# payload DIR PKG...: static test binaries (the guest has no libc) and the
# commands, in DIR.
payload() {
	local dir=$1 p name
	shift
	rm -rf "$dir"
	mkdir -p "$dir/bin" "$dir/tests"
	for p in "$@"; do
		[[ -d $p ]] || continue
		name=$(echo "${p#./}" | tr / _)
		CGO_ENABLED=0 go test -c -trimpath -o "$dir/tests/$name.test" "$p"
	done
	CGO_ENABLED=0 go build -trimpath -o "$dir/bin/" ./cmd/...
	cp test/vm-tests-guest.sh "$dir/run-tests.sh"
}

# The timeout bounds a hung guest (the whole list takes about 22 minutes
# in one VM under TCG, more on a loaded host).
# One vCPU: under TCG with two, the guest kernel can lock up while it patches
# the sched_switch tracepoint site for BPF attach/detach (one vCPU spinning
# at the site with interrupts off, the other waiting in text_poke); seen in
# about 1 of 9 runs with 2 vCPUs and never in 300 cycles with 1.
vm() {
	local dir=$1
	# The crash test runs about 4 minutes in a quiet guest (100 kills; 7.5-9
	# minutes while its containers were busy loops) and the integration
	# tests 8: close to the guest script's default 10-minute bound per
	# binary on a busy host.
	test/vm/vm.sh run --payload "$dir" --containerd --mem 2G --cpus 1 --timeout 2400 \
		--env RESIZE_AGENT_REQUIRE_CGROUP2=1 --env RESIZE_AGENT_REQUIRE_BPF=1 \
		--env VM_TEST_TIMEOUT_test_crash=20m --env VM_TEST_TIMEOUT_test_integration=20m -- sh /payload/run-tests.sh
}

# systemd as PID 1 and containerd with the systemd cgroup driver.
vm_systemd() {
	local dir=$1
	test/vm/vm.sh run --systemd --payload "$dir" --containerd --mem 2G --cpus 1 --timeout 1500 \
		--env RESIZE_AGENT_REQUIRE_CGROUP2=1 --env RESIZE_AGENT_REQUIRE_SYSTEMD=1 -- sh /payload/run-tests.sh
}

sdpkgs=${VM_SYSTEMD_PKGS:-$([[ -z ${VM_TEST_PKGS:-} ]] && echo ./test/systemd || echo none)}
if [[ -z ${VM_TEST_PKGS:-} && ${VM_PARALLEL:-0} != 1 ]]; then
	VM_TEST_PKGS="./cgroup ./agent/pressure ./bpf ./test/integration ./cmd/resize-agent ./test/faults ./test/soak ./test/crash"
fi
test/vm/vm.sh prepare
rc=0

if [[ -n ${VM_TEST_PKGS:-} ]]; then
	# One VM, as asked; then the systemd VM if asked.
	if [[ $VM_TEST_PKGS != none ]]; then
		read -r -a pkgs <<<"$VM_TEST_PKGS"
		payload bin/vm-payload "${pkgs[@]}"
		vm bin/vm-payload || rc=$?
	fi
	if [[ $sdpkgs != none ]]; then
		read -r -a pkgs <<<"$sdpkgs"
		payload bin/vm-payload-systemd "${pkgs[@]}"
		vm_systemd bin/vm-payload-systemd || rc=$?
	fi
	exit $rc
fi

read -r -a a <<<"$group_a"
read -r -a b <<<"$group_b"
payload bin/vm-payload-a "${a[@]}"
payload bin/vm-payload-b "${b[@]}"
if [[ $sdpkgs != none ]]; then
	read -r -a s <<<"$sdpkgs"
	payload bin/vm-payload-systemd "${s[@]}"
fi

rm -f bin/vm-a.log bin/vm-b.log bin/vm-systemd.log
start=$SECONDS
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
(vm bin/vm-payload-a >bin/vm-a.log 2>&1) &
pids+=($!)
{
	st=0
	vm bin/vm-payload-b >bin/vm-b.log 2>&1 || st=$?
	# The second group ends a little after the first: the systemd VM
	# follows it rather than running as a third VM on two cores.
	if [[ $sdpkgs != none ]]; then
		vm_systemd bin/vm-payload-systemd >bin/vm-systemd.log 2>&1 || st=$?
	fi
	exit $st
} &
pids+=($!)

# Print each VM's output when it ends (a heartbeat meanwhile: CI shows
# nothing else for 13 minutes).
declare -A done=()
while ((${#done[@]} < 2)); do
	for i in 0 1; do
		[[ -n ${done[$i]:-} ]] && continue
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then
			st=0
			wait "${pids[$i]}" || st=$?
			done[$i]=$st
			if ((i == 0)); then
				cat bin/vm-a.log
				echo "vm: group a ($group_a) exit $st after $((SECONDS - start)) s"
			else
				cat bin/vm-b.log
				[[ -f bin/vm-systemd.log ]] && cat bin/vm-systemd.log
				echo "vm: group b ($group_b) and systemd ($sdpkgs) exit $st after $((SECONDS - start)) s"
			fi
			((st == 0)) || rc=1
		fi
	done
	((${#done[@]} < 2)) || break
	sleep 5
	if (((SECONDS - start) % 120 < 5)); then
		echo "vm: $((SECONDS - start)) s, $(grep -h '^=== VM: .* exit' bin/vm-a.log bin/vm-b.log bin/vm-systemd.log 2>/dev/null | wc -l) test binaries done" >&2
	fi
done
trap - EXIT
exit $rc
