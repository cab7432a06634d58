package crash_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

const (
	containers = 4
	submitters = 6
	perCycle   = 40 // intents submitted at most per cycle
	maxKillAt  = 400 * time.Millisecond
)

// daemonBinary finds resize-agent: $RESIZE_AGENT_BIN or PATH (the VM
// payload's /payload/bin).
func daemonBinary(t *testing.T) string {
	if p := os.Getenv("RESIZE_AGENT_BIN"); p != "" {
		return p
	}
	p, err := exec.LookPath("resize-agent")
	if err != nil {
		if os.Getenv(cgrouptest.RequireEnv) == "1" {
			t.Fatalf("the resize-agent binary is required here (%s=1): set RESIZE_AGENT_BIN or put it in PATH: %v", cgrouptest.RequireEnv, err)
		}
		t.Skipf("needs the resize-agent binary (RESIZE_AGENT_BIN or PATH; test/run-vm-tests.sh provides it): %v", err)
	}
	return p
}

type harness struct {
	t      *testing.T
	bin    string
	mnt    string
	dir    string
	socket string
	paths  []string
	c      *api.Client

	mu      sync.Mutex
	acked   map[string]bool // every intent the API acknowledged
	refused map[string]bool // every intent it refused (503: the journal failed)
}

type daemon struct {
	cmd     *exec.Cmd
	exited  chan error
	logPath string
	ready   time.Duration // from exec to the API answering
}

const startBound = 2 * time.Minute

func (h *harness) start(cycle int) *daemon {
	t := h.t
	t.Helper()
	d := &daemon{logPath: filepath.Join(h.dir, fmt.Sprintf("agent-%02d.log", cycle)), exited: make(chan error, 1)}
	logf, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	d.cmd = exec.Command(h.bin,
		"--cgroup-root="+h.mnt, "--socket="+h.socket, "--state-dir="+filepath.Join(h.dir, "state"),
		"--metrics-address=", "--cri-endpoint=", "--bpf=off", "--node-name=",
		"--cpu-allocatable=8", "--memory-allocatable=8Gi",
		// The test's cgroups are outside the kubepods default target root.
		"--allow-target-cgroup=/resize-agent-test")
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	begin := time.Now()
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() { _ = d.cmd.Process.Kill() })
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := h.c.Node(ctx)
		cancel()
		if err == nil {
			d.ready = time.Since(begin)
			return d
		}
		select {
		case err := <-d.exited:
			t.Fatalf("cycle %d: the daemon exited before serving: %v\n%s", cycle, err, d.log())
		case <-time.After(5 * time.Millisecond):
		}
		// A bound on a daemon that never serves, not a start-up target:
		// under TCG, exec to serving takes 10-17 s in a quiet guest (Go's
		// package init, then decoding the 1.3 MB journal: about 0.1 s
		// natively) and passed 30 s with another VM and builds beside it.
		if time.Since(begin) > startBound {
			t.Fatalf("cycle %d: the daemon did not serve within %v: %v\n%s", cycle, startBound, err, d.log())
		}
	}
}

func (d *daemon) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

func (d *daemon) kill(t *testing.T) {
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.exited
}

var replayed = regexp.MustCompile(`msg="journal replayed".* requeued=(\d+) .*took=(\S+)`)

// recovery reads the daemon's replay line: how many intents were not
// terminal at the crash, and how long the replay took.
func (d *daemon) recovery(t *testing.T) (requeued int, took time.Duration) {
	m := replayed.FindStringSubmatch(d.log())
	if m == nil {
		t.Fatalf("no replay line in the daemon's log:\n%s", d.log())
	}
	requeued, _ = strconv.Atoi(m[1])
	took, _ = time.ParseDuration(m[2])
	return requeued, took
}

func list(r map[corev1.ResourceName]string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for k, v := range r {
		l[k] = resource.MustParse(v)
	}
	return l
}

