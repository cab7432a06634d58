package cgroup_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func nextEvent(t *testing.T, w *cgroup.Watcher, within time.Duration) (cgroup.Event, bool) {
	t.Helper()
	select {
	case e := <-w.Events():
		return e, true
	case <-time.After(within):
		return cgroup.Event{}, false
	}
}

// TestWatcherFake drives the watcher through a fixture's cgroup.events: the
// inotify part is the same as on cgroupfs, only the writer differs.
func TestWatcherFake(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/pod/empty", "/pod/full")
	cgrouptest.SetFile(t, root, "/pod/empty", cgroup.FileEvents, "populated 0\nfrozen 0\n")
	cgrouptest.SetFile(t, root, "/pod/full", cgroup.FileEvents, "populated 1\nfrozen 0\n")
	m := cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck())
	w, err := m.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, p := range []string{"/pod/empty", "/pod/full"} {
		if err := w.Watch(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Watch("/pod/../etc"); err == nil {
		t.Error("Watch accepted a path with ..")
	}
	if err := w.Watch("/pod/missing"); err == nil {
		t.Error("Watch accepted a missing cgroup")
	}

	// A cgroup that was never populated is not reported as emptied.
	cgrouptest.SetFile(t, root, "/pod/empty", cgroup.FileEvents, "populated 0\nfrozen 1\n")
	if e, ok := nextEvent(t, w, 200*time.Millisecond); ok {
		t.Fatalf("event %+v for a cgroup that stayed empty", e)
	}
	cgrouptest.SetFile(t, root, "/pod/full", cgroup.FileEvents, "populated 0\nfrozen 0\n")
	e, ok := nextEvent(t, w, 5*time.Second)
	if !ok || e.Path != "/pod/full" || e.Removed {
		t.Fatalf("after /pod/full emptied: %+v, %v", e, ok)
	}
	// Populated again and emptied again: reported again.
	// (Apart, so that the watcher reads the populated state in between.)
	cgrouptest.SetFile(t, root, "/pod/empty", cgroup.FileEvents, "populated 1\nfrozen 0\n")
	time.Sleep(300 * time.Millisecond)
	cgrouptest.SetFile(t, root, "/pod/empty", cgroup.FileEvents, "populated 0\nfrozen 0\n")
	if e, ok := nextEvent(t, w, 5*time.Second); !ok || e.Path != "/pod/empty" {
		t.Fatalf("after /pod/empty filled and emptied: %+v, %v", e, ok)
	}
	if err := os.Remove(filepath.Join(root, "pod/full", cgroup.FileEvents)); err != nil {
		t.Fatal(err)
	}
	if e, ok := nextEvent(t, w, 5*time.Second); !ok || e.Path != "/pod/full" || !e.Removed {
		t.Fatalf("after /pod/full went: %+v, %v", e, ok)
	}
	w.Unwatch("/pod/empty")
	cgrouptest.SetFile(t, root, "/pod/empty", cgroup.FileEvents, "populated 1\n")
	cgrouptest.SetFile(t, root, "/pod/empty", cgroup.FileEvents, "populated 0\n")
	if e, ok := nextEvent(t, w, 200*time.Millisecond); ok {
		t.Fatalf("event %+v after Unwatch", e)
	}
}

// TestRealKernelWatcher: the kernel reports a container's last process
// exiting, and the cgroup's removal.
func TestRealKernelWatcher(t *testing.T) {
	mnt, parent := cgrouptest.Real(t)
	p := cgrouptest.Child(t, mnt, parent, "ctr")
	cmd := cgrouptest.StartBusy(t, mnt, p)
	m := cgroup.New(cgroup.WithMountpoint(mnt))
	w, err := m.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Watch(p); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	e, ok := nextEvent(t, w, 10*time.Second)
	if !ok || e.Path != p || e.Removed {
		t.Fatalf("after the process exited: %+v, %v", e, ok)
	}
	t.Logf("emptied cgroup reported %v after the kill", time.Since(killed))
	if err := os.Remove(filepath.Join(mnt, p)); err != nil {
		t.Fatal(err)
	}
	// The kernel drops the watch with the cgroup; whether it says so as a
	// delete or only as the watch going away, no emptied event may follow.
	if e, ok := nextEvent(t, w, time.Second); ok && !e.Removed {
		t.Fatalf("after rmdir: %+v", e)
	}
}
