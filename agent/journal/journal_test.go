package journal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/resizer/resize-agent/agent/intent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rec(seq uint64, id, key string, s intent.State) Record {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := Record{Seq: seq, Container: key, Intent: intent.Intent{ID: id,
		Spec:   intent.Spec{ID: id, Target: intent.Target{Name: key, CgroupPath: "/" + key}},
		Status: intent.Status{State: s, AcceptedAt: now, UpdatedAt: now}}}
	if s == intent.Completed {
		r.Resources = &Resources{Resources: intent.Resources{CPULimit: int64(seq)}, CPU: true}
	}
	return r
}

func open(t testing.TB, dir string, opts ...Option) *Journal {
	t.Helper()
	j, err := Open(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func mustAppend(t testing.TB, j *Journal, rs ...Record) {
	t.Helper()
	for _, r := range rs {
		if err := j.Wait(j.Append(r)); err != nil {
			t.Fatal(err)
		}
	}
}

func states(rs []Record) string {
	var b bytes.Buffer
	for _, r := range rs {
		fmt.Fprintf(&b, "%d:%s:%s ", r.Seq, r.Intent.ID, r.Intent.Status.State)
	}
	return b.String()
}

func TestReplayLastRecordWins(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir)
	if n := len(j.Records()); n != 0 {
		t.Fatalf("new journal has %d records", n)
	}
	mustAppend(t, j, rec(1, "a", "c1", intent.Proposed), rec(2, "b", "c2", intent.Proposed),
		rec(1, "a", "c1", intent.InProgress), rec(2, "b", "c2", intent.Deferred), rec(1, "a", "c1", intent.Completed))
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(j.Append(rec(3, "c", "c1", intent.Proposed))); !errors.Is(err, ErrClosed) {
		t.Errorf("append after close: %v", err)
	}
	j = open(t, dir)
	defer j.Close()
	rs := j.Records()
	if got, want := states(rs), "1:a:Completed 2:b:Deferred "; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
	if rs[0].Resources == nil || rs[0].Resources.CPULimit != 1 || !rs[0].Resources.CPU {
		t.Errorf("resources of the completed intent: %+v", rs[0].Resources)
	}
	// Handed over, not kept: the agent holds the history.
	if again := j.Records(); len(again) != 0 {
		t.Errorf("a second Records returned %d records; the journal kept them", len(again))
	}
}

// TestTornTail cuts the last record at every byte: the records before it
// survive, the cut one is gone, and the journal appends cleanly after.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir)
	mustAppend(t, j, rec(1, "a", "c1", intent.Proposed), rec(1, "a", "c1", intent.Completed))
	j.Close()
	p := filepath.Join(dir, FileName)
	good, _ := os.ReadFile(p)
	last, _ := encode(rec(2, "b", "c1", intent.Proposed))
	for cut := 1; cut < len(last); cut++ {
		data := append(append([]byte{}, good...), last[:cut]...)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		j := open(t, dir)
		if got := states(j.Records()); got != "1:a:Completed " {
			t.Fatalf("cut at %d: replayed %q", cut, got)
		}
		mustAppend(t, j, rec(3, "c", "c2", intent.Proposed))
		j.Close()
		j = open(t, dir)
		if got := states(j.Records()); got != "1:a:Completed 3:c:Proposed " {
			t.Fatalf("cut at %d, appended after: replayed %q", cut, got)
		}
		j.Close()
	}
}

// TestTornTailGarbage: bad lines with nothing good after them are a torn
// tail too (a crash can leave zeros where a write had not landed).
func TestTornTailGarbage(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir)
	mustAppend(t, j, rec(1, "a", "c1", intent.Proposed))
	j.Close()
	p := filepath.Join(dir, FileName)
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(append(bytes.Repeat([]byte{0}, 100), "\nxx\n\x00\x00"...))
	f.Close()
	j = open(t, dir)
	defer j.Close()
	if got := states(j.Records()); got != "1:a:Proposed " {
		t.Errorf("replayed %q", got)
	}
	st, _ := os.Stat(p)
	if line, _ := encode(rec(1, "a", "c1", intent.Proposed)); st.Size() != int64(len(headerLine())+len(line)) {
		t.Errorf("file is %d bytes after cutting the tail, want %d", st.Size(), len(line))
	}
}

