package agenttest

import (
	"sync"

	"github.com/resizer/resize-agent/agent/pressure"
)

// WriteMarks stands for the kernel's limit-write hook (pressure.BPF's
// LimitWriteMark) in the drift checks' tests: Write moves a cgroup's mark
// as a write the hook sees would; a path without a mark is one the hook
// cannot name.
type WriteMarks struct {
	mu    sync.Mutex
	marks map[string]pressure.WriteMark
	any   uint64 // Writes so far: the hook's last write to any cgroup
}

// NewWriteMarks gives each path a mark of its own, with no write seen.
func NewWriteMarks(paths ...string) *WriteMarks {
	w := &WriteMarks{marks: map[string]pressure.WriteMark{}}
	for i, p := range paths {
		w.marks[p] = pressure.WriteMark{Cgroup: uint64(i + 1)}
	}
	return w
}

// LimitWriteMark is the path's mark.
func (w *WriteMarks) LimitWriteMark(p string) (pressure.WriteMark, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.marks[p]
	return m, ok
}

// Write records a write to the path's limit files.
func (w *WriteMarks) Write(p string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.marks[p]
	m.Stamp++
	w.marks[p] = m
	w.any++
}

// AnyLimitWriteStamp moves with every Write, as the hook's stamp of the
// last write to any cgroup does.
func (w *WriteMarks) AnyLimitWriteStamp() (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.any, true
}
