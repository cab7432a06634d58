package journal

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
)

// formatName marks the header line.
const formatName = "resize-agent-journal"

// header is the first line of a file: what wrote it.
type header struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

func headerLine() []byte {
	js, _ := json.Marshal(header{Format: formatName, Version: Version})
	return frame(js)
}

// head is what the first pass reads of a line: the header's fields, or
// the record's that say which intent it is and what compaction needs. The
// rest of the record (its spec, resources and status) is decoded only for
// the intents Open returns.
type head struct {
	header
	Seq       uint64 `json:"seq"`
	Container string `json:"container"`
	Intent    struct {
		ID     string `json:"id"`
		Status struct {
			State intent.State `json:"state"`
		} `json:"status"`
	} `json:"intent"`
}

// Bad is a line Open set aside: where it was and what was wrong with it.
type Bad struct {
	Offset int64 // of its first byte
	Line   int   // 1-based
	Why    string
}

// Quarantine is what Open set aside: the bad lines, which were dropped
// from the journal, and the copy of the file as it was before (Copy, a
// path; empty with no bad line).
type Quarantine struct {
	Copy  string
	Lines []Bad
}

// replay reads the file into the index and the records, sets bad lines
// aside, cuts off a torn tail, and opens the file for the writer.
//
// It streams the file twice: once to index the last line of each intent
// (a few dozen bytes each), once to decode the lines of the intents that
// recovery needs (compaction's selection; see keep). Memory is bounded by
// what is returned and the index, not by the file (issue 15, finding 8:
// reading and decoding the whole file took about ten times its size).
func (j *Journal) replay() error {
	// A temporary file is a compaction that did not reach its rename.
	if err := os.Remove(filepath.Join(j.dir, tmpName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("journal: %w", err)
	}
	osf, err := os.OpenFile(j.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			osf.Close()
		}
	}()
	st, err := osf.Stat()
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	good, bad, err := j.scan(osf, st.Size())
	if err != nil {
		return err
	}
	j.trim()
	bad = append(bad, j.decode(osf)...)
	slices.SortFunc(bad, func(a, b Bad) int { return cmpSeq(uint64(a.Offset), uint64(b.Offset)) })

	// Nothing was changed so far: the copy is the file as it was.
	if len(bad) > 0 {
		cp, err := j.copyAside(osf, st.Size())
		if err != nil {
			return err
		}
		j.quarantine = Quarantine{Copy: cp, Lines: bad}
	}
	f := j.wrap(osf)
	if good < st.Size() {
		if err := f.Truncate(good); err != nil {
			return fmt.Errorf("journal: cutting off the torn tail: %w", err)
		}
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := f.Datasync(); err != nil {
		return fmt.Errorf("journal: sync: %w", err)
	}
	if err := syncDir(j.dir); err != nil {
		return err
	}
	ok = true
	// base 0: a file already past the threshold is compacted at the first
	// write, since much of what a restart replays is dead.
	j.f, j.size = f, good
	if len(bad) > 0 {
		// The bad lines leave the file now, so that the next start does
		// not find them again. Should this fail, they stay and are set
		// aside again next time; nothing is lost by that.
		j.stats.CompactErr = j.compact()
		if j.stats.CompactErr == nil {
			j.stats.Compactions++
		}
	}
	j.stats.Size, j.stats.Intents, j.stats.Quarantined = j.size, len(j.index), len(bad)
	return nil
}

// scan indexes the lines of the file and returns the length of its good
// part (what is before a torn tail) and its bad lines with good ones after
// them. A torn tail is what a crash in the middle of a write leaves: an
// unterminated last line, or bad lines with no good line after them.
func (j *Journal) scan(r io.ReaderAt, size int64) (good int64, bad []Bad, err error) {
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10)
	var (
		off     int64
		n       int
		pending []Bad // bad lines not (yet) followed by a good one
		scratch []byte
		keys    = map[string]string{} // one copy of each container key
	)
	for {
		line, length, err := readLine(br, &scratch)
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			break // a write cut short: never a complete line
		}
		if err != nil {
			return 0, nil, fmt.Errorf("journal: reading %s: %w", j.path, err)
		}
		n++
		h, why, err := parseHead(line, length)
		if err != nil {
			pending = append(pending, Bad{Offset: off, Line: n, Why: why + ": " + err.Error()})
			off += length
			continue
		}
		bad, pending = append(bad, pending...), nil
		switch {
		case h.Format != "":
			if h.Format != formatName || h.Version > Version || h.Version < 1 {
				return 0, nil, fmt.Errorf("%w: %s line %d says format %q version %d; this agent reads %s versions 1 to %d",
					ErrVersion, j.path, n, h.Format, h.Version, formatName, Version)
			}
		default:
			key, ok := keys[h.Container]
			if !ok {
				key = h.Container
				keys[key] = key
			}
			id := h.Intent.ID
			if e, ok := j.index[id]; ok {
				id = e.id // the map keeps its key: share it
			}
			j.index[id] = entry{id: id, key: key, seq: h.Seq, state: h.Intent.Status.State, off: off, n: int(length)}
		}
		off += length
		good = off
	}
	return good, bad, nil
}