// TestCorruptLineQuarantined (issue 15, finding 9): a bad line with good
// lines after it no longer stops Open (on a DaemonSet, a crash loop until
// someone edits the file): the file as it was is kept aside, the bad line
// is counted and dropped, and everything else is replayed.
func TestCorruptLineQuarantined(t *testing.T) {
	for name, tc := range map[string]struct {
		mangle func([]byte) []byte
		want   string
	}{
		"bit flip":    {func(b []byte) []byte { b[len(b)/2] ^= 0x20; return b }, "1:a:Proposed 3:c:Proposed "},
		"lost byte":   {func(b []byte) []byte { i := len(b) / 2; return append(b[:i:i], b[i+1:]...) }, "1:a:Proposed 3:c:Proposed "},
		"not a line":  {func(b []byte) []byte { return append([]byte("hello\n"), b...) }, "1:a:Proposed 2:b:Proposed 3:c:Proposed "},
		"bad json":    {func(b []byte) []byte { return append([]byte("00000000 {}\n"), b...) }, "1:a:Proposed 2:b:Proposed 3:c:Proposed "},
		"cut in half": {func(b []byte) []byte { i := bytes.IndexByte(b, '\n') / 2; return append(b[:i:i], b[i+30:]...) }, "2:b:Proposed 3:c:Proposed "},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			j := open(t, dir)
			mustAppend(t, j, rec(1, "a", "c1", intent.Proposed), rec(2, "b", "c1", intent.Proposed), rec(3, "c", "c1", intent.Proposed))
			j.Close()
			p := filepath.Join(dir, FileName)
			data, _ := os.ReadFile(p)
			os.WriteFile(p, tc.mangle(data), 0o600)
			before, _ := os.ReadFile(p)
			j, err := Open(dir)
			if err != nil {
				t.Fatalf("Open = %v, want the bad line set aside", err)
			}
			if got := states(j.Records()); got != tc.want {
				t.Errorf("replayed %q, want %q", got, tc.want)
			}
			q := j.Quarantine()
			t.Logf("%+v", q)
			if st := j.Stats(); st.Quarantined != 1 || len(q.Lines) != 1 || st.Quarantined != len(q.Lines) {
				t.Errorf("stats %+v, quarantine %+v: want one bad line", st, q)
			}
			if len(q.Lines) > 0 && (q.Lines[0].Offset < 0 || q.Lines[0].Offset >= int64(len(before)) || q.Lines[0].Why == "") {
				t.Errorf("bad line %+v", q.Lines[0])
			}
			if cp, _ := os.ReadFile(q.Copy); !bytes.Equal(cp, before) || filepath.Dir(q.Copy) != dir {
				t.Errorf("the copy aside %s is not the file as it was", q.Copy)
			}
			mustAppend(t, j, rec(4, "d", "c1", intent.Proposed))
			j.Close()
			// The bad line left the file: the next Open finds nothing.
			j = open(t, dir)
			defer j.Close()
			if got := states(j.Records()); got != tc.want+"4:d:Proposed " {
				t.Errorf("replayed %q after the restart", got)
			}
			if st := j.Stats(); st.Quarantined != 0 {
				t.Errorf("the next Open set %d lines aside again", st.Quarantined)
			}
		})
	}
}

// TestQuarantineKeepsFewCopies: the copies set aside are bounded, the
// oldest removed first.
func TestQuarantineKeepsFewCopies(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, FileName)
	for i := range 5 {
		j := open(t, dir)
		mustAppend(t, j, rec(uint64(3*i+1), fmt.Sprint("a", i), "c1", intent.Proposed), rec(uint64(3*i+2), fmt.Sprint("b", i), "c1", intent.Proposed),
			rec(uint64(3*i+3), fmt.Sprint("c", i), "c1", intent.Proposed))
		j.Close()
		data, _ := os.ReadFile(p)
		data[bytes.Index(data, []byte(fmt.Sprint(`"b`, i)))+1] ^= 1
		os.WriteFile(p, data, 0o600)
		j = open(t, dir)
		if q := j.Quarantine(); len(q.Lines) != 1 {
			t.Fatalf("round %d: %+v", i, q)
		}
		j.Close()
	}
	copies, _ := filepath.Glob(p + CorruptSuffix + "*")
	if len(copies) != keepCopies {
		t.Errorf("%d copies kept aside, want %d: %v", len(copies), keepCopies, copies)
	}
}

