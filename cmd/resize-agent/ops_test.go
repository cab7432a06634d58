package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/journal"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// TestProbesFollowTheJournal (issue 15, finding 2): a journal that failed
// makes the agent not ready and not live (a restart replays what is on
// disk); a working one neither.
func TestProbesFollowTheJournal(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	var broken atomic.Pointer[error]
	mux := http.NewServeMux()
	addOps(mux, prometheus.NewRegistry(), &ready, func() error {
		if e := broken.Load(); e != nil {
			return *e
		}
		return nil
	})
	probe := func(path string) int {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := probe(path); code != http.StatusOK {
			t.Errorf("%s with a working journal: %d", path, code)
		}
	}
	err := errors.New("journal: write: no space left on device (the batch was cut off)")
	broken.Store(&err)
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := probe(path); code != http.StatusServiceUnavailable {
			t.Errorf("%s with a broken journal: %d, want 503", path, code)
		}
	}
}

// TestRunStartsPastABadJournalLine (issue 15, finding 9): a flipped bit in
// the middle of the journal no longer stops the daemon for good: it starts
// with the other records, logs the line with its offset and counts it.
func TestRunStartsPastABadJournalLine(t *testing.T) {
	root := cgrouptest.FakeTree(t, "/kubepods/pod1/web")
	o := DefaultOptions()
	o.StateDir = t.TempDir()
	j, err := journal.Open(o.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 3; i++ {
		id := fmt.Sprint("old-", i)
		r := journal.Record{Seq: i, Container: "/gone", Intent: intent.Intent{ID: id, Spec: intent.Spec{ID: id, Target: intent.Target{Name: "gone", CgroupPath: "/gone"}},
			Status: intent.Status{State: intent.Failed, Reason: intent.ReasonContainerGone}}}
		if err := j.Wait(j.Append(r)); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()
	p := filepath.Join(o.StateDir, journal.FileName)
	data, _ := os.ReadFile(p)
	data[bytes.Index(data, []byte("old-2"))] ^= 1
	os.WriteFile(p, data, 0o600)

	o.CgroupRoot, o.skipFSCheck = root, true
	o.Socket = filepath.Join(t.TempDir(), "agent.sock")
	o.MetricsAddress = "127.0.0.1:0"
	o.CPUAllocatable, o.MemoryAllocatable = "2", "4Gi"
	addr := make(chan string, 1)
	o.onReady = func(a string) { addr <- a }
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, slog.New(slog.NewTextHandler(&logs, nil))) }()
	var metricsAddr string
	select {
	case metricsAddr = <-addr:
	case err := <-done:
		t.Fatalf("run with a bad line in the journal: %v", err)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "resize_agent_journal_quarantined_lines_total 1") {
		t.Errorf("metrics lack the quarantined line")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "bad line set aside") || !strings.Contains(l, "offset=") || !strings.Contains(l, journal.CorruptSuffix) {
		t.Errorf("the bad line was not logged with its offset and the copy:\n%s", l)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
