package integration_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
	"github.com/resizer/resize-agent/test/looptest"
)

// RA_HELPER=dentries fills the helper's own cgroup with reclaimable kernel
// memory until its memory.current reaches RA_MB MiB, says so, and sleeps.
// The guest has no disk: every file lives on tmpfs, whose pages are shmem
// and need swap to be reclaimed. Negative dentries are what is reclaimable
// without swap there: looking up a name that does not exist in cgroupfs
// (kernfs keeps negative dentries, tmpfs does not) allocates a dentry and,
// for a long name, an external name, both charged to the caller's memory
// cgroup and freed by the memcg-aware dcache shrinker on reclaim, the way
// clean page cache would be.
func init() {
	if os.Getenv("RA_HELPER") != "dentries" {
		return
	}
	mb, _ := strconv.Atoi(os.Getenv("RA_MB"))
	dir := os.Getenv("RA_DIR")
	cur := func() int64 {
		b, _ := os.ReadFile(filepath.Join(dir, "memory.current"))
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v
	}
	long := strings.Repeat("n", 200)
	n := 0
	for cur() < int64(mb)<<20 && n < 5_000_000 {
		for i := 0; i < 2000; i++ {
			_, _ = os.Lstat(filepath.Join(dir, long+strconv.Itoa(n)))
			n++
		}
	}
	fmt.Println("ready", n, cur())
	time.Sleep(time.Hour)
	os.Exit(0)
}

// RA_HELPER=pagecache writes RA_MB MiB to the file RA_FILE, syncs it so
// that its pages are clean, reads it back, says so and sleeps: page cache
// charged to its cgroup, reclaimable without swap.
func init() {
	if os.Getenv("RA_HELPER") != "pagecache" {
		return
	}
	mb, _ := strconv.Atoi(os.Getenv("RA_MB"))
	f, err := os.Create(os.Getenv("RA_FILE"))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for i := 0; i < mb; i++ {
		if _, err := f.Write(buf); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
	}
	if err := f.Sync(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if _, err := f.Seek(0, 0); err == nil {
		for {
			if _, err := f.Read(buf); err != nil {
				break
			}
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	os.Exit(0)
}

// pageCacheFS mounts an ext2 filesystem on a loop device for files whose
// pages are real page cache (the guest's own files are all on tmpfs). The
// image on tmpfs is filled first, by the test in the root cgroup, so that
// the loop device's writes into it charge nothing to the container.
func pageCacheFS(t *testing.T, mb int) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "fs.img")
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			if os.Getenv(cgrouptest.RequireEnv) == "1" {
				t.Fatalf("%s %v: %v: %s", name, args, err, out)
			}
			t.Skipf("needs %s (the VM harness has it): %v: %s", name, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("dd", "if=/dev/zero", "of="+img, "bs=1M", fmt.Sprintf("count=%d", mb))
	dev := looptest.Attach(t, img)
	run("mke2fs", "-q", dev)
	mp := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev, mp, "ext4", 0, ""); err != nil {
		if os.Getenv(cgrouptest.RequireEnv) == "1" {
			t.Fatalf("mount %s: %v", dev, err)
		}
		t.Skipf("mount %s (ext4 driver): %v", dev, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mp, 0) })
	return mp
}

func startAndWait(t *testing.T, mnt, p string, cmd *exec.Cmd) {
	t.Helper()
	out := &strings.Builder{}
	cmd.Stdout = out
	cgrouptest.StartIn(t, mnt, p, cmd)
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), "ready") && !strings.Contains(out.String(), "allocated") {
		if time.Now().After(deadline) {
			t.Fatalf("helper not ready: %q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("helper: %s", strings.TrimSpace(out.String()))
}

func memStat(t *testing.T, mnt, p, key string) int64 {
	t.Helper()
	for _, l := range strings.Split(cgrouptest.ReadFile(t, mnt, p, "memory.stat"), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in %s/memory.stat", key, p)
	return 0
}

func memFigures(t *testing.T, mnt, p string) string {
	t.Helper()
	stat := map[string]string{}
	for _, l := range strings.Split(cgrouptest.ReadFile(t, mnt, p, "memory.stat"), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			stat[k] = v
		}
	}
	return fmt.Sprintf("memory.current=%s memory.max=%s memory.high=%s anon=%s file=%s slab_reclaimable=%s",
		cgrouptest.ReadFile(t, mnt, p, "memory.current"), cgrouptest.ReadFile(t, mnt, p, "memory.max"),
		cgrouptest.ReadFile(t, mnt, p, "memory.high"), stat["anon"], stat["file"], stat["slab_reclaimable"])
}

func alive(t *testing.T, mnt, p string, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process died: %v", err)
	}
	if procs := cgrouptest.ReadFile(t, mnt, p, "cgroup.procs"); procs != strconv.Itoa(cmd.Process.Pid) {
		t.Errorf("cgroup.procs = %q, want the same process %d", procs, cmd.Process.Pid)
	}
	if ev := cgrouptest.ReadFile(t, mnt, p, "memory.events"); !strings.Contains(ev, "oom_kill 0") {
		t.Errorf("memory.events: %s", ev)
	}
}

// TestShrinkReclaimable lowers the memory limit of a running process from
// 128Mi to 32Mi while it holds about 64 MiB of reclaimable memory: the agent
// lowers memory.high, has the kernel reclaim, then lowers memory.max, and
// puts memory.high back; the process lives on.
func TestShrinkReclaimable(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30})
	p := cgrouptest.Child(t, e.mnt, e.base, "cache")
	shrinkReclaimable(t, e, p, helper("RA_HELPER=dentries", "RA_MB=64", "RA_DIR="+filepath.Join(e.mnt, p)))
}

