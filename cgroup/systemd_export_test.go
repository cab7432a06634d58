package cgroup

import (
	"context"
	"time"
)

// UnitConn is the connection interface the systemd driver uses.
type UnitConn = unitConn

// WithFakeSystemd installs the systemd driver d with a fake connection, a
// stand-in for /run/systemd/system and a short wait for the files.
func WithFakeSystemd(d Driver, runDir string, wait time.Duration, dial func(context.Context) (UnitConn, error)) Option {
	return func(m *Manager) {
		m.sd = newSystemdDriver(d, dial)
		m.sd.runDir = runDir
		m.sd.applyWait = wait
	}
}
