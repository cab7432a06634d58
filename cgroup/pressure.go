package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/cgroups/v3/cgroup2/stats"
)

// PSI is one pressure file's totals (cpu.pressure, memory.pressure,
// io.pressure): the time some or all tasks were stalled, and the 10 s
// averages in percent.
type PSI struct {
	Some, Full           time.Duration
	Avg10Some, Avg10Full float64
}

// Pressure is what a cgroup's own files say about CPU and memory pressure.
type Pressure struct {
	CPU, Memory, IO PSI
	HasPSI          bool // false where the kernel has no PSI (psi=0)
	// From cpu.stat.
	Periods, ThrottledPeriods uint64
	Throttled                 time.Duration
	// From memory.events.
	OOMs, OOMKills uint64
}

// Pressure reads the PSI files, cpu.stat and memory.events of the cgroup p
// through containerd/cgroups.
func (m *Manager) Pressure(p string) (Pressure, error) {
	clean, d, err := m.dir(p)
	if err != nil {
		return Pressure{}, err
	}
	lib, err := cgroup2.Load(clean, cgroup2.WithMountpoint(m.mountpoint))
	if err != nil {
		return Pressure{}, err
	}
	st, err := lib.StatFiltered(cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents | cgroup2.StatIO)
	if err != nil {
		return Pressure{}, fmt.Errorf("stat cgroup %s: %w", clean, err)
	}
	// The library reads a missing cpu.stat as zeros and a missing PSI file
	// as none: a cgroup removed during the reads (a container restarted)
	// would read as one with no pressure, no throttling and no PSI, and a
	// window ending there would say so. Its directory tells.
	if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
		return Pressure{}, fmt.Errorf("%w: %s (removed while its files were read)", ErrNotFound, clean)
	}
	var out Pressure
	if c := st.CPU; c != nil {
		out.Periods, out.ThrottledPeriods = c.NrPeriods, c.NrThrottled
		out.Throttled = time.Duration(c.ThrottledUsec) * time.Microsecond
		out.CPU, out.HasPSI = psi(c.PSI)
	}
	if mem := st.Memory; mem != nil {
		out.Memory, _ = psi(mem.PSI)
	}
	if io := st.Io; io != nil {
		out.IO, _ = psi(io.PSI)
	}
	if e := st.MemoryEvents; e != nil {
		out.OOMs, out.OOMKills = e.Oom, e.OomKill
	}
	return out, nil
}

func psi(s *stats.PSIStats) (PSI, bool) {
	var out PSI
	if s == nil || (s.Some == nil && s.Full == nil) {
		return out, false
	}
	if s.Some != nil {
		out.Some, out.Avg10Some = time.Duration(s.Some.Total)*time.Microsecond, s.Some.Avg10
	}
	if s.Full != nil {
		out.Full, out.Avg10Full = time.Duration(s.Full.Total)*time.Microsecond, s.Full.Avg10
	}
	return out, true
}

// ID returns the cgroup's id: the inode number of its directory, which is
// the kernfs node id that BPF programs see as the task's cgroup id.
func (m *Manager) ID(p string) (uint64, error) {
	_, d, err := m.dir(p)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(d)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("cgroup %s: no inode number", p)
	}
	return st.Ino, nil
}
