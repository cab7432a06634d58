package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 64 << 10

// Service is what the API serves; *agent.Agent implements it.
type Service interface {
	Submit(intent.Spec) (intent.Intent, bool, error)
	Get(id string) (intent.Intent, error)
	// ListPage returns up to limit intents accepted after the one numbered
	// after, and the number to continue from (0: no more).
	ListPage(f api.Filter, state intent.State, after uint64, limit int) ([]intent.Intent, uint64)
	Watch(ctx context.Context, f api.Filter) <-chan api.Event
	// Await returns the intent once it has settled (terminal or
	// Deferred), or as it stands when ctx ends.
	Await(ctx context.Context, id string) (intent.Intent, error)
	Containers() []api.ContainerInfo
	Forget(name string) error
	Node() api.NodeInfo
}

// NewHandler returns the /v1 API on a mux; extra handlers (metrics, health)
// can be added to the mux by the caller.
func NewHandler(s Service, opts ...Option) *http.ServeMux {
	cfg := config{maxWatches: DefaultMaxWatches, maxWatchesPerPeer: DefaultMaxWatchesPerPeer}
	for _, o := range opts {
		o(&cfg)
	}
	watches := newWatchLimiter(cfg.maxWatches, cfg.maxWatchesPerPeer)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/intents", func(w http.ResponseWriter, r *http.Request) { submit(s, watches, w, r) })
	mux.HandleFunc("GET /v1/intents", func(w http.ResponseWriter, r *http.Request) { list(s, w, r) })
	mux.HandleFunc("GET /v1/intents/{id}", func(w http.ResponseWriter, r *http.Request) {
		it, err := s.Get(r.PathValue("id"))
		if err != nil {
			fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, it)
	})
	mux.HandleFunc("GET /v1/containers", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Containers())
	})
	mux.HandleFunc("DELETE /v1/containers/{name...}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Forget(r.PathValue("name")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/node", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Node())
	})
	mux.HandleFunc("GET /v1/watch", func(w http.ResponseWriter, r *http.Request) {
		release, err := watches.acquire(watchPeer(r))
		if err != nil {
			writeError(w, http.StatusTooManyRequests, "TooManyWatches", err)
			return
		}
		defer release()
		watch(s, w, r)
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NotFound", fmt.Errorf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func validState(s intent.State) bool {
	switch s {
	case intent.Proposed, intent.InProgress, intent.Completed, intent.Infeasible, intent.Deferred, intent.Failed, intent.Superseded:
		return true
	}
	return false
}

// submit accepts an intent. With ?wait=DURATION the answer waits, after the
// intent is on disk, until it has settled or the duration has passed, and
// carries the intent as it stands then: one request where a client would
// otherwise submit, then watch on a second connection (a third of an API
// resize's CPU on the host). A waiting submission counts as a watch stream;
// past the cap it is answered at once.
func submit(s Service, watches *watchLimiter, w http.ResponseWriter, r *http.Request) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > api.MaxSubmitWait {
			writeError(w, http.StatusBadRequest, "InvalidQuery", fmt.Errorf("wait %q: give a duration above 0 and at most %v, such as 30s", v, api.MaxSubmitWait))
			return
		}
		wait = d
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, "UnsupportedMediaType", fmt.Errorf("content type %q: send application/json", ct))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "TooLarge", fmt.Errorf("request body over %d bytes", MaxBodyBytes))
			return
		}
		writeError(w, http.StatusBadRequest, "MalformedJSON", fmt.Errorf("reading intent: %w", err))
		return
	}
	// Before decoding: the quantity parser is slow on some numbers.
	if err := intent.CheckQuantities(body); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedJSON", fmt.Errorf("decoding intent: %w", err))
		return
	}
	var spec intent.Spec
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedJSON", fmt.Errorf("decoding intent: %w", err))
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, "MalformedJSON", errors.New("decoding intent: trailing data after the JSON object"))
		return
	}
	it, created, err := s.Submit(spec)
	if err != nil {
		fail(w, err)
		return
	}
	code := http.StatusAccepted
	if !created {
		code = http.StatusOK
	}
	if wait > 0 && !it.Status.State.Settled() {
		it = awaitSettled(s, watches, w, r, it, wait)
	}
	w.Header().Set("Location", "/v1/intents/"+it.ID)
	writeJSON(w, code, it)
}

