package apiserver

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
)

// Bounds on what one request, or one client, may make the server hold.
const (
	// DefaultMaxWatches caps the watch streams open at once, and
	// DefaultMaxWatchesPerPeer those of one peer (a local user on the unix
	// socket, an IP address on TCP); more are refused with 429.
	DefaultMaxWatches        = 500
	DefaultMaxWatchesPerPeer = 100
	// MaxListLimit is the largest page of a list, and the page a client
	// that gives no limit gets; the response then carries api.HeaderContinue
	// to ask for the next one.
	MaxListLimit = 500
)

// Option configures NewHandler.
type Option func(*config)

type config struct {
	maxWatches, maxWatchesPerPeer int
}

// WithWatchLimits caps the watch streams open at once, in all and per peer.
func WithWatchLimits(total, perPeer int) Option {
	return func(c *config) { c.maxWatches, c.maxWatchesPerPeer = total, perPeer }
}

type watchLimiter struct {
	mu             sync.Mutex
	total, perPeer int
	open           int
	byPeer         map[string]int
}

func newWatchLimiter(total, perPeer int) *watchLimiter {
	return &watchLimiter{total: total, perPeer: perPeer, byPeer: map[string]int{}}
}

func (l *watchLimiter) acquire(peer string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.total:
		return nil, fmt.Errorf("%d watch streams are open, the most this agent serves; close one or watch again later", l.open)
	case l.byPeer[peer] >= l.perPeer:
		return nil, fmt.Errorf("%s has %d watch streams open, the most one client may; close one or watch again later", peer, l.byPeer[peer])
	}
	l.open++
	l.byPeer[peer]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.open--
			if l.byPeer[peer]--; l.byPeer[peer] == 0 {
				delete(l.byPeer, peer)
			}
		})
	}, nil
}

// watchPeer names the client for the per-peer caps: its user on the unix
// socket, its address on TCP.
func watchPeer(r *http.Request) string {
	if p, ok := PeerFrom(r.Context()); ok {
		return fmt.Sprintf("uid %d", p.UID)
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// list serves GET /v1/intents a page at a time, as Kubernetes lists are:
// limit bounds the page, continue (from api.HeaderContinue of the page
// before) says where it starts. The body stays a JSON array.
func list(s Service, w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st := intent.State(q.Get("state"))
	if st != "" && !validState(st) {
		writeError(w, http.StatusBadRequest, "InvalidQuery", fmt.Errorf("unknown state %q", st))
		return
	}
	limit := MaxListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "InvalidQuery", fmt.Errorf("limit %q is not a positive number", v))
			return
		}
		limit = min(n, MaxListLimit)
	}
	after, err := decodeContinue(q.Get("continue"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidContinue", err)
		return
	}
	items, next := s.ListPage(api.Filter{Container: q.Get("container")}, st, after, limit)
	if next != 0 {
		w.Header().Set(api.HeaderContinue, encodeContinue(next))
	}
	writeJSON(w, http.StatusOK, items)
}

// The continue token is opaque to clients: the sequence number the next
// page starts after.
func encodeContinue(seq uint64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("v1:" + strconv.FormatUint(seq, 10)))
}

var errContinue = errors.New("continue token is not one this agent gave: list again from the start")

func decodeContinue(tok string) (uint64, error) {
	if tok == "" {
		return 0, nil
	}
	if len(tok) > 64 {
		return 0, errContinue
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 4 || string(b[:3]) != "v1:" {
		return 0, errContinue
	}
	n, err := strconv.ParseUint(string(b[3:]), 10, 64)
	if err != nil || n == 0 {
		return 0, errContinue
	}
	return n, nil
}