// submit sends intents from several goroutines until perCycle are sent or
// the daemon is gone, and records those acknowledged.
func (h *harness) submit(cycle int, rng *rand.Rand, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var n atomic.Int32
	seeds := make([]uint64, submitters)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seeds[g], uint64(g)))
			for {
				i := n.Add(1)
				if i > perCycle {
					return
				}
				select {
				case <-stop:
					return
				default:
				}
				c := rng.IntN(containers)
				s := intent.Spec{ID: fmt.Sprintf("c%02d-%02d", cycle, i), Target: intent.Target{Name: fmt.Sprint("w", c), CgroupPath: h.paths[c]}}
				s.Resources.Requests = list(map[corev1.ResourceName]string{corev1.ResourceCPU: "10m", corev1.ResourceMemory: "16Mi"})
				s.Resources.Limits = list(map[corev1.ResourceName]string{
					corev1.ResourceCPU:    fmt.Sprintf("%dm", 100+10*rng.IntN(190)),
					corev1.ResourceMemory: fmt.Sprintf("%dMi", 32+rng.IntN(224)),
				})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				it, _, err := h.c.Submit(ctx, s)
				cancel()
				if se := (*api.StatusError)(nil); errors.As(err, &se) && se.Body.Reason == "JournalUnavailable" {
					h.mu.Lock()
					h.refused[s.ID] = true
					h.mu.Unlock()
					continue
				}
				if err != nil {
					return // the daemon was killed
				}
				h.mu.Lock()
				h.acked[it.ID] = true
				h.mu.Unlock()
			}
		}()
	}
	return &wg
}

// verify waits until every acknowledged intent is terminal, then checks
// that each cgroup holds its last Completed intent's values, in the files
// and in the daemon's account. It returns how many intents were applied
// more than once (InProgress at a crash).
func (h *harness) verify(cycle int) (states map[intent.State]int, reapplied int) {
	t := h.t
	t.Helper()
	h.mu.Lock()
	acked := maps(h.acked)
	h.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	var all []intent.Intent
	for {
		// A bound on a hang: the whole history (3,000 seeded intents and
		// more) took over 10 s to list and decode in a TCG guest beside
		// another VM.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var err error
		all, err = h.c.List(ctx, "", "")
		cancel()
		if err != nil {
			t.Fatalf("cycle %d: list: %v", cycle, err)
		}
		byID := map[string]intent.Intent{}
		for _, it := range all {
			byID[it.ID] = it
		}
		var missing, stuck []string
		for _, id := range acked {
			if _, ok := byID[id]; !ok {
				missing = append(missing, id)
			}
		}
		// All of them: an intent journaled but not acknowledged before the
		// kill is recovered too, and may still be writing.
		for _, it := range all {
			if !it.Status.State.Terminal() {
				stuck = append(stuck, it.ID+"="+string(it.Status.State))
			}
		}
		if len(missing) > 0 {
			t.Fatalf("cycle %d: %d acknowledged intent(s) lost: %v", cycle, len(missing), missing)
		}
		h.mu.Lock()
		var applied []string
		for _, it := range all {
			if h.refused[it.ID] {
				applied = append(applied, it.ID+"="+string(it.Status.State))
			}
		}
		h.mu.Unlock()
		if len(applied) > 0 {
			t.Fatalf("cycle %d: %d intent(s) refused with 503 came back after the restart: %v", cycle, len(applied), applied)
		}
		if len(stuck) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cycle %d: intents not terminal 30s after the restart: %v", cycle, stuck)
		}
		time.Sleep(20 * time.Millisecond)
	}
	states = map[intent.State]int{}
	ackedSet := map[string]bool{}
	for _, id := range acked {
		ackedSet[id] = true
	}
	for _, it := range all {
		if !ackedSet[it.ID] {
			continue
		}
		states[it.Status.State]++
		if it.Status.Attempts > 1 {
			reapplied++
		}
		if it.Status.State != intent.Completed && it.Status.Reason == "" {
			t.Errorf("cycle %d: intent %s is %s with no reason", cycle, it.ID, it.Status.State)
		}
	}
	// The files and the daemon's account match each container's last
	// Completed intent.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	infos, err := h.c.Containers(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range h.paths {
		var last *intent.Intent
		for i := range all {
			if it := &all[i]; it.Spec.Target.CgroupPath == p && it.Status.State == intent.Completed {
				last = it
			}
		}
		if last == nil {
			continue
		}
		cpu := last.Spec.Resources.Limits[corev1.ResourceCPU]
		mem := last.Spec.Resources.Limits[corev1.ResourceMemory]
		wantCPU := fmt.Sprintf("%d 100000", cpu.MilliValue()*100)
		wantMem := fmt.Sprint(mem.Value())
		gotCPU := strings.TrimSpace(cgrouptest.ReadFile(t, h.mnt, p, "cpu.max"))
		gotMem := strings.TrimSpace(cgrouptest.ReadFile(t, h.mnt, p, "memory.max"))
		if gotCPU != wantCPU || gotMem != wantMem {
			t.Errorf("cycle %d: %s holds cpu.max=%q memory.max=%s, but its last Completed intent %s gave cpu.max=%q memory.max=%s",
				cycle, p, gotCPU, gotMem, last.ID, wantCPU, wantMem)
		}
		i := slices.IndexFunc(infos, func(ci agent.ContainerInfo) bool { return ci.CgroupPath == p })
		if i < 0 {
			t.Errorf("cycle %d: the daemon does not manage %s", cycle, p)
			continue
		}
		if r := infos[i].Resources; r.CPULimit != cpu.MilliValue() || r.MemoryLimit != mem.Value() {
			t.Errorf("cycle %d: the daemon holds %s as %+v, want the limits of %s", cycle, p, r, last.ID)
		}
	}
	return states, reapplied
}