// shrinkReclaimable gives p 128Mi, starts cmd in it (which fills it with
// reclaimable memory), asks for 32Mi and checks that it was reached with
// memory.high restored and the process alive.
func shrinkReclaimable(t *testing.T, e *env, p string, cmd *exec.Cmd) {
	t.Helper()
	mustState(t, e.resize(t, "cache", p, "", res{"memory": "128Mi"}, res{"memory": "128Mi"}), intent.Completed)
	startAndWait(t, e.mnt, p, cmd)
	t.Logf("before: %s", memFigures(t, e.mnt, p))
	start := time.Now()
	it := e.resize(t, "cache", p, "", res{"memory": "32Mi"}, res{"memory": "32Mi"})
	t.Logf("after %s: %s", time.Since(start).Round(time.Millisecond), memFigures(t, e.mnt, p))
	mustState(t, it, intent.Completed)
	if !strings.Contains(it.Status.Message, "reclaimed") {
		t.Errorf("message %q does not say what was reclaimed", it.Status.Message)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.max"); got != "33554432" {
		t.Errorf("memory.max = %s, want 32Mi", got)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.high"); got != "max" {
		t.Errorf("memory.high = %s, want it restored to max", got)
	}
	alive(t, e.mnt, p, cmd)
}

// TestShrinkPageCache is TestShrinkReclaimable with the reclaimable memory
// as clean page cache of a file on a real filesystem.
func TestShrinkPageCache(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30})
	fs := pageCacheFS(t, 160)
	p := cgrouptest.Child(t, e.mnt, e.base, "cache")
	shrinkReclaimable(t, e, p, helper("RA_HELPER=pagecache", "RA_MB=64", "RA_FILE="+filepath.Join(fs, "data")))
	if file := memStat(t, e.mnt, p, "file"); file >= 32<<20 {
		t.Errorf("file pages %d after the shrink", file)
	}
}

// TestShrinkAnonymousFails asks the same of a process holding 64 MiB of
// anonymous memory, with no swap: usage cannot come down, so the intent
// fails with the figures and memory.max and memory.high stay as they were.
func TestShrinkAnonymousFails(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30})
	p := cgrouptest.Child(t, e.mnt, e.base, "anon")
	mustState(t, e.resize(t, "anon", p, "", res{"memory": "128Mi"}, res{"memory": "128Mi"}), intent.Completed)
	cmd := helper("RA_HELPER=alloc", "RA_MB=64", "RA_HOLD=1")
	startAndWait(t, e.mnt, p, cmd)
	t.Logf("before: %s", memFigures(t, e.mnt, p))
	start := time.Now()
	it := e.resize(t, "anon", p, "", res{"memory": "32Mi"}, res{"memory": "32Mi"})
	t.Logf("after %s: %s", time.Since(start).Round(time.Millisecond), memFigures(t, e.mnt, p))
	mustState(t, it, intent.Failed)
	if it.Status.Reason != intent.ReasonMemoryBelowUsage {
		t.Errorf("reason %s", it.Status.Reason)
	}
	for _, w := range []string{"could not reclaim enough", "anon ", "memory.max left at 128Mi", "restored to max"} {
		if !strings.Contains(it.Status.Message, w) {
			t.Errorf("message %q lacks %q", it.Status.Message, w)
		}
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.max"); got != "134217728" {
		t.Errorf("memory.max = %s, want 128Mi as before", got)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, p, "memory.high"); got != "max" {
		t.Errorf("memory.high = %s, want max as before", got)
	}
	alive(t, e.mnt, p, cmd)
}

