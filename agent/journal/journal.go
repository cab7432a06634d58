package journal

import (
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
	// A copy of a file in which Open found bad lines is kept aside as
	// FileName + CorruptSuffix + a UTC time.
	CorruptSuffix = ".corrupt-"
)

// Version is the format this agent writes: the first line of a file is a
// header that says it. A file without a header (written before there was
// one) is version 1; a file of a newer version is refused with ErrVersion.
const Version = 1

// maxLine bounds a record: a longer line is refused by Append and is a bad
// line to Open, which never holds more than this of one line in memory.
const maxLine = 1 << 20

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
	// Quarantined counts the bad lines Open set aside (see Quarantine).
	Quarantined int
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
	ReadAt(b []byte, off int64) (int, error)
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
	dir, path  string
	history    int
	compactAt  int64
	observe    func(time.Duration)
	wrap       func(*os.File) file
	lock       *os.File
	records    []Record // as replayed by Open
	quarantine Quarantine

	mu      sync.Mutex
	work    *sync.Cond // the writer waits for records
	flushed *sync.Cond // Wait waits for the writer
	queue   []byte     // lines not yet written
	queued  []entry
	batch   uint64 // the batch being queued
	durable uint64 // every batch up to this one is on disk
	err     error  // sticky: every batch from failedAt on failed
	// uncertain is the batch that failed and could not be cut off: it may
	// be on disk, so its submitters are not told it was refused until it
	// is cut off (see recut).
	uncertain uint64
	closing   bool
	stats     Stats
	done      chan struct{}
	stop      chan struct{} // closed by Close

	// The writer's own.
	f     file
	size  int64
	cutTo int64 // a failed batch's cut that failed too, else -1
	base  int64 // size after the last compaction
	index map[string]entry
}

// entry is the last line of one intent: where it is in the file, and
// what compaction needs to know of it. Open keeps no more than this of a
// record it does not return (issue 15, finding 8).
type entry struct {
	id, key string
	seq     uint64
	state   intent.State
	off     int64
	n       int    // the line's length, newline included
	line    []byte // while queued
}

