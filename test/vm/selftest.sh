#!/usr/bin/env bash
# shellcheck disable=SC2015,SC2016 # `check && ok || bad` is intended; guest code is single-quoted
# Self-test of the VM harness (test/vm/vm.sh). Needs root. Runs:
#   1. vm.sh prepare
#   2. a --containerd VM that checks cgroup v2 controllers and limits, the
#      imported images, a ctr container, a CRI host-network pod (crictl, if
#      built) and writes files that are brought back with --collect
#   3. a plain VM whose command fails with status 42 (with a --payload bin/)
#   4. a VM that exceeds --timeout (expects 124 and "timed out")
#   5. a --systemd --containerd VM: systemd is PID 1, the command runs in
#      vmharness.service, a CRI pod in a kubelet-style slice gets a scope
#      whose unit properties crictl update changes, and status 7 comes back
# Ends with a "N passed, N failed" line; exits non-zero if anything failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM=$HERE/vm.sh
now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

pass=0
fail=0
ok() {
	echo "PASS: $*"
	pass=$((pass + 1))
}
bad() {
	echo "FAIL: $*"
	fail=$((fail + 1))
}

T0=$(now)
work=$(mktemp -d "${TMPDIR:-/tmp}/vmselftest.XXXXXX")
trap 'rm -rf "$work"' EXIT

t=$(now)
if "$VM" prepare; then ok "prepare ($(elapsed "$t" "$(now)")s)"; else
	bad "prepare"
	echo "0 passed, 1 failed"
	exit 1
fi

t=$(now)
VM_ACCEL=$("$VM" accel)
export VM_ACCEL
echo "accelerator: $VM_ACCEL (probe $(elapsed "$t" "$(now)")s)"

# ---------------------------------------------------------------- run 1
mkdir -p "$work/p1/bin"
cat >"$work/p1/guest.sh" <<'EOF'
set -u
r=0
check() { # name, then a command
	n=$1
	shift
	if "$@"; then echo "GUEST-PASS: $n"; else echo "GUEST-FAIL: $n"; r=1; fi
}
ctrl=$(cat /sys/fs/cgroup/cgroup.controllers)
echo "controllers: $ctrl"
check "controller cpu" sh -c "echo '$ctrl' | grep -qw cpu"
check "controller memory" sh -c "echo '$ctrl' | grep -qw memory"
check "no cgroup v1 mounts" sh -c '! grep -q " cgroup " /proc/mounts'

g=/sys/fs/cgroup/selftest
mkdir -p $g
check "cpu.max write" sh -c "echo '50000 100000' > $g/cpu.max && [ \"\$(cat $g/cpu.max)\" = '50000 100000' ]"
check "memory.max write" sh -c "echo 100M > $g/memory.max && [ \"\$(cat $g/memory.max)\" = 104857600 ]"
check "process in limited cgroup" sh -c "sh -c 'echo \$\$ > $g/cgroup.procs; grep -q ^0::/selftest\$ /proc/self/cgroup'"

imgs=$(ctr -n k8s.io images ls -q)
echo "images: $imgs"
check "busybox image" sh -c "echo '$imgs' | grep -qx localhost/resize-agent/busybox:latest"
check "pause image" sh -c "echo '$imgs' | grep -qx localhost/resize-agent/pause:latest"

out=$(ctr -n k8s.io run --rm localhost/resize-agent/busybox:latest t1 /bin/busybox echo hello-from-container 2>&1)
echo "$out"
check "ctr run" sh -c "echo '$out' | grep -qx hello-from-container"
check "plain ctr defaults to namespace k8s.io" sh -c "ctr images ls -q | grep -q resize-agent/pause"

if command -v crictl >/dev/null; then
	cat >/tmp/pod.json <<'JSON'
{"metadata":{"name":"p1","namespace":"default","uid":"uid-p1","attempt":0},
 "log_directory":"/tmp/pods/p1",
 "linux":{"cgroup_parent":"/kubepods/burstable/poduid-p1",
          "security_context":{"namespace_options":{"network":2}}}}