// TestShrinkPodLevel shrinks a container and, with it, its pod's cgroup
// below the pod's usage: container first, then the pod, both reclaimed.
func TestShrinkPodLevel(t *testing.T) {
	e := setup(t, admission.Capacity{MilliCPU: 4000, Memory: 1 << 30})
	pod := cgrouptest.Child(t, e.mnt, e.base, "pod")
	a := cgrouptest.Child(t, e.mnt, pod, "a")
	b := cgrouptest.Child(t, e.mnt, pod, "b")
	mustState(t, e.resize(t, "a", a, pod, res{"memory": "96Mi"}, res{"memory": "96Mi"}), intent.Completed)
	mustState(t, e.resize(t, "b", b, pod, res{"memory": "32Mi"}, res{"memory": "32Mi"}), intent.Completed)
	if got := cgrouptest.ReadFile(t, e.mnt, pod, "memory.max"); got != "134217728" {
		t.Fatalf("pod memory.max = %s, want 128Mi", got)
	}
	cmd := helper("RA_HELPER=dentries", "RA_MB=64", "RA_DIR="+filepath.Join(e.mnt, a))
	startAndWait(t, e.mnt, a, cmd)
	t.Logf("before: container %s; pod %s", memFigures(t, e.mnt, a), memFigures(t, e.mnt, pod))
	it := e.resize(t, "a", a, pod, res{"memory": "16Mi"}, res{"memory": "16Mi"})
	t.Logf("after: container %s; pod %s", memFigures(t, e.mnt, a), memFigures(t, e.mnt, pod))
	mustState(t, it, intent.Completed)
	for path, want := range map[string]string{a: "16777216", pod: "50331648"} {
		if got := cgrouptest.ReadFile(t, e.mnt, path, "memory.max"); got != want {
			t.Errorf("%s memory.max = %s, want %s", path, got, want)
		}
		if got := cgrouptest.ReadFile(t, e.mnt, path, "memory.high"); got != "max" {
			t.Errorf("%s memory.high = %s, want max", path, got)
		}
	}
	alive(t, e.mnt, a, cmd)
}

// TestCRIShrinkReclaimable is TestShrinkReclaimable for a containerd
// container: the agent brings usage down with memory.high and
// memory.reclaim, and memory.max is then set through CRI
// UpdateContainerResources, so containerd's record says 32Mi too.
func TestCRIShrinkReclaimable(t *testing.T) {
	e := setupCRI(t, admission.Capacity{MilliCPU: 4000, Memory: 2 << 30})
	p := e.runPod(t)
	// Negative dentries, as in TestShrinkReclaimable, from busybox ash,
	// whose "[" is a builtin: a stat per lookup, no fork.
	fill := `i=0; while [ $i -lt 130000 ]; do [ -e /sys/fs/cgroup/` + strings.Repeat("n", 200) + `$i ]; i=$((i+1)); done; echo > /tmp/ready; exec sleep 3600`
	ct := e.runContainer(t, p, "cache", &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 128 << 20},
		"/bin/busybox", "sh", "-c", fill)
	cg := e.cgroupOf(t, ct)
	mustState(t, e.resize(t, p, "cache", res{"memory": "128Mi"}, res{"memory": "128Mi"}, nil), intent.Completed)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if code, _ := e.exec(t, ct.ID, "/bin/busybox", "test", "-e", "/tmp/ready"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container did not fill its memory: %s", memFigures(t, e.mnt, cg))
		}
		time.Sleep(time.Second)
	}
	ct, err := e.CRI.Get(context.Background(), ct.ID) // after exec, same process
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before: %s", memFigures(t, e.mnt, cg))
	start := time.Now()
	it := e.resize(t, p, "cache", res{"memory": "32Mi"}, res{"memory": "32Mi"}, nil)
	t.Logf("after %s: %s", time.Since(start).Round(time.Millisecond), memFigures(t, e.mnt, cg))
	mustState(t, it, intent.Completed)
	if it.Status.Via != "runtime" {
		t.Errorf("via %q, want the runtime to set memory.max", it.Status.Via)
	}
	if !strings.Contains(it.Status.Message, "reclaimed") {
		t.Errorf("message %q does not say what was reclaimed", it.Status.Message)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, cg, "memory.max"); got != "33554432" {
		t.Errorf("memory.max = %s, want 32Mi", got)
	}
	if got := cgrouptest.ReadFile(t, e.mnt, cg, "memory.high"); got != "max" {
		t.Errorf("memory.high = %s, want it restored to max", got)
	}
	if st, _ := e.CRI.Get(context.Background(), ct.ID); st.Resources.MemoryLimit != 32<<20 {
		t.Errorf("containerd's record: memory limit %d, want 32Mi", st.Resources.MemoryLimit)
	}
	if ev := cgrouptest.ReadFile(t, e.mnt, cg, "memory.events"); !strings.Contains(ev, "oom_kill 0") {
		t.Errorf("memory.events: %s", ev)
	}
	e.sameContainer(t, ct)
}
