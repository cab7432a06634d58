package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// FileEvents is the file the kernel rewrites, and signals with an inotify
// modify event, when a cgroup gains its first or loses its last process.
const FileEvents = "cgroup.events"

// Event says that a watched cgroup was emptied (its last process exited) or
// removed.
type Event struct {
	Path    string // as given to Watch
	Removed bool   // the cgroup no longer exists
}

// Watcher tells when cgroups become empty: the moment a container exits,
// rather than at the next poll. The kernel signals a change of
// cgroup.events' "populated" line as an inotify modify event; fsnotify does
// the inotify part.
type Watcher struct {
	m      *Manager
	fw     *fsnotify.Watcher
	events chan Event
	errs   chan error

	mu    sync.Mutex
	files map[string]string // cgroup.events on disk -> the cgroup as given
	full  map[string]bool   // populated when last read, by cgroup path
	done  chan struct{}
}

// NewWatcher starts a Watcher. Close it when done.
func (m *Manager) NewWatcher() (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("cgroup watcher: %w", err)
	}
	w := &Watcher{m: m, fw: fw, events: make(chan Event, 256), errs: make(chan error, 16),
		files: map[string]string{}, full: map[string]bool{}, done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// Events delivers an Event when a watched cgroup goes from populated to
// empty, or disappears. It is closed by Close.
func (w *Watcher) Events() <-chan Event { return w.events }

// Errors delivers the errors of the underlying watch (e.g. an inotify queue
// overflow, after which emptied cgroups may go unreported until the next
// resync).
func (w *Watcher) Errors() <-chan error { return w.errs }

// Watch starts watching the cgroup p. A cgroup that is empty already is
// watched too, and reported only once it has been populated and empties.
func (w *Watcher) Watch(p string) error {
	_, d, err := w.m.dir(p)
	if err != nil {
		return err
	}
	f := filepath.Join(d, FileEvents)
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.files[f]; ok {
		return nil
	}
	if err := w.fw.Add(f); err != nil {
		return fmt.Errorf("watch %s: %w", f, err)
	}
	w.files[f] = p
	full, err := populated(f)
	if err != nil {
		_ = w.fw.Remove(f)
		delete(w.files, f)
		return err
	}
	w.full[p] = full
	return nil
}

// Unwatch stops watching the cgroup p; unknown paths are ignored.
func (w *Watcher) Unwatch(p string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for f, q := range w.files {
		if q == p {
			_ = w.fw.Remove(f) // fails if the cgroup went already, which is fine
			delete(w.files, f)
			delete(w.full, p)
		}
	}
}

// Close stops the watcher and closes Events.
func (w *Watcher) Close() error {
	err := w.fw.Close()
	<-w.done
	return err
}

func (w *Watcher) loop() {
	defer close(w.done)
	defer close(w.events)
	for {
		select {
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if e, ok := w.handle(ev); ok {
				w.events <- e
			}
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			select {
			case w.errs <- err:
			default:
			}
		}
	}
}

// handle turns an inotify event into an Event when the cgroup emptied or
// went away.
func (w *Watcher) handle(ev fsnotify.Event) (Event, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.files[ev.Name]
	if !ok {
		return Event{}, false
	}
	if ev.Has(fsnotify.Remove) {
		delete(w.files, ev.Name)
		delete(w.full, p)
		return Event{Path: p, Removed: true}, true
	}
	full, err := populated(ev.Name)
	if errors.Is(err, os.ErrNotExist) {
		delete(w.files, ev.Name)
		delete(w.full, p)
		return Event{Path: p, Removed: true}, true
	}
	if err != nil {
		return Event{}, false
	}
	was := w.full[p]
	w.full[p] = full
	return Event{Path: p}, was && !full
}

// populated reads the "populated" line of a cgroup.events file.
func populated(file string) (bool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return strings.TrimSpace(v) == "1", nil
		}
	}
	return false, fmt.Errorf("%s: no populated line", file)
}
