package journal

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/resizer/resize-agent/agent/intent"
)

// File names in the state directory.
const (
	FileName = "intents.jsonl"
	lockName = "lock"
	tmpName  = FileName + ".tmp"
)

// Record is the whole of one intent at one moment. The last record of an
// intent in the file is its state.
type Record struct {
	// Seq is the agent's acceptance order of the intent.
	Seq uint64 `json:"seq"`
	// Container is the agent's key of the intent's container.
	Container string        `json:"container"`
	Intent    intent.Intent `json:"intent"`
	// Resources is, on a Completed intent, what its container was left with.
	Resources *Resources `json:"resources,omitempty"`
	// Restarting is the runtime container the intent began to restart (its
	// resizePolicy is RestartContainer), on disk before the restart began:
	// after a crash, a container whose ID differs was restarted already.
	Restarting string `json:"restarting,omitempty"`
}

// Forgotten marks a record that says the agent stopped managing a
// container (Forget, or it exited): its last Completed intent must then not
// give it its resources back after a restart. Compaction keeps a marker
// as long as the file keeps a Completed intent of its container from
// before it.
const Forgotten intent.State = "Forgotten"

// ForgetRecord is the marker for the container key, at seq (after every
// intent of the container).
func ForgetRecord(seq uint64, key string) Record {
	return Record{Seq: seq, Container: key, Intent: intent.Intent{ID: "forget:" + key, Status: intent.Status{State: Forgotten}}}
}

// Forget reports whether r is a ForgetRecord.
func (r Record) Forget() bool { return r.Intent.Status.State == Forgotten }

// Resources is what a container was given, and which resources intents
// have declared (the agent writes only those).
type Resources struct {
	intent.Resources
	CPU    bool `json:"cpu"`
	Memory bool `json:"memory"`
}

// Ticket is a record's place in the file, for Wait.
type Ticket struct {
	batch uint64
	err   error
}

// Stats describe the journal.
type Stats struct {
	Size        int64 // bytes in the file
	Intents     int   // intents it holds
	Compactions int
	// CompactErr is the last compaction's failure; the journal goes on
	// appending to the uncompacted file.
	CompactErr error
	// Syncs counts the batches written and synced, Records the records in
	// them: Records/Syncs is how many submitters shared an fdatasync.
	Syncs, Records uint64
	// Err is the write error that broke the journal (see Err).
	Err error
}

// Option configures a Journal.
type Option func(*Journal)

// WithHistory sets how many terminal intents compaction keeps besides
// each container's last Completed one (default 10000, the agent's history).
func WithHistory(n int) Option { return func(j *Journal) { j.history = n } }

// WithCompactAt sets the size from which the file is compacted (default
// 1 MiB): at the first write after Open if it is that large already, then
// whenever it has doubled since the last compaction.
func WithCompactAt(bytes int64) Option { return func(j *Journal) { j.compactAt = bytes } }

// WithSyncObserver has f called, from the writer, with the time each batch
// took to write and fdatasync, failed ones included: that time is what
// every submitter of the batch waited before its intent was acknowledged.
// f must not block.
func WithSyncObserver(f func(time.Duration)) Option { return func(j *Journal) { j.observe = f } }

// file is what the writer needs of the journal's file; tests wrap it to
// fail as a full disk or a bad sector does.
type file interface {
	Write(b []byte) (int, error)
	Truncate(size int64) error
	Seek(offset int64, whence int) (int64, error)
	Datasync() error
	Close() error
}

type osFile struct{ *os.File }

func (f osFile) Datasync() error { return unix.Fdatasync(int(f.Fd())) }

// withFile has every journal file the writer opens go through wrap.
func withFile(wrap func(*os.File) file) Option { return func(j *Journal) { j.wrap = wrap } }

// Journal is safe for concurrent use.
type Journal struct {
	dir, path string
	history   int
	compactAt int64
	observe   func(time.Duration)
	wrap      func(*os.File) file
	lock      *os.File
	records   []Record // as replayed by Open

	mu      sync.Mutex
	work    *sync.Cond // the writer waits for records
	flushed *sync.Cond // Wait waits for the writer
	queue   []byte     // lines not yet written
	queued  []entry
	batch   uint64 // the batch being queued
	durable uint64 // every batch up to this one is on disk
	err     error  // sticky: every batch from failedAt on failed
	closing bool
	stats   Stats
	done    chan struct{}

	// The writer's own.
	f     file
	size  int64
	cutTo int64 // a failed batch's cut that failed too, else -1
	base  int64 // size after the last compaction
	index map[string]entry
}