// TestVersion: a file says its format version in a header line; a file
// without one (written before) opens as version 1; one of a newer version
// is refused and left as it is.
func TestVersion(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir)
	mustAppend(t, j, rec(1, "a", "c1", intent.Proposed))
	j.Close()
	p := filepath.Join(dir, FileName)
	data, _ := os.ReadFile(p)
	hdr := headerLine()
	if !bytes.HasPrefix(data, hdr) || !bytes.Contains(hdr, []byte(`"version":1`)) {
		t.Fatalf("file does not begin with the header %q: %q", hdr, data)
	}
	// Written before the header: the same records without it.
	os.WriteFile(p, data[len(hdr):], 0o600)
	j = open(t, dir)
	if got := states(j.Records()); got != "1:a:Proposed " {
		t.Errorf("headerless file replayed %q", got)
	}
	j.Close()
	// From a newer agent.
	newer := append(frame([]byte(`{"format":"resize-agent-journal","version":2}`)), "whatever version 2 writes\n"...)
	os.WriteFile(p, newer, 0o600)
	_, err := Open(dir)
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("Open of a version 2 file = %v, want ErrVersion", err)
	}
	t.Log(err)
	if after, _ := os.ReadFile(p); !bytes.Equal(after, newer) {
		t.Error("Open changed a file it refused")
	}
	os.Remove(p)
	open(t, dir).Close() // the lock was released
}

func TestLock(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir)
	_, err := Open(dir)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	t.Log(err)
	j.Close()
	open(t, dir).Close()
}

// TestCompaction keeps live intents, each container's last Completed
// intent and the newest history, and the result replays the same.
func TestCompaction(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, WithCompactAt(4<<10), WithHistory(5))
	var seq uint64
	for round := 0; round < 30; round++ {
		for _, c := range []string{"c1", "c2", "c3"} {
			seq++
			id := fmt.Sprintf("%s-%d", c, round)
			end := intent.Completed
			if round%3 == 1 {
				end = intent.Failed
			}
			mustAppend(t, j, rec(seq, id, c, intent.Proposed), rec(seq, id, c, intent.InProgress), rec(seq, id, c, end))
		}
	}
	mustAppend(t, j, rec(seq+1, "live", "c1", intent.Proposed), rec(seq+2, "deferred", "c2", intent.Deferred))
	st := j.Stats()
	if st.Compactions == 0 || st.CompactErr != nil {
		t.Fatalf("stats %+v: no compaction", st)
	}
	// One more batch lands after the last compaction, then replay.
	mustAppend(t, j, rec(seq+3, "after", "c3", intent.Proposed))
	j.Close()
	if _, err := os.Stat(filepath.Join(dir, tmpName)); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	j = open(t, dir)
	defer j.Close()
	got := map[string]intent.State{}
	for _, r := range j.Records() {
		got[r.Intent.ID] = r.Intent.Status.State
	}
	for id, s := range map[string]intent.State{"live": intent.Proposed, "deferred": intent.Deferred, "after": intent.Proposed,
		"c1-29": intent.Completed, "c2-29": intent.Completed, "c3-29": intent.Completed} {
		if got[id] != s {
			t.Errorf("%s is %q after compaction, want %s", id, got[id], s)
		}
	}
	if len(got) > 3+3+5+40 { // live, last completed, history, and what came since
		t.Errorf("%d intents after compaction", len(got))
	}
	t.Logf("stats %+v, %d intents replayed", st, len(got))
}

// TestCompactionKeepsLastCompletedPerContainer: a container whose last
// Completed intent is older than the history keeps it.
func TestCompactionKeepsLastCompletedPerContainer(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, WithCompactAt(2<<10), WithHistory(1))
	mustAppend(t, j, rec(1, "old", "quiet", intent.Completed))
	for i := uint64(2); i < 40; i++ {
		mustAppend(t, j, rec(i, fmt.Sprint("f", i), "busy", intent.Failed))
	}
	j.Close()
	// With the history it was written with: replay keeps what compaction
	// would, whatever the last compaction's place in the file.
	j = open(t, dir, WithHistory(1))
	defer j.Close()
	if got := states(j.Records()); got != "1:old:Completed 39:f39:Failed " {
		t.Errorf("replayed %q", got)
	}
}

