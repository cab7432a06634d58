package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// Files of the memory controller used to shrink a cgroup safely.
const (
	FileMemoryHigh    = "memory.high"
	FileMemoryReclaim = "memory.reclaim" // kernel 5.19+
	FileMemoryStat    = "memory.stat"
)

// Memory is what a cgroup's memory files say about its usage, in bytes.
type Memory struct {
	Current int64 // memory.current
	High    int64 // memory.high, or Unlimited
	Max     int64 // memory.max, or Unlimited
	// From memory.stat.
	Anon, File, Shmem, SlabReclaimable, Swap int64
	// From memory.pressure (zero where the kernel has no PSI).
	Pressure PSI
}

// Reclaimable is what the kernel might take back without swap: page cache
// that is not shmem, and reclaimable slab (dentries, inodes).
func (m Memory) Reclaimable() int64 {
	return max(m.File-m.Shmem, 0) + m.SlabReclaimable
}

// ReadMemory returns the memory usage, limits and pressure of the cgroup p.
func (m *Manager) ReadMemory(p string) (Memory, error) {
	clean, d, err := m.dir(p)
	if err != nil {
		return Memory{}, err
	}
	var out Memory
	for _, f := range []struct {
		name string
		v    *int64
	}{{FileMemoryCurrent, &out.Current}, {FileMemoryHigh, &out.High}, {FileMemoryMax, &out.Max}} {
		raw, err := readFile(d, f.name)
		if err != nil {
			return Memory{}, err
		}
		if *f.v, err = parseMax(raw); err != nil {
			return Memory{}, fmt.Errorf("%s/%s: %w", clean, f.name, err)
		}
	}
	// The library parses memory.stat and memory.pressure.
	lib, err := cgroup2.Load(clean, cgroup2.WithMountpoint(m.mountpoint))
	if err != nil {
		return Memory{}, fmt.Errorf("load cgroup %s: %w", clean, err)
	}
	st, err := lib.StatFiltered(cgroup2.StatMemory)
	if err != nil {
		return Memory{}, fmt.Errorf("stat cgroup %s: %w", clean, err)
	}
	if s := st.Memory; s != nil {
		out.Anon, out.File, out.Shmem = int64(s.Anon), int64(s.File), int64(s.Shmem)
		out.SlabReclaimable, out.Swap = int64(s.SlabReclaimable), int64(s.SwapUsage)
		out.Pressure, _ = psi(s.PSI)
	}
	return out, nil
}

// ReadMemoryHigh returns the cgroup p's memory.high (bytes, or Unlimited)
// alone: the drift check compares it where the kubelet sets it (MemoryQoS)
// and ReadMemory would also parse memory.stat.
func (m *Manager) ReadMemoryHigh(p string) (int64, error) {
	clean, d, err := m.dir(p)
	if err != nil {
		return 0, err
	}
	raw, err := readFile(d, FileMemoryHigh)
	if err != nil {
		return 0, err
	}
	v, err := parseMax(raw)
	if err != nil {
		return 0, fmt.Errorf("%s/%s: %w", clean, FileMemoryHigh, err)
	}
	return v, nil
}

// SetMemoryHigh writes memory.high (bytes, or Unlimited) and reads it back.
// The kernel reclaims down to a lowered memory.high before the write
// returns, as far as it can; unlike memory.max it never OOM-kills for it
// but throttles the cgroup's allocations above it.
func (m *Manager) SetMemoryHigh(p string, v int64) error {
	if v != Unlimited && v < 0 {
		return fmt.Errorf("%w: memory.high %d is negative", ErrInvalidValue, v)
	}
	clean, d, err := m.dir(p)
	if err != nil {
		return err
	}
	data := formatMax(v)
	if m.failWrite != nil {
		err = m.failWrite(FileMemoryHigh)
	}
	if err == nil {
		// By hand, like memory.max: the library's int64 cannot say "max".
		err = writeRaw(filepath.Join(d, FileMemoryHigh), data)
	}
	if err != nil {
		return &WriteError{Path: clean, File: FileMemoryHigh, Value: data, Err: err}
	}
	raw, err := readFile(d, FileMemoryHigh)
	if err != nil {
		return err
	}
	got, err := parseMax(raw)
	if err != nil {
		return err
	}
	if got != pageAlign(v, m.pageSize) {
		return fmt.Errorf("%w: %s holds memory.high=%s after writing %s", ErrVerify, clean, raw, data)
	}
	return nil
}

// Reclaim asks the kernel to reclaim n bytes from the cgroup p now
// (memory.reclaim). It returns how far memory.current fell during the call.
// Errors match ErrNotSupported where the kernel has no memory.reclaim, and
// ErrReclaimIncomplete (as a *ReclaimError) when it could not reclaim n.
func (m *Manager) Reclaim(p string, n int64) (int64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("%w: reclaim %d bytes", ErrInvalidValue, n)
	}
	clean, d, err := m.dir(p)
	if err != nil {
		return 0, err
	}
	f := filepath.Join(d, FileMemoryReclaim)
	if _, err := os.Stat(f); errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w: %s has no %s (kernel 5.19 or later needed)", ErrNotSupported, clean, FileMemoryReclaim)
	}
	before, err := m.current(d)
	if err != nil {
		return 0, err
	}
	var werr error
	if m.failWrite != nil {
		werr = m.failWrite(FileMemoryReclaim)
	}
	if werr == nil {
		werr = writeRaw(f, strconv.FormatInt(n, 10))
	}
	after, err := m.current(d)
	if err != nil {
		return 0, err
	}
	got := max(before-after, 0)
	if werr == nil {
		return got, nil
	}
	if errors.Is(werr, syscall.EAGAIN) {
		werr = ErrReclaimIncomplete
	}
	return got, &ReclaimError{Path: clean, Requested: n, Reclaimed: got, Err: werr}
}

// SupportsReclaim reports whether the cgroup p has memory.reclaim.
func (m *Manager) SupportsReclaim(p string) (bool, error) {
	_, d, err := m.dir(p)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(filepath.Join(d, FileMemoryReclaim))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (m *Manager) current(d string) (int64, error) {
	raw, err := readFile(d, FileMemoryCurrent)
	if err != nil {
		return 0, err
	}
	return parseMax(raw)
}

// writeRaw writes data to a cgroup file with plain system calls and returns
// the bare errno. Not through *os.File: cgroupfs files can be polled, so Go
// puts them in non-blocking mode under its netpoller and takes the EAGAIN
// that memory.reclaim answers for "could not reclaim it all" as "try again
// when writable", which never comes: the write would hang.
func writeRaw(path, data string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for {
		_, err = unix.Write(fd, []byte(data))
		if err != unix.EINTR {
			return err
		}
	}
}
