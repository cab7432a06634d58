package bpf

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Environment switches (see the package README):
//
//	RESIZE_AGENT_REQUIRE_BPF=1      tests that need eBPF fail instead of skip
//	RESIZE_AGENT_REQUIRE_CGROUP2=1  tests that need cgroup v2 with the cpu and
//	                                memory controllers fail instead of skip
const (
	envRequireBPF     = "RESIZE_AGENT_REQUIRE_BPF"
	envRequireCgroup2 = "RESIZE_AGENT_REQUIRE_CGROUP2"
	envHelper         = "RESIZE_AGENT_BPF_TEST_HELPER"
)

// TestMain turns the test binary into a helper process when envHelper is
// set: the CPU burners, idle and memory-hog processes the tests start in
// their cgroups.
func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		os.Exit(helperMain(mode))
	}
	flag.Parse()
	var anchors []io.Closer
	if flag.Lookup("test.bench").Value.String() == "" {
		anchors = anchorTracepoints()
	}
	code := m.Run()
	for _, c := range anchors {
		c.Close()
	}
	os.Exit(code)
}

// anchorTracepoints attaches two no-op programs to every tracepoint the
// Tracker uses, for the life of the test binary (not for benchmarks), and
// returns what to close. Without them each Load and Close switches the
// tracepoints' static keys and static calls, i.e. patches kernel text
// (text_poke_bp), and under QEMU TCG (the VM harness) that sometimes
// deadlocks the guest: one vCPU keeps trapping on the int3 at the
// sched_switch site in __schedule, interrupts off, while the patching vCPU
// waits for it to acknowledge an IPI (soft lockup; reproduced with Probe's
// no-op programs alone, so not the Tracker's programs). With two probes
// always attached, attaching and detaching only swaps the tracepoint's
// function array. Errors are ignored: tests that need BPF check by
// themselves.
func anchorTracepoints() []io.Closer {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil
	}
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		return nil
	}
	tps := []string{"sched_switch",
		"mm_vmscan_memcg_reclaim_begin", "mm_vmscan_memcg_reclaim_end",
		"mm_vmscan_direct_reclaim_begin", "mm_vmscan_direct_reclaim_end"}
	if oomHooks[0].usable(kernel) {
		tps = append(tps, oomHooks[0].target)
	}
	var closers []io.Closer
	for _, tp := range tps {
		for i := 0; i < 2; i++ {
			prog, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
				Name:         "test_anchor",
				Type:         ebpf.Tracing,
				AttachType:   ebpf.AttachTraceRawTp,
				AttachTo:     tp,
				License:      "Dual MIT/GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
			}, ebpf.ProgramOptions{KernelTypes: kernel})
			if err != nil {
				return closers
			}
			closers = append(closers, prog)
			l, err := link.AttachTracing(link.TracingOptions{Program: prog})
			if err != nil {
				return closers
			}
			closers = append(closers, l)
		}
	}
	return closers
}

var probe struct {
	once sync.Once
	err  error
}

var burnSink uint64

func helperMain(mode string) int {
	switch mode {
	case "burn": // spin until killed
		runtime.GOMAXPROCS(1)
		x := uint64(1)
		for {
			for i := 0; i < 1<<20; i++ {
				x = x*6364136223846793005 + 1442695040888963407
			}
			burnSink = x
		}
	case "idle": // block until killed
		time.Sleep(24 * time.Hour)
		return 0
	case "alloc": // touch RESIZE_AGENT_BPF_TEST_MIB MiB, keep it, report, wait
		mib, _ := strconv.Atoi(os.Getenv("RESIZE_AGENT_BPF_TEST_MIB"))
		var keep [][]byte
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = byte(i + j)
			}
			keep = append(keep, b)
		}
		fmt.Printf("allocated %d MiB\n", len(keep))
		time.Sleep(time.Minute)
		runtime.KeepAlive(keep)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
	return 2
}

func skipOrFail(t testing.TB, env, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(env) == "1" {
		t.Fatalf("%s (and %s=1)", msg, env)
	}
	t.Skip(msg)
}

// requireBPF skips (fails under RESIZE_AGENT_REQUIRE_BPF=1) unless the
// programs can be loaded here.
func requireBPF(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, envRequireBPF, "eBPF tests need root")
	}
	probe.once.Do(func() { probe.err = Probe() })
	if probe.err != nil {
		skipOrFail(t, envRequireBPF, "eBPF not usable on this kernel: %v", probe.err)
	}
}

