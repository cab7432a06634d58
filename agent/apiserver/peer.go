package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of a unix-socket connection, as the
// kernel recorded it when it connected (SO_PEERCRED, SO_PEERGROUPS).
type Peer struct {
	PID    int32
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
}

type peerKey struct{}

// PeerConnContext is an http.Server ConnContext for a unix-socket listener:
// it records the peer's credentials for RequirePeer. A connection whose
// credentials cannot be read gets none, and RequirePeer refuses it. A
// connection wrapped by a listener (a connection limit, TLS) is unwrapped
// through its NetConn method.
func PeerConnContext(ctx context.Context, c net.Conn) context.Context {
	for {
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	p, err := peerOf(uc)
	if err != nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// PeerFrom returns the peer PeerConnContext recorded for a request's
// connection.
func PeerFrom(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(peerKey{}).(Peer)
	return p, ok
}

func peerOf(c *net.UnixConn) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var p Peer
	var opErr error
	err = raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		if cred, opErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); opErr != nil {
			return
		}
		p = Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}
		p.Groups, opErr = peerGroups(int(fd))
	})
	return p, errors.Join(err, opErr)
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13+), which x/sys/unix has no
// wrapper for: a []gid_t, grown when the kernel answers ERANGE with the
// length it needs.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE && int(n/4) > len(buf):
			buf = make([]uint32, n/4)
		case errno != 0:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		default:
			return buf[:n/4], nil
		}
	}
}

// PeerPolicy says which local users may use the API on the unix socket:
// root always; the UIDs (the socket file's owner, the agent's own user);
// and members, primary or supplementary, of the GIDs.
type PeerPolicy struct {
	UIDs []uint32
	GIDs []uint32
}

// Allows reports whether p may use the API.
func (pp PeerPolicy) Allows(p Peer) bool {
	if p.UID == 0 || slices.Contains(pp.UIDs, p.UID) || slices.Contains(pp.GIDs, p.GID) {
		return true
	}
	for _, g := range p.Groups {
		if slices.Contains(pp.GIDs, g) {
			return true
		}
	}
	return false
}

// RequirePeer serves h only to peers pp allows; others, and connections
// without recorded credentials (a server without PeerConnContext), get 403.
// The socket's file mode is the first gate; this one holds when the mode is
// loosened.
func RequirePeer(pp PeerPolicy, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := PeerFrom(r.Context())
		if !ok {
			writeError(w, http.StatusForbidden, "Forbidden", errors.New("the peer's credentials are unknown"))
			return
		}
		if !pp.Allows(p) {
			writeError(w, http.StatusForbidden, "Forbidden", fmt.Errorf("uid %d (pid %d) may not use this API: allowed are root, uids %v and groups %v", p.UID, p.PID, pp.UIDs, pp.GIDs))
			return
		}
		h.ServeHTTP(w, r)
	})
}
