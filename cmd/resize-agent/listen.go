package main

import (
	"net"
	"sync"
	"time"
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

// limitListener accepts at most n connections at a time; Accept waits for a
// slot, as golang.org/x/net/netutil.LimitListener does. It is written here
// because netutil's connections hide the *net.UnixConn that the peer check
// reads the credentials from; ours give it back through NetConn, as
// tls.Conn does.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// NetConn returns the connection underneath, e.g. the *net.UnixConn whose
// peer credentials apiserver.PeerConnContext reads.
func (c *limitConn) NetConn() net.Conn { return c.Conn }