// requireCgroup2Limits skips unless /sys/fs/cgroup is a cgroup v2 hierarchy
// with the cpu and memory controllers (fails under
// RESIZE_AGENT_REQUIRE_CGROUP2=1), and then requires BPF. It returns the
// mountpoint.
func requireCgroup2Limits(t testing.TB) string {
	t.Helper()
	const root = "/sys/fs/cgroup"
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		skipOrFail(t, envRequireCgroup2, "no cgroup v2 hierarchy with controllers at %s (hybrid or v1 host?): %v", root, err)
	}
	ctrl := strings.Fields(string(b))
	if !contains(ctrl, "cpu") || !contains(ctrl, "memory") {
		skipOrFail(t, envRequireCgroup2, "cgroup v2 at %s lacks the cpu or memory controller: %q", root, ctrl)
	}
	requireBPF(t)
	sub, err := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cpu", "memory"} {
		if !contains(strings.Fields(string(sub)), c) {
			if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
				t.Fatalf("enabling %s in %s/cgroup.subtree_control: %v", c, root, err)
			}
		}
	}
	return root
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// cgroup2Mount returns a cgroup v2 mountpoint: an existing one from
// /proc/mounts, else a fresh mount in a temporary directory (unmounted at
// cleanup). On a hybrid host that is the controller-less unified
// hierarchy, which is all run-queue attribution by cgroup id needs.
func cgroup2Mount(t testing.TB) string {
	t.Helper()
	f, err := os.Open("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1]
		}
	}
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "cgroup2", 0, ""); err != nil {
		skipOrFail(t, envRequireBPF, "no cgroup v2 hierarchy mounted and mounting one failed: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// testCgroup is a cgroup v2 directory created for one test.
type testCgroup struct {
	path string
	id   uint64 // inode number == cgroup id
}

// newCgroup creates parent/<unique name>; cleanup kills what runs in it
// and removes it.
func newCgroup(t testing.TB, parent, name string) testCgroup {
	t.Helper()
	path := filepath.Join(parent, fmt.Sprintf("resize-agent-bpftest-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatalf("creating cgroup: %v", err)
	}
	t.Cleanup(func() { removeCgroup(t, path) })
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return testCgroup{path: path, id: st.Ino}
}

func (c testCgroup) write(t testing.TB, file, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.path, file), []byte(value), 0); err != nil {
		t.Fatalf("writing %q to %s/%s: %v", value, c.path, file, err)
	}
}

func (c testCgroup) read(t testing.TB, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.path, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func removeCgroup(t testing.TB, path string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0) != nil {
			// Before 5.14: kill the members one by one.
			b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		err := unix.Rmdir(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("removing cgroup %s: %v", path, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startHelper starts the test binary as a helper process born in cg
// (clone3 CLONE_INTO_CGROUP). Cleanup kills and reaps it.
func startHelper(t testing.TB, cg testCgroup, mode string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envHelper+"="+mode), env...)
	return startInCgroup(t, cg, cmd)
}

// startShellBurner starts a single-threaded CPU burner in cg: a shell
// loop, so that all of the cgroup's run-queue samples are the burner's
// (a Go helper also has runtime threads that wake up now and then). It
// falls back to the Go helper without /bin/sh.
func startShellBurner(t testing.TB, cg testCgroup) *exec.Cmd {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		return startHelper(t, cg, "burn")
	}
	return startInCgroup(t, cg, exec.Command("/bin/sh", "-c", "while :; do :; done"))
}

func startInCgroup(t testing.TB, cg testCgroup, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	dir, err := os.Open(cg.path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		UseCgroupFD: true,
		CgroupFD:    int(dir.Fd()),
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v in %s: %v", cmd.Args, cg.path, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// runDelay sums the kernel's own run-queue wait time (ns, the second field
// of /proc/PID/task/TID/schedstat) over the threads of the given processes.
func runDelay(pids []int) (time.Duration, bool) {
	var sum time.Duration
	for _, pid := range pids {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		if err != nil || len(tasks) == 0 {
			return 0, false
		}
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // thread exited
			}
			fields := strings.Fields(string(b))
			if len(fields) < 2 {
				return 0, false
			}
			ns, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, false
			}
			sum += time.Duration(ns)
		}
	}
	return sum, true
}

// sub returns a-b for the counters a test compares before and after.
func sub(a, b Stats) Stats {
	d := Stats{
		RunqLatency: Histogram{
			Buckets: make([]uint64, HistogramBuckets),
			Count:   a.RunqLatency.Count - b.RunqLatency.Count,
			Sum:     a.RunqLatency.Sum - b.RunqLatency.Sum,
		},
		ReclaimStall: a.ReclaimStall - b.ReclaimStall,
		Reclaims:     a.Reclaims - b.Reclaims,
		OOMKills:     a.OOMKills - b.OOMKills,
	}
	for i := range d.RunqLatency.Buckets {
		d.RunqLatency.Buckets[i] = a.RunqLatency.Buckets[i] - b.RunqLatency.Buckets[i]
	}
	return d
}

func describe(h Histogram) string {
	return fmt.Sprintf("n=%d mean=%v p50=%v p90=%v p99=%v", h.Count, h.Mean(), h.Quantile(0.5), h.Quantile(0.9), h.Quantile(0.99))
}

// stopAll stops the processes (SIGSTOP) and waits until every one of
// their threads is stopped, i.e. switched out and off the run queue.
func stopAll(t testing.TB, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for !allStopped(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d not stopped 5 s after SIGSTOP", pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func contAll(t testing.TB, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
}

// allStopped tells whether every thread of pid is in state T (stopped).
func allStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