// Open locks dir (creating it), replays its journal, cutting off a torn
// tail, and starts the writer. Records returns what it replayed.
func Open(dir string, opts ...Option) (*Journal, error) {
	j := &Journal{dir: dir, path: filepath.Join(dir, FileName), history: 10000, compactAt: 1 << 20,
		index: map[string]entry{}, batch: 1, cutTo: -1, done: make(chan struct{}), stop: make(chan struct{}),
		wrap: func(f *os.File) file { return osFile{f} }}
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

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encode makes r's line (frame), its JSON written by appendRecord into
// the line's own buffer.
func encode(r Record) ([]byte, error) {
	line := make([]byte, 9, 512)
	line, err := appendRecord(line, &r)
	if err != nil {
		return nil, fmt.Errorf("journal: encoding intent %s: %w", r.Intent.ID, err)
	}
	js := line[9:]
	if len(js)+10 > maxLine {
		return nil, fmt.Errorf("journal: intent %s is %d bytes, more than a record may hold (%d)", r.Intent.ID, len(js), maxLine)
	}
	const hex = "0123456789abcdef"
	sum := crc32.Checksum(js, castagnoli)
	for i := 7; i >= 0; i-- {
		line[i] = hex[sum&0xf]
		sum >>= 4
	}
	line[8] = ' '
	return append(line, '\n'), nil
}

// frame makes a line of js: its CRC-32C in hex, a space, js, a newline.
func frame(js []byte) []byte {
	line := make([]byte, 0, 9+len(js)+1)
	line = fmt.Appendf(line, "%08x ", crc32.Checksum(js, castagnoli))
	line = append(line, js...)
	return append(line, '\n')
}

// checked returns the JSON of a line, newline included, if its checksum
// holds; why says what was wrong.
func checked(line []byte) (js []byte, why string, err error) {
	if len(line) < 11 || line[8] != ' ' || line[len(line)-1] != '\n' {
		return nil, "not a record", errors.New("no checksum")
	}
	var sum [4]byte
	if _, err := hex.Decode(sum[:], line[:8]); err != nil {
		return nil, "bad checksum field", err
	}
	js = line[9 : len(line)-1]
	if got, want := crc32.Checksum(js, castagnoli), uint32(sum[0])<<24|uint32(sum[1])<<16|uint32(sum[2])<<8|uint32(sum[3]); got != want {
		return nil, "checksum mismatch", fmt.Errorf("crc32c %08x, the line says %08x", got, want)
	}
	return js, "", nil
}

// decode parses one record line, newline included; why says what was
// wrong.
func decode(line []byte, r *Record) (why string, err error) {
	js, why, err := checked(line)
	if err != nil {
		return why, err
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
// acceptance order, and lets go of them: the caller is the one who keeps
// them (a full history kept here too held a second copy of every intent,
// about a fifth of the heap under issue 15's load). A second call returns
// nothing.
func (j *Journal) Records() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	rs := j.records
	j.records = nil
	return rs
}

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
	for j.durable < t.batch && (j.err == nil || t.batch == j.uncertain) {
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

// Quarantine returns the bad lines Open set aside, and where it kept a
// copy of the file as it was.
func (j *Journal) Quarantine() Quarantine {
	q := j.quarantine
	q.Lines = slices.Clone(q.Lines)
	return q
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
	close(j.stop)
	j.work.Signal()
	j.mu.Unlock()
	<-j.done
	j.mu.Lock()
	err := j.err
	j.mu.Unlock()
	if j.cutTo >= 0 {
		err = j.cut(j.cutTo, err)
		j.settle()
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
			if j.cutTo >= 0 {
				j.uncertain = batch
			}
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
		if j.cutTo >= 0 {
			j.recut()
		}
	}
}

// recut tries again to cut off a batch that failed, until it succeeds or
// the journal closes. Until then the batch may be on disk and be replayed
// at the next start, so its submitters wait: a client that gives up does
// not know, as after a crash, but none is told its intent was refused
// when it may be applied. (Issue 15: with the disk failing, fdatasync
// returned EIO for a batch whose pages had been written, the truncation
// failed too, and after the next mount an intent refused with 503 was
// replayed and applied.) The batches after it were never written: they
// are refused at once.
func (j *Journal) recut() {
	for wait := 50 * time.Millisecond; j.cutTo >= 0; wait = min(2*wait, 2*time.Second) {
		select {
		case <-j.stop:
			return // Close tries once more
		case <-time.After(wait):
		}
		if j.cut(j.cutTo, nil) == nil {
			j.settle()
		}
	}
}

// settle releases the submitters of an uncertain batch once it is cut off.
func (j *Journal) settle() {
	if j.cutTo >= 0 {
		return
	}
	j.mu.Lock()
	j.uncertain = 0
	j.flushed.Broadcast()
	j.mu.Unlock()
}

// write appends one batch and syncs it. A batch that fails is cut off
// again: its submitters are refused, so none of its records may be found
// by a later replay (issue 15, finding 2: on a full disk, the complete
// lines of a batch cut short by ENOSPC were replayed and applied).
func (j *Journal) write(buf []byte, ents []entry) error {
	before := j.size
	off := before
	if before == 0 {
		hdr := headerLine()
		buf = append(hdr, buf...)
		off += int64(len(hdr))
	}
	n, err := j.f.Write(buf)
	j.size += int64(n)
	if err != nil && n == 0 {
		return fmt.Errorf("journal: write: %w", err) // nothing to cut off
	}
	if err != nil {
		return j.cut(before, fmt.Errorf("journal: write: %w", err))
	}
	if err := j.f.Datasync(); err != nil {
		// What reached the page cache may reach the disk later: cut it.
		return j.cut(before, fmt.Errorf("journal: sync: %w", err))
	}
	for _, e := range ents {
		e.off, e.n, e.line = off, len(e.line), nil
		off += int64(e.n)
		j.index[e.id] = e
	}
	return nil
}

// cut truncates the file back to size, on disk, after the failure why
// (nil: a retry, which returns nil once cut). Until it succeeds (the writer
// and Close try again) the failed batch may be on disk.
func (j *Journal) cut(size int64, why error) error {
	j.cutTo = size
	err := j.f.Truncate(size)
	if err == nil {
		err = j.f.Datasync()
	}
	if err != nil {
		if why == nil {
			return err
		}
		return fmt.Errorf("%w; cutting the failed batch off failed too: %w", why, err)
	}
	j.size, j.cutTo = size, -1
	_, _ = j.f.Seek(size, io.SeekStart) // nothing is written after a failure; for tidiness
	if why == nil {
		return nil
	}
	return fmt.Errorf("%w (the batch was cut off)", why)
}
