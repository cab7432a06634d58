// Package crash proves that nothing is lost across a crash of the agent:
// its test runs the real resize-agent daemon on a real cgroup v2 kernel,
// submits intents concurrently through the API, kills the daemon with
// SIGKILL at random moments (often with applies in flight), restarts it on
// the same state directory, and checks that every intent the API
// acknowledged is still there and ends in a terminal state, and that every
// cgroup holds what its last Completed intent gave it. The state directory
// is a small file system of its own (ext4 on a loop device) that one cycle
// in four fills up (in the middle of a batch) and one in six shuts down at
// a random moment (EXT4_IOC_SHUTDOWN: what was written reaches the device,
// then every access fails with EIO), and for half of those over the
// restart too, when the daemon must refuse to start on the failing disk
// and start once it is back: no intent refused with 503 may come back
// after a restart.
//
// It runs in the VM harness (VM_TEST_PKGS="./test/crash"
// test/run-vm-tests.sh), which puts the daemon in PATH and sets
// RESIZE_AGENT_REQUIRE_CGROUP2=1; elsewhere it skips and says why. The
// daemon binary is $RESIZE_AGENT_BIN, or resize-agent in PATH.
package crash