// entry is the last line of one intent.
type entry struct {
	id, key string
	seq     uint64
	state   intent.State
	line    []byte
}

// Open locks dir (creating it), replays its journal, cutting off a torn
// tail, and starts the writer. Records returns what it replayed.
func Open(dir string, opts ...Option) (*Journal, error) {
	j := &Journal{dir: dir, path: filepath.Join(dir, FileName), history: 10000, compactAt: 1 << 20,
		index: map[string]entry{}, batch: 1, cutTo: -1, done: make(chan struct{}), wrap: func(f *os.File) file { return osFile{f} }}
	for _, o := range opts {
		o(j)
	}
	j.work, j.flushed = sync.NewCond(&j.mu), sync.NewCond(&j.mu)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	j.lock = lock
	if err := j.replay(); err != nil {
		lock.Close()
		return nil, err
	}
	go j.writer()
	return j, nil
}

func lockDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, lockName)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(p)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked by another agent (pid %s)", ErrLocked, dir, strings.TrimSpace(string(owner)))
		}
		return nil, fmt.Errorf("state directory lock %s: %w", p, err)
	}
	// The pid is only for the message above; the flock is the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// replay reads the file into the index and records, and opens it for
// appending.
func (j *Journal) replay() error {
	// A temporary file is a compaction that did not reach its rename.
	if err := os.Remove(filepath.Join(j.dir, tmpName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("journal: %w", err)
	}
	data, err := os.ReadFile(j.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("journal: %w", err)
	}
	good, err := j.load(data)
	if err != nil {
		return err
	}
	osf, err := os.OpenFile(j.path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	f := j.wrap(osf)
	if good < int64(len(data)) {
		if err := f.Truncate(good); err != nil {
			f.Close()
			return fmt.Errorf("journal: cutting off the torn tail: %w", err)
		}
	}
	if _, err := f.Seek(good, 0); err != nil {
		f.Close()
		return fmt.Errorf("journal: %w", err)
	}
	if err := f.Datasync(); err != nil {
		f.Close()
		return fmt.Errorf("journal: sync: %w", err)
	}
	if err := syncDir(j.dir); err != nil {
		f.Close()
		return err
	}
	// base 0: a file already past the threshold is compacted at the first
	// write, since much of what a restart replays is dead.
	j.f, j.size = f, good
	last := map[string]Record{}
	for id, e := range j.index {
		var r Record
		_, _ = decode(e.line, &r) // decoded once already
		last[id] = r
	}
	for _, r := range last {
		j.records = append(j.records, r)
	}
	slices.SortFunc(j.records, func(a, b Record) int { return cmpSeq(a.Seq, b.Seq) })
	j.stats.Size, j.stats.Intents = good, len(j.index)
	return nil
}

// load indexes the lines of data and returns the length of its good part.
func (j *Journal) load(data []byte) (int64, error) {
	off, n := 0, 0
	badAt, badLine, badWhy := -1, 0, ""
	for off < len(data) {
		n++
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			// A write cut short: never a complete line.
			if badAt < 0 {
				badAt = off
			}
			break
		}
		line := data[off : off+end+1]
		var r Record
		why, err := decode(line, &r)
		if err != nil {
			if badAt < 0 {
				badAt, badLine, badWhy = off, n, why+": "+err.Error()
			}
			off += end + 1
			continue
		}
		if badAt >= 0 {
			return 0, fmt.Errorf("%w: %s line %d (byte %d): %s, with good records after it; move the file aside to start with an empty journal",
				ErrCorrupt, j.path, badLine, badAt, badWhy)
		}
		j.index[r.Intent.ID] = entry{id: r.Intent.ID, key: r.Container, seq: r.Seq, state: r.Intent.Status.State, line: line}
		off += end + 1
	}
	if badAt >= 0 {
		return int64(badAt), nil
	}
	return int64(len(data)), nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encode(r Record) ([]byte, error) {
	js, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("journal: encoding intent %s: %w", r.Intent.ID, err)
	}
	line := make([]byte, 0, 9+len(js)+1)
	line = fmt.Appendf(line, "%08x ", crc32.Checksum(js, castagnoli))
	line = append(line, js...)
	return append(line, '\n'), nil
}

// decode parses one line, newline included; why says what was wrong.
func decode(line []byte, r *Record) (why string, err error) {
	if len(line) < 11 || line[8] != ' ' {
		return "not a record", errors.New("no checksum")
	}
	var sum [4]byte
	if _, err := hex.Decode(sum[:], line[:8]); err != nil {
		return "bad checksum field", err
	}
	js := line[9 : len(line)-1]
	if got, want := crc32.Checksum(js, castagnoli), uint32(sum[0])<<24|uint32(sum[1])<<16|uint32(sum[2])<<8|uint32(sum[3]); got != want {
		return "checksum mismatch", fmt.Errorf("crc32c %08x, the line says %08x", got, want)
	}
	if err := json.Unmarshal(js, r); err != nil {
		return "bad JSON", err
	}
	if r.Intent.ID == "" || r.Seq == 0 {
		return "incomplete record", errors.New("no intent ID or sequence number")
	}
	return "", nil
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("journal: sync of %s: %w", dir, err)
	}
	return nil
}

