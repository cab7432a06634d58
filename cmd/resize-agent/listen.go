package main

import (
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of every listener. Each connection costs a goroutine and its
// buffers (about 20 KiB), so the cap bounds what connections can cost; the
// timeouts free what idle or slow peers hold.
const (
	// readHeaderTimeout bounds a request's headers, and with the others the
	// TLS handshake (net/http takes the least of them).
	readHeaderTimeout = 10 * time.Second
	// readTimeout bounds a whole request: a body is at most 64 KiB
	// (apiserver.MaxBodyBytes), which takes well under this on any link.
	readTimeout = 30 * time.Second
	// writeTimeout bounds a response to a slow reader; a list page and a
	// metrics scrape are a few hundred KiB at most. A watch is exempt: it
	// sets its own deadline before each event (apiserver.WatchWriteTimeout).
	writeTimeout = 30 * time.Second
)

// limitListener holds at most n connections at a time. When all n are
// held it closes the one that has waited longest without a request to take
// the next: under a flood of idle keep-alive connections a kubelet probe
// or a resizectl call would otherwise wait in the kernel's accept queue
// for a cap's worth of idle timeouts (116-236 s under issue 15's load). A
// connection idle between requests goes first; one that has sent nothing
// since it opened goes only after newSilence, so that a client's first
// request is not cut in the instant between connect and send, and never
// while its first bytes wait unread in the socket (sentBytes). A
// connection with a request in flight (a watch stream, a scrape) is never
// closed; with all n busy, Accept waits for one to end or go idle.
//
// Written here: golang.org/x/net/netutil.LimitListener only waits, and its
// connections hide the *net.UnixConn that the peer check reads the
// credentials from (ours give it back through NetConn, as tls.Conn does).
// The server reports each connection's state through track, its
// ConnState hook.
type limitListener struct {
	net.Listener
	n       int
	evicted func() // counts a connection closed to make room
	done    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	held    map[*limitConn]struct{}
	changed chan struct{} // closed and replaced when a connection ends or goes idle
}

// newSilence is how long a new connection may stay silent before it may be
// closed to make room.
const newSilence = time.Second

func newLimitListener(l net.Listener, n int, evicted func()) *limitListener {
	if evicted == nil {
		evicted = func() {}
	}
	return &limitListener{Listener: l, n: n, evicted: evicted, done: make(chan struct{}),
		held: map[*limitConn]struct{}{}, changed: make(chan struct{})}
}

// Accept waits for room (http.Server calls it from one goroutine), then
// for the next connection.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if len(l.held) < l.n {
			l.mu.Unlock()
			break
		}
		victim, changed := l.victimLocked(time.Now()), l.changed
		if victim != nil {
			delete(l.held, victim)
		}
		l.mu.Unlock()
		if victim != nil {
			// Its server goroutine sees the read fail and ends.
			victim.Conn.Close()
			l.evicted()
			continue
		}
		select {
		case <-changed:
		case <-l.done:
			return nil, net.ErrClosed
		case <-time.After(newSilence):
			// A silent new connection may have become a victim.
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &limitConn{Conn: c, l: l, state: http.StateNew, since: time.Now()}
	l.mu.Lock()
	l.held[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// victimLocked is the held connection to close for room: the longest idle,
// else the longest silent since it opened (past newSilence), else none.
func (l *limitListener) victimLocked(now time.Time) *limitConn {
	var idle, silent *limitConn
	for c := range l.held {
		switch c.state {
		case http.StateIdle:
			if idle == nil || c.since.Before(idle.since) {
				idle = c
			}
		case http.StateNew:
			if now.Sub(c.since) >= newSilence && (silent == nil || c.since.Before(silent.since)) && !c.sentBytes() {
				silent = c
			}
		}
	}
	if idle != nil {
		return idle
	}
	return silent
}

// sentBytes reports whether the peer's first bytes wait unread in the
// socket. The server reports a connection active only once its goroutine
// has read them, which on a loaded node (a flood, one CPU) can take longer
// than newSilence: such a connection has sent its request and is not
// silent. SIOCINQ (FIONREAD) is a non-blocking ioctl, cheap under l.mu.
func (c *limitConn) sentBytes() bool {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if err := raw.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return false
	}
	return err == nil && n > 0
}

// track is the servers' ConnState hook.
func (l *limitListener) track(c net.Conn, s http.ConnState) {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok && !isLimitConn(c) {
		c = nc.NetConn() // a *tls.Conn over ours
	}
	lc, ok := c.(*limitConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.state != s {
		lc.state, lc.since = s, time.Now()
	}
	if s == http.StateIdle {
		l.signalLocked()
	}
}

func isLimitConn(c net.Conn) bool { _, ok := c.(*limitConn); return ok }

func (l *limitListener) signalLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
	// Guarded by l.mu: the server's last report, and since when.
	state http.ConnState
	since time.Time
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.held, c)
		c.l.signalLocked()
		c.l.mu.Unlock()
	})
	return err
}

// NetConn returns the connection underneath, e.g. the *net.UnixConn whose
// peer credentials apiserver.PeerConnContext reads.
func (c *limitConn) NetConn() net.Conn { return c.Conn }