func maps(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// seedJournal fills the journal with terminal history of a container long gone,
// past the compaction threshold (1 MiB): every daemon then compacts at its
// first write, so that kills land during compactions too.
func seedJournal(t *testing.T, stateDir string) {
	j, err := journal.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	now := time.Now()
	var last journal.Ticket
	for i := 1; ; i++ {
		id := fmt.Sprintf("seed-%04d", i)
		s := intent.Spec{ID: id, Target: intent.Target{Name: "gone", CgroupPath: "/resize-agent-test/gone"}}
		s.Resources.Limits = list(map[corev1.ResourceName]string{corev1.ResourceCPU: "1", corev1.ResourceMemory: "1Gi"})
		last = j.Append(journal.Record{Seq: uint64(i), Container: s.Target.CgroupPath, Intent: intent.Intent{ID: id, Spec: s,
			Status: intent.Status{State: intent.Failed, Reason: intent.ReasonContainerGone, Message: "seeded history", AcceptedAt: now, UpdatedAt: now, CompletedAt: &now}}})
		if i%100 == 0 {
			if err := j.Wait(last); err != nil {
				t.Fatal(err)
			}
			if st := j.Stats(); st.Size > 1<<20+1<<18 {
				return
			}
		}
	}
}

// fill leaves only leave bytes free on the file system of dir, with a
// file of zeros at path (tmpfs counts the pages written, not the size).
func fill(t *testing.T, dir, path string, leave int64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	n := int64(st.Bavail)*st.Bsize - leave
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zeros := make([]byte, 1<<20)
	for n > 0 {
		w, err := f.Write(zeros[:min(n, int64(len(zeros)))])
		n -= int64(w)
		if err != nil {
			break // full already
		}
	}
}

// TestKillNineLosesNothing is the crash test (see the package doc).
func TestKillNineLosesNothing(t *testing.T) {
	mnt, base := cgrouptest.Real(t)
	bin := daemonBinary(t)
	dir := t.TempDir()
	h := &harness{t: t, bin: bin, mnt: mnt, dir: dir, socket: filepath.Join(dir, "agent.sock"), acked: map[string]bool{}, refused: map[string]bool{}}
	h.c = api.NewClient(h.socket)
	for i := range containers {
		p := cgrouptest.Child(t, mnt, base, fmt.Sprint("w", i))
		cgrouptest.StartBusy(t, mnt, p)
		h.paths = append(h.paths, p)
	}
	// 25 cycles take about 75 s in the TCG VM when the host is quiet, 6
	// min on a loaded one (each restart then takes ~9 s to serve); the
	// issue's target of 100 is CRASH_CYCLES=100.
	cycles := 25
	if v, err := strconv.Atoi(os.Getenv("CRASH_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d cycles, daemon %s", seed, cycles, bin)
	rng := rand.New(rand.NewPCG(seed, 0))

	begin := time.Now()
	var inFlight, reappliedTotal, ran int
	var readies, replays []time.Duration
	total := map[intent.State]int{}
	stateDir := filepath.Join(dir, "state")
	jpath := filepath.Join(stateDir, journal.FileName)
	// A small file system of its own, to fill up.
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", stateDir, "tmpfs", 0, "size=16m,mode=0700"); err != nil {
		t.Fatalf("a tmpfs for the state directory (to fill it up): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(stateDir, syscall.MNT_DETACH) })
	filler := filepath.Join(stateDir, "filler")
	seedJournal(t, stateDir)
	inode := func() uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(jpath, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	var compactions, midCompaction, fullCycles, fullRestarts int
	d := h.start(0)
	ino := inode()
	for cycle := 1; cycle <= cycles; cycle++ {
		// One cycle in four runs out of disk: the journal fails in the
		// middle of a batch (what is left of its last page holds a few
		// records), the submissions after are refused, and half of these
		// restarts find the disk still full.
		full := rng.IntN(4) == 0
		if full {
			fullCycles++
			fill(t, stateDir, filler, 0)
		}
		stop := make(chan struct{})
		wg := h.submit(cycle, rng, stop)
		time.Sleep(time.Duration(rng.Int64N(int64(maxKillAt))))
		d.kill(t)
		close(stop)
		wg.Wait()
		// A compaction renames a new file over the journal; one cut short
		// leaves its temporary file.
		if n := inode(); n != ino {
			compactions++
			ino = n
		}
		if _, err := os.Stat(jpath + ".tmp"); err == nil {
			midCompaction++
		}
		stillFull := full && rng.IntN(2) == 0
		if full && !stillFull {
			os.Remove(filler)
		}
		if stillFull {
			fullRestarts++
		}

		d = h.start(cycle)
		requeued, took := d.recovery(t)
		if requeued > 0 {
			inFlight++
		}
		readies, replays = append(readies, d.ready), append(replays, took)
		states, reapplied := h.verify(cycle)
		os.Remove(filler)
		reappliedTotal = reapplied
		total = states
		ran++
		disk := ""
		switch {
		case stillFull:
			disk = ", disk full over the restart"
		case full:
			disk = ", disk full"
		}
		h.mu.Lock()
		refused := len(h.refused)
		h.mu.Unlock()
		t.Logf("cycle %2d: %4d acknowledged so far, %3d refused, %2d not terminal at the kill, replay %v, serving %v after exec; %v%s",
			cycle, len(h.acked), refused, requeued, took, d.ready.Round(time.Millisecond), states, disk)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log())
			return
		}
	}
	// A clean stop after all that.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-d.exited; err != nil {
		t.Errorf("the daemon did not stop cleanly: %v\n%s", err, d.log())
	}
	st, _ := os.Stat(filepath.Join(dir, "state", "intents.jsonl"))
	var size int64
	if st != nil {
		size = st.Size()
	}
	slices.Sort(readies)
	slices.Sort(replays)
	t.Logf("%d cycles in %v: %d kills with intents in flight (not terminal in the journal), %d acknowledged intents, %d applied again after a kill; final %v",
		ran, time.Since(begin).Round(time.Millisecond), inFlight, len(h.acked), reappliedTotal, total)
	t.Logf("%d compactions seen, %d kills during one", compactions, midCompaction)
	t.Logf("%d cycles ran out of disk (%d restarts on a full disk): %d intents refused with 503, none of them applied after a restart",
		fullCycles, fullRestarts, len(h.refused))
	t.Logf("recovery: replay median %v max %v; exec to serving median %v max %v; journal %d bytes",
		replays[len(replays)/2], replays[len(replays)-1], readies[len(readies)/2].Round(time.Millisecond), readies[len(readies)-1].Round(time.Millisecond), size)
	if inFlight == 0 {
		t.Errorf("no kill landed with intents in flight: the test did not test a crash mid-apply")
	}
}
