package main

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/resizer/resize-agent/agent/apiserver"
)

// lookupGroup resolves --api-group, a group name or a numeric ID.
func lookupGroup(name string) (uint32, error) {
	if id, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(id), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	id, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group %s has gid %q: %w", name, g.Gid, err)
	}
	return uint32(id), nil
}

// setSocketAccess gives the socket mode 0600, or 0660 with the api-group as
// its group. The socket is created 0600 (umask), so it is never open wider.
func setSocketAccess(path string, gids []uint32) error {
	mode := os.FileMode(0o600)
	if len(gids) > 0 {
		if err := os.Chown(path, -1, int(gids[0])); err != nil {
			return fmt.Errorf("socket group: %w", err)
		}
		mode = 0o660
	}
	return os.Chmod(path, mode)
}

// socketPolicy is who may use the API on the socket, checked on the peer's
// credentials as well as by the file's mode: root, the socket file's owner
// (the agent's user) and the api-group.
func socketPolicy(path string, gids []uint32) (apiserver.PeerPolicy, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return apiserver.PeerPolicy{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return apiserver.PeerPolicy{}, fmt.Errorf("socket %s: no owner", path)
	}
	return apiserver.PeerPolicy{UIDs: []uint32{st.Uid}, GIDs: gids}, nil
}