// awaitSettled waits up to d for accepted intent it to settle. The server's
// ReadTimeout does not cut the wait short: net/http clears the read deadline
// once the body is read and its background read starts (startBackgroundRead
// in net/http/server.go); TestSubmitWaitOutlastsReadTimeout holds it to that.
func awaitSettled(s Service, watches *watchLimiter, w http.ResponseWriter, r *http.Request, it intent.Intent, d time.Duration) intent.Intent {
	release, err := watches.acquire(watchPeer(r))
	if err != nil {
		return it
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), d)
	defer cancel()
	if cur, err := s.Await(ctx, it.ID); err == nil {
		return cur
	}
	return it
}

// ResponseWriteTimeout bounds the writing of an answer, from when it is
// ready: a list page or the containers are a few hundred KiB at most.
const ResponseWriteTimeout = 30 * time.Second

// WatchWriteTimeout bounds each event's write to a watcher: a reader slower
// than this is cut off, and its stream ends.
const WatchWriteTimeout = 10 * time.Second

// watch streams events for as long as the client stays. The server's read
// and write timeouts would cut a live stream, so it clears the read deadline
// (the client sends nothing more; its going away still ends the request)
// and sets a write deadline before each event instead.
func watch(s Service, w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return
	}
	deadline := func() bool {
		err := rc.SetWriteDeadline(time.Now().Add(WatchWriteTimeout))
		return err == nil || errors.Is(err, http.ErrNotSupported)
	}
	q := r.URL.Query()
	ch := s.Watch(r.Context(), api.Filter{IntentID: q.Get("intent"), Container: q.Get("container")})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	if !deadline() {
		return
	}
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	enc := json.NewEncoder(w)
	for e := range ch {
		if !deadline() {
			return
		}
		if err := enc.Encode(e); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

func fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, intent.ErrOutsideTargetRoot):
		writeError(w, http.StatusBadRequest, "OutsideTargetRoot", err)
	case errors.Is(err, intent.ErrInvalid):
		reason := "Invalid"
		if strings.Contains(err.Error(), intent.ReasonQoSChange) {
			reason = intent.ReasonQoSChange
		}
		writeError(w, http.StatusUnprocessableEntity, reason, err)
	case errors.Is(err, agent.ErrKubeletOwned):
		writeError(w, http.StatusForbidden, "KubeletOwned", err)
	case errors.Is(err, agent.ErrForbidden):
		writeError(w, http.StatusForbidden, "Forbidden", err)
	case errors.Is(err, agent.ErrNotFound):
		writeError(w, http.StatusNotFound, "NotFound", err)
	case errors.Is(err, agent.ErrAmbiguous):
		writeError(w, http.StatusConflict, "AmbiguousName", err)
	case errors.Is(err, agent.ErrConflict):
		writeError(w, http.StatusConflict, "Conflict", err)
	case errors.Is(err, agent.ErrRuntime):
		writeError(w, http.StatusServiceUnavailable, "RuntimeUnavailable", err)
	case errors.Is(err, agent.ErrShuttingDown):
		writeError(w, http.StatusServiceUnavailable, "ShuttingDown", err)
	case errors.Is(err, agent.ErrJournal):
		// Not accepted, as it could not be made durable: retry later.
		writeError(w, http.StatusServiceUnavailable, "JournalUnavailable", err)
	default:
		writeError(w, http.StatusInternalServerError, "Internal", err)
	}
}

func writeError(w http.ResponseWriter, code int, reason string, err error) {
	writeJSON(w, code, api.Error{Error: err.Error(), Reason: reason})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	// The server's write timeout runs from the request, so it counts the
	// handler's own work too: an answer that took long to make (every
	// managed container's files and pressure, on a slow node) was cut off
	// unwritten, and the client saw an EOF. What it bounds is a slow
	// reader, so it starts again here, when the answer is ready.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(ResponseWriteTimeout))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