// TestConcurrentAppendsKeepOrder: each goroutine's records of one intent
// land in the order appended.
func TestConcurrentAppendsKeepOrder(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, WithCompactAt(16<<10))
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				seq := uint64(g*100 + i + 1)
				id := fmt.Sprint(seq)
				if err := j.Wait(j.Append(rec(seq, id, "c", intent.Proposed))); err != nil {
					t.Error(err)
				}
				j.Append(rec(seq, id, "c", intent.InProgress))
				j.Append(rec(seq, id, "c", intent.Failed))
			}
		}()
	}
	wg.Wait()
	st := j.Stats()
	j.Close()
	j = open(t, dir)
	defer j.Close()
	rs := j.Records()
	if len(rs) != 320 && st.Compactions == 0 {
		t.Errorf("%d intents replayed, want 320", len(rs))
	}
	for _, r := range rs {
		if r.Intent.Status.State != intent.Failed {
			t.Fatalf("intent %s replayed as %s", r.Intent.ID, r.Intent.Status.State)
		}
	}
	t.Logf("%d intents, stats %+v", len(rs), st)
}

// TestWriteFailureIsSticky: once a write fails, that record and every
// later one fail, and the journal says why.
func TestWriteFailureIsSticky(t *testing.T) {
	dir := t.TempDir()
	var observed atomic.Int64
	j := open(t, dir, WithSyncObserver(func(time.Duration) { observed.Add(1) }))
	defer j.Close()
	mustAppend(t, j, rec(1, "a", "c", intent.Proposed))
	// Swap the file for one opened read-only, under the writer's feet.
	j.mu.Lock()
	ro, err := os.Open(j.path)
	if err != nil {
		t.Fatal(err)
	}
	j.f.Close()
	j.f = osFile{ro}
	j.mu.Unlock()
	if err := j.Wait(j.Append(rec(2, "b", "c", intent.Proposed))); err == nil {
		t.Fatal("write to a read-only file succeeded")
	} else {
		t.Log(err)
	}
	if err := j.Wait(j.Append(rec(3, "c", "c", intent.Proposed))); err == nil {
		t.Error("append after a failed write succeeded")
	}
	// The failed batch was timed; only the good one counts as synced.
	if st := j.Stats(); st.Err == nil || st.Syncs != 1 || st.Records != 1 || observed.Load() != 2 {
		t.Errorf("stats %+v, %d batches observed; want the error, 1 sync of 1 record, 2 observed", st, observed.Load())
	}
}

// TestStatsCountBatches: every record is counted once, in batches that
// the observer saw one by one; with many submitters some share a sync.
func TestStatsCountBatches(t *testing.T) {
	var (
		mu    sync.Mutex
		times []time.Duration
	)
	j := open(t, t.TempDir(), WithSyncObserver(func(d time.Duration) {
		mu.Lock()
		times = append(times, d)
		mu.Unlock()
	}))
	mustAppend(t, j, rec(1, "first", "c", intent.Proposed))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				seq := uint64(g*100 + i + 2)
				if err := j.Wait(j.Append(rec(seq, fmt.Sprint(seq), "c", intent.Proposed))); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	st := j.Stats()
	j.Close()
	mu.Lock()
	defer mu.Unlock()
	if st.Records != 201 || st.Syncs == 0 || st.Syncs > st.Records || int(st.Syncs) != len(times) || st.Err != nil {
		t.Fatalf("stats %+v with %d batches observed, want 201 records in at most 201 syncs, each observed", st, len(times))
	}
	for _, d := range times {
		if d <= 0 {
			t.Fatalf("a batch observed as taking %v", d)
		}
	}
	t.Logf("%d records in %d syncs", st.Records, st.Syncs)
}