JSON
	cat >/tmp/ctr.json <<'JSON'
{"metadata":{"name":"c1"},"image":{"image":"localhost/resize-agent/busybox:latest"},
 "command":["/bin/sleep","1000"],"log_path":"c1.log",
 "linux":{"resources":{"cpu_period":100000,"cpu_quota":50000,"memory_limit_in_bytes":104857600}}}
JSON
	P=$(crictl runp /tmp/pod.json) && C=$(crictl create "$P" /tmp/ctr.json /tmp/pod.json) && crictl start "$C" >/dev/null
	check "CRI host-network pod + container" [ -n "${C:-}" ]
	cg=/sys/fs/cgroup/kubepods/burstable/poduid-p1/${C:-none}
	check "CRI container cgroup path + cpu.max" sh -c "[ \"\$(cat $cg/cpu.max)\" = '50000 100000' ]"
	crictl update --cpu-quota 80000 "${C:-none}" >/dev/null
	check "crictl update -> cpu.max" sh -c "[ \"\$(cat $cg/cpu.max)\" = '80000 100000' ]"
	crictl stopp "${P:-none}" >/dev/null && crictl rmp "${P:-none}" >/dev/null
	check "CRI pod removed" sh -c "[ ! -d $cg ]"
fi

mkdir -p /tmp/out/sub
echo collected-ok >/tmp/out/sub/file.txt
head -c 3000000 /dev/urandom >/tmp/out/random.bin
sha256sum /tmp/out/random.bin | cut -d' ' -f1 >/tmp/out/random.sha256
cat /sys/fs/cgroup/cgroup.controllers >/tmp/out/controllers
[ $r = 0 ] && echo SELFTEST-GUEST-OK
exit $r
EOF
t=$(now)
set +e
"$VM" run --containerd --payload "$work/p1" --collect "/tmp/out:$work/collected" --timeout 300 \
	-- sh guest.sh 2>&1 | tee "$work/run1.log"
rc=${PIPESTATUS[0]}
set -e
echo "run 1 took $(elapsed "$t" "$(now)")s"
[[ $rc == 0 ]] && ok "containerd VM exit status 0" || bad "containerd VM exit status $rc (want 0)"
grep -q '^GUEST-FAIL' "$work/run1.log" && bad "guest checks: $(grep '^GUEST-FAIL' "$work/run1.log" | tr '\n' ' ')"
grep -q '^SELFTEST-GUEST-OK$' "$work/run1.log" && ok "guest checks ($(grep -c '^GUEST-PASS' "$work/run1.log") passed)" || bad "guest checks did not all pass"
grep -qx 'hello-from-container' "$work/run1.log" && ok "hello-from-container printed" || bad "hello-from-container not printed"
grep -q '^VMHARNESS-EXIT=0$' "$work/run1.log" && ok "exit marker on console" || bad "no VMHARNESS-EXIT=0 line"
grep -q 'boot took' "$work/run1.log" && ok "boot time reported: $(grep -o 'boot took [0-9.]*s' "$work/run1.log")" || bad "no boot time reported"
if [[ -f $work/collected/sub/file.txt && $(cat "$work/collected/sub/file.txt") == collected-ok ]] &&
	[[ $(sha256sum <"$work/collected/random.bin" | cut -d' ' -f1) == $(cat "$work/collected/random.sha256" 2>/dev/null) ]]; then
	ok "--collect brought back files (3 MB binary intact)"
else
	bad "--collect: files missing or corrupted"
fi

# ---------------------------------------------------------------- run 2
mkdir -p "$work/p2/bin"
printf '#!/bin/sh\necho "hello from payload bin in $(pwd)"\n' >"$work/p2/bin/hello"
chmod +x "$work/p2/bin/hello"
t=$(now)
set +e
"$VM" run --quiet --payload "$work/p2" --env 'SELFTEST_VAR=a b'"'"'c' --timeout 120 \
	-- sh -c 'hello; echo "var=$SELFTEST_VAR"; echo failing on purpose; exit 42' 2>&1 | tee "$work/run2.log"
