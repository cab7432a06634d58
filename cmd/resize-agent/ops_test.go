package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
