package main

import (
	"net"

	"golang.org/x/sys/unix"
)

// listenWithUmask binds the socket with umask 0177. The umask is process
// wide, so this runs at start-up before any other goroutine creates files.
func listenWithUmask(path string) (net.Listener, error) {
	old := unix.Umask(0o177)
	defer unix.Umask(old)
	return net.Listen("unix", path)
}