// Records returns the intents Open replayed, the last record of each, in
// acceptance order.
func (j *Journal) Records() []Record { return slices.Clone(j.records) }

// Append queues r behind every record appended before it. Wait on the
// ticket to know that it is on disk.
func (j *Journal) Append(r Record) Ticket {
	line, err := encode(r)
	if err != nil {
		return Ticket{err: err}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.err != nil:
		return Ticket{err: j.err}
	case j.closing:
		return Ticket{err: ErrClosed}
	}
	j.queue = append(j.queue, line...)
	j.queued = append(j.queued, entry{id: r.Intent.ID, key: r.Container, seq: r.Seq, state: r.Intent.Status.State, line: line})
	j.work.Signal()
	return Ticket{batch: j.batch}
}

// Wait returns when the ticket's record is on disk, or why it never will be.
func (j *Journal) Wait(t Ticket) error {
	if t.err != nil {
		return t.err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < t.batch && j.err == nil {
		j.flushed.Wait()
	}
	if j.durable >= t.batch {
		return nil
	}
	return j.err
}

// Err returns the write error that broke the journal, nil while it works.
// Once broken it refuses every append until reopened.
func (j *Journal) Err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// Stats returns the journal's figures.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stats
}

// Close writes what is queued, stops the writer and releases the state
// directory.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closing {
		j.mu.Unlock()
		<-j.done
		return nil
	}
	j.closing = true
	j.work.Signal()
	j.mu.Unlock()
	<-j.done
	j.mu.Lock()
	err := j.err
	j.mu.Unlock()
	if j.cutTo >= 0 {
		err = j.cut(j.cutTo, err)
	}
	if cerr := j.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("journal: %w", cerr)
	}
	j.lock.Close() // releases the flock
	return err
}

// writer writes the queue in batches, one sync each, until Close.
func (j *Journal) writer() {
	defer close(j.done)
	var spare []byte
	for {
		j.mu.Lock()
		for len(j.queued) == 0 && !j.closing {
			j.work.Wait()
		}
		if len(j.queued) == 0 {
			j.mu.Unlock()
			return
		}
		buf, ents, batch := j.queue, j.queued, j.batch
		j.queue, j.queued = spare[:0], nil
		j.batch++
		failed := j.err != nil
		j.mu.Unlock()

		var err error
		if !failed {
			t0 := time.Now()
			err = j.write(buf, ents)
			if j.observe != nil {
				j.observe(time.Since(t0))
			}
		}
		var compactErr error
		compacted := err == nil && j.size > max(j.compactAt, 2*j.base)
		if compacted {
			compactErr = j.compact()
		}
		spare = buf

		j.mu.Lock()
		switch {
		case failed:
		case err != nil:
			j.err = err
		default:
			j.durable = batch
			j.stats.Syncs++
			j.stats.Records += uint64(len(ents))
		}
		j.stats.Size, j.stats.Intents, j.stats.Err = j.size, len(j.index), j.err
		if compacted {
			j.stats.CompactErr = compactErr
			if compactErr == nil {
				j.stats.Compactions++
			}
		}
		j.flushed.Broadcast()
		j.mu.Unlock()
	}
}