// parseHead checks a line read by readLine (length bytes in the file,
// line nil when too long) and reads its head.
func parseHead(line []byte, length int64) (h head, why string, err error) {
	if line == nil {
		return h, "line too long", fmt.Errorf("%d bytes, more than a record may hold (%d)", length, maxLine)
	}
	js, why, err := checked(line)
	if err != nil {
		return h, why, err
	}
	if err := json.Unmarshal(js, &h); err != nil {
		return h, "bad JSON", err
	}
	if h.Format == "" && (h.Intent.ID == "" || h.Seq == 0) {
		return h, "incomplete record", errors.New("no intent ID or sequence number")
	}
	return h, "", nil
}

// readLine returns the next line, newline included, and its length in the
// file. A line longer than maxLine is skipped, not held: it comes back nil
// with its length. A last line without a newline is io.ErrUnexpectedEOF.
// The line is valid until the next call.
func readLine(br *bufio.Reader, scratch *[]byte) ([]byte, int64, error) {
	*scratch = (*scratch)[:0]
	var length int64
	long := false
	for {
		frag, err := br.ReadSlice('\n')
		length += int64(len(frag))
		switch {
		case err == nil && length == int64(len(frag)):
			return frag, length, nil // the whole line in the buffer: no copy
		case long, len(*scratch)+len(frag) > maxLine:
			long = true
		default:
			*scratch = append(*scratch, frag...)
		}
		switch {
		case err == nil && long:
			return nil, length, nil
		case err == nil:
			return *scratch, length, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && length == 0:
			return nil, 0, io.EOF
		case errors.Is(err, io.EOF):
			return nil, length, io.ErrUnexpectedEOF
		default:
			return nil, length, err
		}
	}
}

// trim drops from the index what recovery does not need (see keep):
// compaction would drop it too, and nothing written later can make it
// needed again.
func (j *Journal) trim() {
	all := j.sorted()
	for i, k := range keep(all, j.history) {
		if !k {
			delete(j.index, all[i].id)
		}
	}
}

// decode reads the records of the index and returns the lines that do not
// decode (their checksum holds, but not their JSON), which it drops.
func (j *Journal) decode(r io.ReaderAt) []Bad {
	all := j.sorted()
	// In file order, so that the reads go forward.
	slices.SortFunc(all, func(a, b entry) int { return cmpSeq(uint64(a.off), uint64(b.off)) })
	j.records = make([]Record, 0, len(all))
	var bad []Bad
	var buf []byte
	for _, e := range all {
		buf = slices.Grow(buf[:0], e.n)[:e.n]
		var rec Record
		why, err := "", error(nil)
		if _, err = r.ReadAt(buf, e.off); err != nil {
			why = "unreadable"
		} else {
			why, err = decode(buf, &rec)
		}
		if err != nil {
			bad = append(bad, Bad{Offset: e.off, Why: why + ": " + err.Error()})
			delete(j.index, e.id)
			continue
		}
		j.records = append(j.records, rec)
	}
	// Acceptance order. At one sequence number (a Forget marker and a new
	// intent, written by agents before issue 15's finding 3 was fixed) the
	// marker came first.
	slices.SortFunc(j.records, func(a, b Record) int {
		if c := cmpSeq(a.Seq, b.Seq); c != 0 {
			return c
		}
		switch {
		case a.Forget() && !b.Forget():
			return -1
		case b.Forget() && !a.Forget():
			return 1
		}
		return 0
	})
	return bad
}

// keepCopies bounds the copies set aside, so that a disk that keeps
// flipping bits does not fill up with them: the oldest go first.
const keepCopies = 3

// copyAside keeps a copy of the file, as it was, beside it.
func (j *Journal) copyAside(r io.ReaderAt, size int64) (string, error) {
	if old, err := filepath.Glob(j.path + CorruptSuffix + "*"); err == nil && len(old) >= keepCopies {
		slices.Sort(old) // the names end in a UTC time
		for _, p := range old[:len(old)-keepCopies+1] {
			os.Remove(p)
		}
	}
	p := j.path + CorruptSuffix + time.Now().UTC().Format("20060102T150405.000000000Z")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("journal: keeping a copy of a file with bad lines: %w", err)
	}
	_, err = io.Copy(f, io.NewSectionReader(r, 0, size))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(p)
		return "", fmt.Errorf("journal: keeping a copy of a file with bad lines: %w", err)
	}
	return p, nil
}
