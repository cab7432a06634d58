#!/bin/sh
# Runs inside the VM: every test binary in /payload/tests, verbosely, with a
# summary line at the end. The exit status is the number of failed binaries.
# Each binary gets -test.timeout=10m unless the environment (vm.sh --env)
# says otherwise: VM_TEST_TIMEOUT_<name> for one binary (name without
# ".test", e.g. VM_TEST_TIMEOUT_test_e2eresize=45m), VM_TEST_TIMEOUT for all.
cd /payload/tests || exit 1
failed=0
passed_tests=0
failed_tests=0
for t in *.test; do
	n=${t%.test}
	case $n in *[!A-Za-z0-9_]*) to="" ;; *) eval "to=\${VM_TEST_TIMEOUT_$n:-}" ;; esac
	to=${to:-${VM_TEST_TIMEOUT:-10m}}
	echo "=== VM: $t (timeout $to)"
	./"$t" -test.v -test.count=1 -test.timeout="$to" >"/tmp/$t.out" 2>&1
	rc=$?
	cat "/tmp/$t.out"
	p=$(grep -c -- '^--- PASS' "/tmp/$t.out")
	f=$(grep -c -- '^--- FAIL' "/tmp/$t.out")
	s=$(grep -c -- '^--- SKIP' "/tmp/$t.out")
	passed_tests=$((passed_tests + p))
	failed_tests=$((failed_tests + f))
	echo "=== VM: $t exit $rc ($p passed, $f failed, $s skipped)"
	[ "$rc" = 0 ] || failed=$((failed + 1))
done
echo "vm-tests: $passed_tests passed, $failed_tests failed"
exit $failed