// write appends one batch and syncs it. A batch that fails is cut off
// again: its submitters are refused, so none of its records may be found
// by a later replay (issue 15, finding 2: on a full disk, the complete
// lines of a batch cut short by ENOSPC were replayed and applied).
func (j *Journal) write(buf []byte, ents []entry) error {
	before := j.size
	n, err := j.f.Write(buf)
	j.size += int64(n)
	if err != nil {
		return j.cut(before, fmt.Errorf("journal: write: %w", err))
	}
	if err := j.f.Datasync(); err != nil {
		// What reached the page cache may reach the disk later: cut it.
		return j.cut(before, fmt.Errorf("journal: sync: %w", err))
	}
	for _, e := range ents {
		j.index[e.id] = e
	}
	return nil
}

// cut truncates the file back to size, on disk, after the failure why.
// Until it succeeds (Close tries again) the failed batch may be on disk.
func (j *Journal) cut(size int64, why error) error {
	j.cutTo = size
	err := j.f.Truncate(size)
	if err == nil {
		err = j.f.Datasync()
	}
	if err != nil {
		return fmt.Errorf("%w; cutting the failed batch off failed too: %w", why, err)
	}
	j.size, j.cutTo = size, -1
	_, _ = j.f.Seek(size, io.SeekStart) // nothing is written after a failure; for tidiness
	return fmt.Errorf("%w (the batch was cut off)", why)
}

// compact rewrites the file with what recovery needs (see the package
// doc). On failure before the rename the old file stays in use.
func (j *Journal) compact() error {
	all := make([]entry, 0, len(j.index))
	for _, e := range j.index {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b entry) int { return cmpSeq(a.seq, b.seq) })
	lastCompleted, forgotten := map[string]uint64{}, map[string]uint64{}
	for _, e := range all {
		switch e.state {
		case intent.Completed:
			lastCompleted[e.key] = e.seq
		case Forgotten:
			forgotten[e.key] = e.seq
		}
	}
	history := 0
	keep := make([]bool, len(all))
	for i := len(all) - 1; i >= 0; i-- {
		e := all[i]
		switch {
		case e.state == Forgotten:
			// Decided below, once the Completed intents kept are known.
		case lastCompleted[e.key] == e.seq && e.state == intent.Completed && forgotten[e.key] < e.seq,
			!e.state.Terminal():
			keep[i] = true
		case history < j.history:
			keep[i] = true
			history++
		}
	}
	// A marker stays while the file keeps a Completed intent of its
	// container from before it (as history): without it, replay would give
	// the forgotten container that intent's resources back (issue 15,
	// finding 4). With none, or a later Completed intent, it is moot.
	oldestCompleted := map[string]uint64{}
	for i, e := range all {
		if keep[i] && e.state == intent.Completed {
			if s, ok := oldestCompleted[e.key]; !ok || e.seq < s {
				oldestCompleted[e.key] = e.seq
			}
		}
	}
	for i, e := range all {
		if s, ok := oldestCompleted[e.key]; ok && e.state == Forgotten && s < e.seq && lastCompleted[e.key] < e.seq {
			keep[i] = true
		}
	}
	tmp := filepath.Join(j.dir, tmpName)
	osf, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		j.base = j.size // try again once the file has doubled
		return fmt.Errorf("journal: compaction: %w", err)
	}
	f := j.wrap(osf)
	var size int64
	var buf []byte
	index := make(map[string]entry, len(all))
	for i, e := range all {
		if keep[i] {
			buf = append(buf, e.line...)
			index[e.id] = e
		}
	}
	n, err := f.Write(buf)
	size = int64(n)
	if err == nil {
		err = f.Datasync()
	}
	if err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		j.base = j.size
		return fmt.Errorf("journal: compaction: %w", err)
	}
	// Renamed: the new file is the journal, whatever happens next.
	j.f.Close()
	j.f, j.size, j.base, j.index = f, size, size, index
	return syncDir(j.dir)
}
