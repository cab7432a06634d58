package cgroup

func SetFailWrite(m *Manager, f func(file string) error) { m.failWrite = f }

// SetWalk makes m check paths element by element, as without openat2.
func SetWalk(m *Manager) { m.walk.Store(true) }
