// Package cgrouptest provides cgroup trees for tests: a directory laid out
// like cgroupfs for unit tests of logic, and throwaway cgroups on the real
// kernel's cgroup v2 hierarchy for tests that must prove behaviour.
package cgrouptest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RequireEnv, when set to 1, turns the skip of a test that needs a real
// cgroup v2 hierarchy into a failure: the VM harness and CI set it where such
// a hierarchy must exist.
const RequireEnv = "RESIZE_AGENT_REQUIRE_CGROUP2"

// FakeTree creates a directory that looks like a cgroup v2 mountpoint with
// the cpu and memory controllers, and one cgroup per path with the kernel's
// defaults. It is for unit tests only: it does not round, reject or enforce.
func FakeTree(t testing.TB, paths ...string) string {
	t.Helper()
	root := t.TempDir()
	write(t, root, "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc")
	write(t, root, "cgroup.subtree_control", "cpu memory")
	for _, p := range paths {
		AddFake(t, root, p)
	}
	return root
}

// AddFake adds a cgroup with default values to a FakeTree.
func AddFake(t testing.TB, root, p string) {
	t.Helper()
	d := filepath.Join(root, p)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{
		"cpu.max": "max 100000", "cpu.weight": "100", "memory.max": "max",
		"memory.current": "0", "cgroup.procs": "", "cgroup.controllers": "cpu memory",
	} {
		write(t, d, f, v)
	}
}

// SetFile sets a file of a cgroup in a FakeTree (or, as root, a real one).
func SetFile(t testing.TB, root, p, file, data string) {
	t.Helper()
	write(t, filepath.Join(root, p), file, data)
}

// ReadFile returns a file of a cgroup, trimmed.
func ReadFile(t testing.TB, root, p, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, p, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func write(t testing.TB, dir, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Real returns the real cgroup v2 mountpoint and a fresh cgroup below it
// (relative path) with the cpu and memory controllers enabled, removed when
// the test ends. Where the host has no usable cgroup v2 hierarchy it skips
// with the reason, or fails when RequireEnv is set.
func Real(t testing.TB) (mountpoint, path string) {
	t.Helper()
	mountpoint = "/sys/fs/cgroup"
	if err := usable(mountpoint); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("a real cgroup v2 hierarchy is required here (%s=1): %v", RequireEnv, err)
		}
		t.Skipf("needs a real cgroup v2 hierarchy with cpu and memory controllers (run make test-vm): %v", err)
	}
	parent := "/resize-agent-test"
	if err := mkCgroup(mountpoint, parent); err != nil {
		t.Fatal(err)
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	path = fmt.Sprintf("%s/%s-%d", parent, name, time.Now().UnixNano())
	if err := mkCgroup(mountpoint, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(t, mountpoint, path) })
	return mountpoint, path
}

// Child creates a cgroup below parent (a Real one) with cpu and memory
// enabled, removed when the test ends.
func Child(t testing.TB, mountpoint, parent, name string) string {
	t.Helper()
	p := parent + "/" + name
	if err := mkCgroup(mountpoint, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(t, mountpoint, p) })
	return p
}

// mkCgroup creates p with the cpu and memory controllers, enabling them in
// its parent. It leaves p's own subtree_control alone: a cgroup that
// delegates controllers may hold no processes.
func mkCgroup(mountpoint, p string) error {
	parent := filepath.Dir(filepath.Join(mountpoint, p))
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu +memory"), 0); err != nil {
		return fmt.Errorf("enable controllers in %s: %w", parent, err)
	}
	if err := os.Mkdir(filepath.Join(mountpoint, p), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// Remove kills what runs in the cgroup p and removes it and its children;
// in a FakeTree it removes the directory.
func Remove(t testing.TB, mountpoint, p string) {
	d := filepath.Join(mountpoint, p)
	if usable(mountpoint) != nil {
		if err := os.RemoveAll(d); err != nil {
			t.Error(err)
		}
		return
	}
	_ = os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0)
	entries, _ := os.ReadDir(d)
	for _, e := range entries {
		if e.IsDir() {
			Remove(t, mountpoint, p+"/"+e.Name())
		}
	}
	for i := 0; i < 50; i++ {
		if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("could not remove cgroup %s", d)
}

func usable(mountpoint string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(mountpoint, &st); err != nil {
		return err
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("%s is not cgroup2 (hybrid or v1 host)", mountpoint)
	}
	b, err := os.ReadFile(filepath.Join(mountpoint, "cgroup.controllers"))
	if err != nil {
		return err
	}
	f := " " + strings.Join(strings.Fields(string(b)), " ") + " "
	if !strings.Contains(f, " cpu ") || !strings.Contains(f, " memory ") {
		return fmt.Errorf("%s lacks the cpu or memory controller (has %q)", mountpoint, strings.TrimSpace(f))
	}
	return nil
}

// StartIn starts cmd directly inside the cgroup p (clone3 with
// CLONE_INTO_CGROUP, so no instant is spent outside it) and kills it when the
// test ends.
func StartIn(t testing.TB, mountpoint, p string, cmd *exec.Cmd) {
	t.Helper()
	fd, err := unix.Open(filepath.Join(mountpoint, p), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v in %s: %v", cmd.Args, p, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
}

// CPUUsage returns usage_usec from the cgroup's cpu.stat.
func CPUUsage(t testing.TB, mountpoint, p string) time.Duration {
	t.Helper()
	for _, line := range strings.Split(ReadFile(t, mountpoint, p, "cpu.stat"), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(n) * time.Microsecond
		}
	}
	t.Fatalf("no usage_usec in %s/cpu.stat", p)
	return 0
}

// CPURate measures how many CPUs the cgroup used over d.
func CPURate(t testing.TB, mountpoint, p string, d time.Duration) float64 {
	t.Helper()
	u0, t0 := CPUUsage(t, mountpoint, p), time.Now()
	time.Sleep(d)
	u1, t1 := CPUUsage(t, mountpoint, p), time.Now()
	return float64(u1-u0) / float64(t1.Sub(t0))
}

// FakePressure writes PSI, cpu.stat and memory.events files into a
// FakeTree cgroup.
func FakePressure(t testing.TB, root, p string, cpuSomeUsec, throttled, oomKills uint64) {
	t.Helper()
	psi := func(some uint64) string {
		return fmt.Sprintf("some avg10=1.50 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=%d\n", some, some/2)
	}
	SetFile(t, root, p, "cpu.pressure", psi(cpuSomeUsec))
	SetFile(t, root, p, "memory.pressure", psi(cpuSomeUsec/10))
	SetFile(t, root, p, "io.pressure", psi(0))
	SetFile(t, root, p, "cpu.stat", fmt.Sprintf("usage_usec 5000\nuser_usec 4000\nsystem_usec 1000\nnr_periods 100\nnr_throttled %d\nthrottled_usec %d\n", throttled, throttled*1000))
	SetFile(t, root, p, "memory.events", fmt.Sprintf("low 0\nhigh 0\nmax 3\noom %d\noom_kill %d\noom_group_kill 0\n", oomKills, oomKills))
	SetFile(t, root, p, "memory.stat", "anon 0\nfile 0\n")
}

// StartBusy starts a shell busy loop in the cgroup p (busybox or any sh).
func StartBusy(t testing.TB, mountpoint, p string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	StartIn(t, mountpoint, p, cmd)
	return cmd
}