// BenchmarkAppend is one submitter: each record written and synced before
// the next (the cost of one fdatasync).
func BenchmarkAppend(b *testing.B) {
	j := open(b, b.TempDir(), WithCompactAt(1<<40))
	defer j.Close()
	r := rec(1, "20260102-030405-0123456789abcdef", "pod:0a1b2c3d-uid/web", intent.Proposed)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Seq = uint64(i + 1)
		if err := j.Wait(j.Append(r)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendParallel is many submitters at once: group commit lets
// them share syncs.
func BenchmarkAppendParallel(b *testing.B) {
	j := open(b, b.TempDir(), WithCompactAt(1<<40))
	defer j.Close()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rec(1, "20260102-030405-0123456789abcdef", "pod:0a1b2c3d-uid/web", intent.Proposed)
		for pb.Next() {
			if err := j.Wait(j.Append(r)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestCrashMidCompaction: a compaction cut short leaves a temporary file
// that was never renamed; Open drops it and keeps the journal as it was.
func TestCrashMidCompaction(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir)
	mustAppend(t, j, rec(1, "a", "c1", intent.Proposed))
	j.Close()
	half, _ := encode(rec(9, "z", "c9", intent.Proposed))
	if err := os.WriteFile(filepath.Join(dir, tmpName), half[:len(half)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	j = open(t, dir)
	defer j.Close()
	if got := states(j.Records()); got != "1:a:Proposed " {
		t.Errorf("replayed %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, tmpName)); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
}

// TestCompactAfterOpen: a file past the threshold at Open is compacted at
// the first write.
func TestCompactAfterOpen(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, WithCompactAt(1<<40))
	for i := uint64(1); i <= 50; i++ {
		mustAppend(t, j, rec(i, fmt.Sprint(i), "c", intent.Proposed), rec(i, fmt.Sprint(i), "c", intent.Failed))
	}
	j.Close()
	j = open(t, dir, WithCompactAt(1<<10), WithHistory(3))
	defer j.Close()
	mustAppend(t, j, rec(51, "51", "c", intent.Proposed))
	if st := j.Stats(); st.Compactions != 1 || st.Intents != 4 {
		t.Errorf("stats %+v, want 1 compaction and 4 intents", st)
	}
}

// restored is what recovery (agent.Recover) gives resources back to: each
// container's last Completed intent, unless a Forget marker came after it.
func restored(rs []Record) map[string]string {
	last := map[string]string{}
	for _, r := range rs {
		switch {
		case r.Forget():
			delete(last, r.Container)
		case r.Intent.Status.State == intent.Completed && r.Resources != nil:
			last[r.Container] = r.Intent.ID
		}
	}
	return last
}

// TestCompactionKeepsForget (issue 15, finding 4): a forgotten container
// whose last Completed intent compaction keeps as history stays forgotten
// after a restart; one completed again after the marker is managed.
func TestCompactionKeepsForget(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, WithCompactAt(2<<10), WithHistory(100))
	mustAppend(t, j, rec(1, "gone", "forgotten", intent.Completed), ForgetRecord(2, "forgotten"),
		rec(3, "back-old", "back", intent.Completed), ForgetRecord(4, "back"), rec(5, "back-new", "back", intent.Completed))
	for i := uint64(6); i < 40; i++ {
		mustAppend(t, j, rec(i, fmt.Sprint("f", i), "busy", intent.Failed))
	}
	st := j.Stats()
	j.Close()
	if st.Compactions == 0 {
		t.Fatalf("stats %+v: no compaction", st)
	}
	j = open(t, dir)
	defer j.Close()
	rs := j.Records()
	if got, want := fmt.Sprint(restored(rs)), "map[back:back-new]"; got != want {
		t.Errorf("recovery would restore %s, want %s; replayed %s", got, want, states(rs))
	}
	for _, r := range rs {
		if r.Forget() && r.Container == "back" {
			t.Errorf("compaction kept the moot marker of a container completed again: %s", states(rs))
		}
	}
}

// faulty is a journal file on a disk that fills up at limit bytes (a
// write past it writes what fits, then fails with ENOSPC, as write(2)
// does) or whose next sync fails with syncErr (once: Linux reports a
// writeback error to one fsync). Its first write waits for gate; the
// faults apply from the second.
type faulty struct {
	file
	size, limit int64
	syncErr     error
	gate        chan struct{}
	writes      int
	noTruncate  atomic.Bool // Truncate fails with EIO while set
}

func (f *faulty) Write(b []byte) (int, error) {
	if f.gate != nil {
		<-f.gate
		f.gate = nil
	}
	f.writes++
	if room := f.limit - f.size; f.writes > 1 && int64(len(b)) > room {
		n, _ := f.file.Write(b[:max(room, 0)])
		f.size += int64(n)
		return n, unix.ENOSPC
	}
	n, err := f.file.Write(b)
	f.size += int64(n)
	return n, err
}

func (f *faulty) Truncate(n int64) error {
	if f.noTruncate.Load() {
		return unix.EIO
	}
	if err := f.file.Truncate(n); err != nil {
		return err
	}
	f.size = n
	return nil
}

func (f *faulty) Datasync() error {
	if err := f.syncErr; err != nil && f.writes > 1 {
		f.syncErr = nil
		return err
	}
	return f.file.Datasync()
}

// TestFailedBatchLeavesNoTrace (issue 15, finding 2): a batch that fails
// (the disk full in the middle of it, or its sync failing) is refused to
// every submitter, cut off the file, and not replayed; the journal refuses
// everything after, until reopened.
func TestFailedBatchLeavesNoTrace(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(f *faulty)
	}{
		{"disk full", func(f *faulty) { f.limit = f.size + 600 }}, // the first record of the batch fits
		{"sync EIO", func(f *faulty) { f.syncErr = unix.EIO }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			j := open(t, dir)
			mustAppend(t, j, rec(1, "old", "c", intent.Completed))
			j.Close()
			var ff *faulty
			gate := make(chan struct{})
			j = open(t, dir, withFile(func(f *os.File) file {
				st, _ := f.Stat()
				ff = &faulty{file: osFile{f}, size: st.Size(), limit: 1 << 40, gate: gate}
				return ff
			}))
			// The first batch waits at the write while 40 more records
			// queue behind it: the next batch holds all 40.
			first := j.Append(rec(2, "first", "c", intent.Proposed))
			for j.queuedLen() != 0 {
				time.Sleep(time.Millisecond)
			}
			var tickets []Ticket
			for i := range 40 {
				tickets = append(tickets, j.Append(rec(uint64(3+i), fmt.Sprint("refused-", i), "c", intent.Proposed)))
			}
			j.mu.Lock()
			tc.f(ff)
			j.mu.Unlock()
			close(gate)
			if err := j.Wait(first); err != nil {
				t.Fatalf("the batch before the failure: %v", err)
			}
			refused := 0
			for _, tk := range tickets {
				if err := j.Wait(tk); err != nil {
					refused++
				}
			}
			if refused != 40 {
				t.Fatalf("%d of 40 refused", refused)
			}
			t.Log(j.Err())
			if j.Err() == nil || j.Stats().Err == nil {
				t.Error("the journal does not say it is broken")
			}
			// Out of service, even once the disk has room again.
			j.mu.Lock()
			ff.limit = 1 << 40
			j.mu.Unlock()
			if err := j.Wait(j.Append(rec(100, "later", "c", intent.Proposed))); err == nil {
				t.Error("a broken journal took a record")
			}
			j.Close()
			j = open(t, dir)
			defer j.Close()
			if got, want := states(j.Records()), "1:old:Completed 2:first:Proposed "; got != want {
				t.Errorf("replayed %q after the failure, want %q", got, want)
			}
		})
	}
}

// queuedLen is how many records wait for the writer.
func (j *Journal) queuedLen() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.queued)
}

// TestUncertainBatchNotRefused: a batch whose sync fails (EIO) and that
// cannot be cut off either may be on disk. Its submitter is not told it
// was refused until the batch is cut off: found by the crash test, where
// with the disk failing an intent refused with 503 was replayed after the
// next mount and applied. The records queued behind it, never written,
// are refused at once.
func TestUncertainBatchNotRefused(t *testing.T) {
	dir := t.TempDir()
	var ff *faulty
	gate := make(chan struct{})
	j := open(t, dir, withFile(func(f *os.File) file {
		st, _ := f.Stat()
		ff = &faulty{file: osFile{f}, size: st.Size(), limit: 1 << 40, gate: gate}
		return ff
	}))
	defer func() { j.Close() }()
	mustAppendFirst := j.Append(rec(1, "first", "c", intent.Proposed))
	for j.queuedLen() != 0 {
		time.Sleep(time.Millisecond)
	}
	uncertain := j.Append(rec(2, "uncertain", "c", intent.Proposed))
	ff.syncErr = unix.EIO // the writer waits at the gate: no race
	ff.noTruncate.Store(true)
	close(gate)
	if err := j.Wait(mustAppendFirst); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- j.Wait(uncertain) }()
	for j.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	// Never written: refused at once.
	if err := j.Wait(j.Append(rec(3, "after", "c", intent.Proposed))); err == nil {
		t.Fatal("a broken journal took a record")
	}
	select {
	case err := <-answered:
		t.Fatalf("the submitter of a batch that may be on disk was answered (%v) before it was cut off", err)
	case <-time.After(300 * time.Millisecond):
	}
	ff.noTruncate.Store(false) // the disk is back: the retried cut succeeds
	select {
	case err := <-answered:
		if err == nil {
			t.Fatal("the failed batch was acknowledged")
		}
		t.Log(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the failed batch's submitter was not answered once it was cut off")
	}
	j.Close()
	j = open(t, dir)
	if got, want := states(j.Records()), "1:first:Proposed "; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
}
