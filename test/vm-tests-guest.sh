#!/bin/sh
# Runs inside the VM: every test binary in /payload/tests, verbosely, with a
# summary line at the end. The exit status is the number of failed binaries.
cd /payload/tests || exit 1
failed=0
passed_tests=0
failed_tests=0
for t in *.test; do
	echo "=== VM: $t"
	./"$t" -test.v -test.count=1 -test.timeout=10m >"/tmp/$t.out" 2>&1
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
