package cgroup

func SetFailWrite(m *Manager, f func(file string) error) { m.failWrite = f }
