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
	"github.com/resizer/resize-agent/agent/admission"
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
	begin   time.Time
}

const startBound = 2 * time.Minute

// exec starts the daemon on the harness's state directory.
func (h *harness) exec(cycle int, suffix string) (*daemon, time.Time) {
	t := h.t
	t.Helper()
	d := &daemon{logPath: filepath.Join(h.dir, fmt.Sprintf("agent-%02d%s.log", cycle, suffix)), exited: make(chan error, 1)}
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
	return d, begin
}

// startFails runs the daemon on a state directory that fails with EIO: it
// must stop, saying so, and never serve (a DaemonSet restarts it until the
// disk is back).
func (h *harness) startFails(cycle int) {
	t := h.t
	t.Helper()
	d, begin := h.exec(cycle, "-eio")
	for {
		select {
		case err := <-d.exited:
			if err == nil || !isEIO(d.log()) {
				t.Fatalf("cycle %d: on a state directory failing with EIO the daemon exited with %v, want an error saying EIO:\n%s", cycle, err, d.log())
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := h.c.Node(ctx)
		cancel()
		if err == nil {
			t.Fatalf("cycle %d: the daemon served on a state directory failing with EIO:\n%s", cycle, d.log())
		}
		if time.Since(begin) > startBound {
			t.Fatalf("cycle %d: the daemon neither served nor stopped within %v on a state directory failing with EIO:\n%s", cycle, startBound, d.log())
		}
	}
}

func (h *harness) start(cycle int) *daemon {
	t := h.t
	t.Helper()
	d, begin := h.exec(cycle, "")
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := h.c.Node(ctx)
		cancel()
		if err == nil {
			d.ready, d.begin = time.Since(begin), begin
			return d
		}
		select {
		case err := <-d.exited:
			t.Fatalf("cycle %d: the daemon exited before serving: %v\n%s", cycle, err, d.log())
		case <-time.After(5 * time.Millisecond):
		}
		// A bound on a daemon that never serves, not a start-up target:
		// under TCG, exec to serving took a median 2.8 s, at most 5.3 s
		// (0.6 s to the first log line, then the journal), and 10-17 s
		// with the seeded journal of before, passing 30 s with another VM
		// and builds beside it.
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

var logTime = regexp.MustCompile(`(?m)^time=(\S+) .*msg="?([^"=]*)"? `)

// phases reads the times of the daemon's log lines: from exec to its
// first line (the binary loaded, Go's package init, options and checks),
// and from there to the journal replayed (the journal opened and read,
// recovery). Serving comes a few milliseconds after.
func (d *daemon) phases() (first, replayed time.Duration) {
	for _, m := range logTime.FindAllStringSubmatch(d.log(), -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		if first == 0 {
			first = at.Sub(d.begin)
		}
		if strings.HasPrefix(m[2], "journal replayed") {
			return first, at.Sub(d.begin) - first
		}
	}
	return first, 0
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
		// The test's containers' intents: every one the test submitted,
		// not the seeded history. A bound on a hang: the whole history
		// (then 3,000 seeded intents and more) took over 10 s to list and
		// decode in a TCG guest beside another VM.
		all = all[:0]
		for _, p := range h.paths {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			l, err := h.c.List(ctx, p, "")
			cancel()
			if err != nil {
				t.Fatalf("cycle %d: list: %v", cycle, err)
			}
			all = append(all, l...)
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
		reqCPU := last.Spec.Resources.Requests[corev1.ResourceCPU]
		reqMem := last.Spec.Resources.Requests[corev1.ResourceMemory]
		if a := infos[i].Allocated; a.MilliCPU != reqCPU.MilliValue() || a.Memory != reqMem.Value() {
			t.Errorf("cycle %d: the ledger holds %+v for %s, want the requests of %s", cycle, a, p, last.ID)
		}
	}
	// The ledger is the sum of what the containers hold.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	node, err := h.c.Node(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var sum admission.Capacity
	for _, ci := range infos {
		if ci.Allocated.MilliCPU != ci.Resources.CPURequest || ci.Allocated.Memory != ci.Resources.MemoryRequest {
			t.Errorf("cycle %d: %s holds requests %dm/%d but the ledger has %+v for it", cycle, ci.CgroupPath, ci.Resources.CPURequest, ci.Resources.MemoryRequest, ci.Allocated)
		}
		sum.MilliCPU += ci.Allocated.MilliCPU
		sum.Memory += ci.Allocated.Memory
	}
	if node.Allocated != sum {
		t.Errorf("cycle %d: the ledger says %+v allocated, the containers hold %+v", cycle, node.Allocated, sum)
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
// first write, so that kills land during compactions too. Compaction keeps
// this history (it is younger than the newest 10,000 terminal intents), so
// the file stays past the threshold.
//
// Few big records, not many small ones: replay costs per record more than
// per byte. 3,000 records of 450 bytes took 60-70 ms to open natively and
// 2-3 s of each restart in a quiet TCG guest (10 s and more on a loaded
// host); 160 records of 8 KiB (a long message) 20-30 ms natively.
func seedJournal(t *testing.T, stateDir string) {
	j, err := journal.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	now := time.Now()
	msg := "seeded history: " + strings.Repeat("-", 8<<10)
	var last journal.Ticket
	for i := 1; ; i++ {
		id := fmt.Sprintf("seed-%04d", i)
		s := intent.Spec{ID: id, Target: intent.Target{Name: "gone", CgroupPath: "/resize-agent-test/gone"}}
		s.Resources.Limits = list(map[corev1.ResourceName]string{corev1.ResourceCPU: "1", corev1.ResourceMemory: "1Gi"})
		last = j.Append(journal.Record{Seq: uint64(i), Container: s.Target.CgroupPath, Intent: intent.Intent{ID: id, Spec: s,
			Status: intent.Status{State: intent.Failed, Reason: intent.ReasonContainerGone, Message: msg, AcceptedAt: now, UpdatedAt: now, CompletedAt: &now}}})
		if i%10 == 0 {
			if err := j.Wait(last); err != nil {
				t.Fatal(err)
			}
			if st := j.Stats(); st.Size > 1<<20+1<<18 {
				return
			}
		}
	}
}

// fill fills the file system of path with a file of zeros there, until
// the file system refuses a byte more (ext4 reserves blocks for written
// data it has not allocated yet, and counts them as used).
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zeros := make([]byte, 1<<20)
	for _, chunk := range []int{1 << 20, 1 << 10, 1} {
		for {
			if _, err := f.Write(zeros[:chunk]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling the state directory: %v", err)
				}
				break
			}
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
		// A live process in each cgroup, asleep: four busy loops on the
		// guest's one vCPU left the daemon a fifth of it, and its start
		// (reading the journal) took 1 s of every cycle's 4.8 s.
		cgrouptest.StartIn(t, mnt, p, exec.Command("sh", "-c", "while :; do sleep 60; done"))
		h.paths = append(h.paths, p)
	}
	// The 100 kills; CRASH_CYCLES sets another number.
	cycles := 100
	if v, err := strconv.Atoi(os.Getenv("CRASH_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d cycles, daemon %s", seed, cycles, bin)
	rng := rand.New(rand.NewPCG(seed, 0))

	begin := time.Now()
	var inFlight, reappliedTotal, ran int
	var readies, replays, firsts, opens []time.Duration
	total := map[intent.State]int{}
	stateDir := filepath.Join(dir, "state")
	jpath := filepath.Join(stateDir, journal.FileName)
	// A small file system of its own, to fill up and to fail.
	fs := newStateFS(t, stateDir)
	filler := filepath.Join(stateDir, "filler")
	seedJournal(t, stateDir)
	inode := func() uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(jpath, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	var compactions, midCompaction, fullCycles, fullRestarts, eioCycles, eioRestarts, refusedFull, refusedEIO int
	d := h.start(0)
	ino := inode()
	for cycle := 1; cycle <= cycles; cycle++ {
		// One cycle in four runs out of disk: the journal fails in the
		// middle of a batch (what is left of its last block holds a few
		// records), and the submissions after are refused. One in six
		// loses its disk at a random moment before the kill (EIO from then
		// on: the batch in flight fails, though it may be on the device).
		// Half of the restarts after either find the disk still
		// full, or still failing: the daemon must then refuse to start,
		// and start once the disk is back.
		var full, eio bool
		switch r := rng.IntN(12); {
		case r < 3:
			full = true
			fullCycles++
			fill(t, filler)
		case r < 5:
			eio = true
			eioCycles++
		}
		h.mu.Lock()
		refusedBefore := len(h.refused)
		h.mu.Unlock()
		stop := make(chan struct{})
		wg := h.submit(cycle, rng, stop)
		killAt := time.Duration(rng.Int64N(int64(maxKillAt)))
		if eio {
			failAt := time.Duration(rng.Int64N(int64(killAt) + 1))
			time.Sleep(failAt)
			fs.shutdown()
			time.Sleep(killAt - failAt)
		} else {
			time.Sleep(killAt)
		}
		d.kill(t)
		close(stop)
		wg.Wait()
		still := (full || eio) && rng.IntN(2) == 0
		if eio {
			if still {
				h.startFails(cycle)
				eioRestarts++
			}
			fs.heal()
		}
		// A compaction renames a new file over the journal; one cut short
		// leaves its temporary file.
		if n := inode(); n != ino {
			compactions++
			ino = n
		}
		if _, err := os.Stat(jpath + ".tmp"); err == nil {
			midCompaction++
		}
		if full && !still {
			os.Remove(filler)
		}
		if full && still {
			fullRestarts++
		}

		d = h.start(cycle)
		requeued, took := d.recovery(t)
		if requeued > 0 {
			inFlight++
		}
		readies, replays = append(readies, d.ready), append(replays, took)
		first, open := d.phases()
		firsts, opens = append(firsts, first), append(opens, open)
		states, reapplied := h.verify(cycle)
		os.Remove(filler)
		reappliedTotal = reapplied
		total = states
		ran++
		h.mu.Lock()
		refused := len(h.refused)
		h.mu.Unlock()
		disk := ""
		switch {
		case full && still:
			disk = ", disk full over the restart"
		case full:
			disk = ", disk full"
		case eio && still:
			disk = ", EIO over a refused start"
		case eio:
			disk = ", EIO"
		}
		if full {
			refusedFull += refused - refusedBefore
		}
		if eio {
			refusedEIO += refused - refusedBefore
		}
		t.Logf("cycle %2d: %4d acknowledged so far, %3d refused, %2d not terminal at the kill, replay %v, serving %v after exec (first log line %v, journal read and replayed %v after); %v%s",
			cycle, len(h.acked), refused, requeued, took, d.ready.Round(time.Millisecond), first.Round(time.Millisecond), open.Round(time.Millisecond), states, disk)
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
	slices.Sort(firsts)
	slices.Sort(opens)
	t.Logf("%d cycles in %v: %d kills with intents in flight (not terminal in the journal), %d acknowledged intents, %d applied again after a kill; final %v",
		ran, time.Since(begin).Round(time.Millisecond), inFlight, len(h.acked), reappliedTotal, total)
	t.Logf("%d compactions seen, %d kills during one", compactions, midCompaction)
	t.Logf("%d cycles ran out of disk (%d restarts on a full disk), %d lost it (EIO; %d restarts refused on it): %d intents refused with 503 (%d on a full disk, %d on EIO), none of them applied after a restart",
		fullCycles, fullRestarts, eioCycles, eioRestarts, len(h.refused), refusedFull, refusedEIO)
	t.Logf("recovery: replay median %v max %v; exec to serving median %v max %v; journal %d bytes",
		replays[len(replays)/2], replays[len(replays)-1], readies[len(readies)/2].Round(time.Millisecond), readies[len(readies)-1].Round(time.Millisecond), size)
	t.Logf("start-up: exec to the first log line median %v max %v, then to the journal read and replayed median %v max %v",
		firsts[len(firsts)/2].Round(time.Millisecond), firsts[len(firsts)-1].Round(time.Millisecond), opens[len(opens)/2].Round(time.Millisecond), opens[len(opens)-1].Round(time.Millisecond))
	if inFlight == 0 {
		t.Errorf("no kill landed with intents in flight: the test did not test a crash mid-apply")
	}
	// From 50 cycles on, the odds that no cycle failed its disk either way
	// are under 1 in 10,000.
	if cycles >= 50 && (fullCycles == 0 || eioCycles == 0 || refusedFull == 0 || refusedEIO == 0) {
		t.Errorf("the disk faults did not happen: %d cycles full, %d with EIO, %d and %d intents refused", fullCycles, eioCycles, refusedFull, refusedEIO)
	}
}
