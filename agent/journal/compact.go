package journal

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/resizer/resize-agent/agent/intent"
)

// sorted returns the index in acceptance order.
func (j *Journal) sorted() []entry {
	all := make([]entry, 0, len(j.index))
	for _, e := range j.index {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b entry) int { return cmpSeq(a.seq, b.seq) })
	return all
}

// keep says which of all (in acceptance order) recovery needs: every
// intent not in a terminal state, each container's last Completed intent
// (its resources) unless a Forget marker came after it, the newest history
// terminal intents, and the Forget markers those make needed.
func keep(all []entry, history int) []bool {
	lastCompleted, forgotten := map[string]uint64{}, map[string]uint64{}
	for _, e := range all {
		switch e.state {
		case intent.Completed:
			lastCompleted[e.key] = e.seq
		case Forgotten:
			forgotten[e.key] = e.seq
		}
	}
	kept := 0
	out := make([]bool, len(all))
	for i := len(all) - 1; i >= 0; i-- {
		e := all[i]
		switch {
		case e.state == Forgotten:
			// Decided below, once the Completed intents kept are known.
		case lastCompleted[e.key] == e.seq && e.state == intent.Completed && forgotten[e.key] < e.seq,
			!e.state.Terminal():
			out[i] = true
		case kept < history:
			out[i] = true
			kept++
		}
	}
	// A marker stays while a Completed intent of its container from before
	// it stays (as history): without it, replay would give the forgotten
	// container that intent's resources back (issue 15, finding 4). With
	// none, or a later Completed intent, it is moot.
	oldestCompleted := map[string]uint64{}
	for i, e := range all {
		if out[i] && e.state == intent.Completed {
			if s, ok := oldestCompleted[e.key]; !ok || e.seq < s {
				oldestCompleted[e.key] = e.seq
			}
		}
	}
	for i, e := range all {
		if s, ok := oldestCompleted[e.key]; ok && e.state == Forgotten && s < e.seq && lastCompleted[e.key] < e.seq {
			out[i] = true
		}
	}
	return out
}

// compact rewrites the file with what recovery needs (see keep), each line
// copied from the old file, behind a header. On failure before the rename
// the old file stays in use.
func (j *Journal) compact() error {
	all := j.sorted()
	kept := keep(all, j.history)
	tmp := filepath.Join(j.dir, tmpName)
	osf, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		j.base = j.size // try again once the file has doubled
		return fmt.Errorf("journal: compaction: %w", err)
	}
	f := j.wrap(osf)
	w := bufio.NewWriterSize(f, 64<<10)
	hdr := headerLine()
	_, err = w.Write(hdr)
	size := int64(len(hdr))
	index := make(map[string]entry, len(all))
	var buf []byte
	for i, e := range all {
		if !kept[i] || err != nil {
			continue
		}
		buf = slices.Grow(buf[:0], e.n)[:e.n]
		if _, err = j.f.ReadAt(buf, e.off); err != nil {
			break
		}
		if _, err = w.Write(buf); err != nil {
			break
		}
		e.off = size
		size += int64(e.n)
		index[e.id] = e
	}
	if err == nil {
		err = w.Flush()
	}
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