rc=${PIPESTATUS[0]}
set -e
echo "run 2 took $(elapsed "$t" "$(now)")s"
[[ $rc == 42 ]] && ok "failing command -> host exit status 42" || bad "failing command -> host exit status $rc (want 42)"
grep -qx 'hello from payload bin in /payload' "$work/run2.log" && ok "payload bin on PATH, cwd /payload" || bad "payload bin/PATH/cwd"
grep -qx "var=a b'c" "$work/run2.log" && ok "--env quoting" || bad "--env quoting"

# ---------------------------------------------------------------- run 3
t=$(now)
set +e
"$VM" run --quiet --timeout 12 -- sleep 600 >"$work/run3.log" 2>&1
rc=$?
set -e
echo "run 3 took $(elapsed "$t" "$(now)")s"
[[ $rc == 124 ]] && grep -q 'timed out after 12 s' "$work/run3.log" && ok "timeout -> 124 + message" || {
	cat "$work/run3.log"
	bad "timeout: status $rc (want 124)"
}

# ---------------------------------------------------------------- run 4
mkdir -p "$work/p4"
cat >"$work/p4/guest.sh" <<'EOF'
r=7
check() {
	n=$1
	shift
	if "$@"; then echo "GUEST-PASS: $n"; else echo "GUEST-FAIL: $n"; r=1; fi
}
check "PID 1 is systemd" sh -c '[ "$(cat /proc/1/comm)" = systemd ]'
check "running in vmharness.service" grep -qx '0::/system.slice/vmharness.service' /proc/self/cgroup
check "systemctl talks to systemd" sh -c 'systemctl is-system-running | grep -Eq "running|degraded|starting"'
cat >/tmp/pod.json <<'JSON'
{"metadata":{"name":"p1","namespace":"default","uid":"uid-p1","attempt":0},
 "linux":{"cgroup_parent":"kubepods-burstable-poduid_p1.slice",
          "security_context":{"namespace_options":{"network":2}}}}
JSON
cat >/tmp/ctr.json <<'JSON'
{"metadata":{"name":"c1"},"image":{"image":"localhost/resize-agent/busybox:latest"},
 "command":["/bin/sleep","1000"],
 "linux":{"resources":{"cpu_period":100000,"cpu_quota":50000,"memory_limit_in_bytes":104857600}}}
JSON
P=$(crictl runp /tmp/pod.json) && C=$(crictl create "$P" /tmp/ctr.json /tmp/pod.json) && crictl start "$C" >/dev/null
check "CRI pod + container (SystemdCgroup)" [ -n "${C:-}" ]
u=cri-containerd-${C:-none}.scope
cg=/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid_p1.slice/$u
check "scope cgroup + cpu.max" sh -c "[ \"\$(cat $cg/cpu.max)\" = '50000 100000' ]"
check "unit property CPUQuotaPerSecUSec" sh -c "[ \"\$(systemctl show -P CPUQuotaPerSecUSec $u)\" = 500ms ]"
crictl update --cpu-quota 80000 "${C:-none}" >/dev/null
systemctl daemon-reload
check "crictl update -> unit + cpu.max, kept by daemon-reload" sh -c "[ \"\$(systemctl show -P CPUQuotaPerSecUSec $u)\" = 800ms ] && [ \"\$(cat $cg/cpu.max)\" = '80000 100000' ]"
exit $r
EOF
t=$(now)
set +e
"$VM" run --systemd --containerd --payload "$work/p4" --timeout 300 -- sh guest.sh 2>&1 | tee "$work/run4.log"
rc=${PIPESTATUS[0]}
set -e
echo "run 4 took $(elapsed "$t" "$(now)")s"
[[ $rc == 7 ]] && ok "systemd VM: exit status 7 from the unit" || bad "systemd VM exit status $rc (want 7)"
grep -q '^GUEST-FAIL' "$work/run4.log" && bad "systemd guest checks: $(grep '^GUEST-FAIL' "$work/run4.log" | tr '\n' ' ')"
grep -q '^GUEST-FAIL' "$work/run4.log" || ok "systemd guest checks ($(grep -c '^GUEST-PASS' "$work/run4.log") passed)"

echo "selftest took $(elapsed "$T0" "$(now)")s (accelerator $VM_ACCEL)"
echo "selftest: $pass passed, $fail failed"
((fail == 0))
