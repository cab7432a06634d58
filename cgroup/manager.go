package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// DefaultMountpoint is where the unified hierarchy is mounted on a node.
const DefaultMountpoint = "/sys/fs/cgroup"

// RequiredControllers are the controllers whose files the agent writes.
var RequiredControllers = []string{"cpu", "memory"}

// Manager reads and writes the cgroups below one cgroup v2 mountpoint.
type Manager struct {
	mountpoint string
	pageSize   int64
	skipFSType bool
	// failWrite, set only by tests, makes the write of a file fail.
	failWrite func(file string) error
	sd        *systemdDriver // nil: cgroupfs driver (see WithDriver)
	// root is the mountpoint opened once, for dir's openat2; rootErr why
	// it could not be, or why openat2 is not to be used (then dir walks).
	rootOnce sync.Once
	root     int
	rootErr  error
	walk     atomic.Bool // openat2 refused once: walk from then on
}

// Option configures a Manager.
type Option func(*Manager)

// WithMountpoint sets the cgroup v2 mountpoint (default /sys/fs/cgroup).
func WithMountpoint(p string) Option { return func(m *Manager) { m.mountpoint = p } }

// WithoutFilesystemCheck makes Check accept a mountpoint that is not a
// cgroup2 filesystem: for unit tests on a directory laid out like cgroupfs.
func WithoutFilesystemCheck() Option { return func(m *Manager) { m.skipFSType = true } }

// New returns a Manager. It does not touch the filesystem; call Check.
func New(opts ...Option) *Manager {
	m := &Manager{mountpoint: DefaultMountpoint, pageSize: int64(os.Getpagesize())}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Mountpoint returns the cgroup v2 mountpoint.
func (m *Manager) Mountpoint() string { return m.mountpoint }

// PageSize is the unit the kernel rounds memory.max down to.
func (m *Manager) PageSize() int64 { return m.pageSize }

// Check verifies that the mountpoint is a cgroup v2 filesystem whose root
// offers the cpu and memory controllers. Its errors match ErrNotCgroup2 or
// ErrMissingController and say what was found instead.
func (m *Manager) Check() error {
	if !m.skipFSType {
		var st unix.Statfs_t
		if err := unix.Statfs(m.mountpoint, &st); err != nil {
			return fmt.Errorf("%w: statfs %s: %w", ErrNotCgroup2, m.mountpoint, err)
		}
		if st.Type != unix.CGROUP2_SUPER_MAGIC {
			return fmt.Errorf("%w: %s is a %s filesystem; this host runs a cgroup v1 or hybrid hierarchy, "+
				"where the cpu and memory controllers are bound to cgroup v1 and cgroup v2 limits cannot be set",
				ErrNotCgroup2, m.mountpoint, fsName(st.Type))
		}
	}
	b, err := os.ReadFile(filepath.Join(m.mountpoint, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotCgroup2, err)
	}
	have := strings.Fields(string(b))
	var missing []string
	for _, c := range RequiredControllers {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		avail := strings.Join(have, " ")
		if avail == "" {
			avail = "none"
		}
		return fmt.Errorf("%w: %s lacks %s (available: %s); they are probably bound to a cgroup v1 hierarchy",
			ErrMissingController, m.mountpoint, strings.Join(missing, ", "), avail)
	}
	return nil
}

func fsName(t int64) string {
	switch t {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.CGROUP_SUPER_MAGIC:
		return "cgroup (v1)"
	case unix.SYSFS_MAGIC:
		return "sysfs"
	}
	return "0x" + strconv.FormatInt(t, 16)
}

// dir validates p and returns its directory on disk. Every element of the
// path must be a directory, not a symlink: a link anywhere along it (not
// only at its end) could lead out of the root. cgroupfs has no symlinks, so
// this only refuses roots laid out by hand.
func (m *Manager) dir(p string) (string, string, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return "", "", err
	}
	switch err := m.resolve(clean); {
	case err == nil:
		return clean, filepath.Join(m.mountpoint, clean), nil
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		// ELOOP: a symlink on the way (RESOLVE_NO_SYMLINKS).
		return "", "", fmt.Errorf("%w: %s", ErrNotFound, clean)
	case !errors.Is(err, errWalk):
		return "", "", fmt.Errorf("cgroup %s: %w", clean, err)
	}
	d := m.mountpoint
	for _, elem := range strings.Split(clean[1:], "/") {
		d = filepath.Join(d, elem)
		fi, err := os.Lstat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
			return "", "", fmt.Errorf("%w: %s", ErrNotFound, clean)
		case err != nil:
			return "", "", fmt.Errorf("cgroup %s: %w", clean, err)
		case !fi.IsDir():
			return "", "", fmt.Errorf("%w: %s is not a cgroup directory", ErrNotFound, clean)
		}
	}
	return clean, d, nil
}

// errWalk says that dir must check the path itself, element by element.
var errWalk = errors.New("openat2 unavailable")

// resolve checks, with one openat2 below the mountpoint, that every
// element of clean is a directory and none a symlink: what dir's walk
// checks with a stat per element, which a resize paid twice per cgroup
// (issue 16). It returns errWalk where openat2 is missing (before Linux
// 5.6) or declines (EAGAIN, a rename racing it).
func (m *Manager) resolve(clean string) error {
	m.rootOnce.Do(m.openRoot)
	if m.rootErr != nil {
		return m.rootErr
	}
	rel := "."
	if clean != "/" {
		rel = clean[1:]
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	for {
		fd, err := unix.Openat2(m.root, rel, &how)
		switch {
		case err == nil:
			unix.Close(fd)
			return nil
		case err == unix.EINTR:
			continue
		case err == unix.ENOSYS || err == unix.EPERM:
			// EPERM: a seccomp filter that does not know openat2.
			m.walk.Store(true)
			return errWalk
		case err == unix.EAGAIN:
			return errWalk
		}
		return err
	}
}

// cgdir is a cgroup's directory, for opening its files. With openat2,
// each file is opened below the mountpoint's descriptor in one call that
// checks the path as dir does (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), as
// runc's cgroups package opens its files: a resize's reads and writes paid
// two more system calls (dir's openat2 and its close) per file set, on the
// path of every resize (issue 16). Without openat2 dir's walk checked the
// directory and its files are opened by path.
type cgdir struct {
	m     *Manager
	clean string // the cgroup path, as CleanPath makes it
	abs   string // its directory on disk
	rel   string // abs below the mountpoint's descriptor ("." for the root)
	at    bool   // open below the descriptor; false: by path, as checked
}

// pathDir is a directory dir has already checked (or the mountpoint).
func pathDir(abs string) cgdir { return cgdir{clean: abs, abs: abs} }

// files is dir for a caller that opens p's files: with openat2 the path is
// checked as each file is opened (cgdir), not first on its own.
func (m *Manager) files(p string) (cgdir, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return cgdir{}, err
	}
	if m.openat2() {
		rel := "."
		if clean != "/" {
			rel = clean[1:]
		}
		return cgdir{m: m, clean: clean, abs: filepath.Join(m.mountpoint, clean), rel: rel, at: true}, nil
	}
	clean, d, err := m.dir(clean)
	if err != nil {
		return cgdir{}, err
	}
	return cgdir{m: m, clean: clean, abs: d}, nil
}

// openat2 reports whether files are opened with openat2 below the
// mountpoint's descriptor.
func (m *Manager) openat2() bool {
	m.rootOnce.Do(m.openRoot)
	return m.rootErr == nil && !m.walk.Load()
}

// open opens the file name of d with flags (and O_CLOEXEC). A cgroup that
// is missing, or whose path is not a chain of directories below the
// mountpoint, is ErrNotFound, as dir says it; a missing file is ErrNotFound
// too, with the controller that may be off named.
func (d cgdir) open(name string, flags int) (int, error) {
	p := d.abs + "/" + name
	flags |= unix.O_CLOEXEC
	if d.at {
		how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
		for {
			fd, err := unix.Openat2(d.m.root, d.rel+"/"+name, &how)
			switch {
			case err == nil:
				return fd, nil
			case err == unix.EINTR:
				continue
			case err == unix.ENOSYS || err == unix.EPERM || err == unix.EAGAIN:
				// Refused (a seccomp filter that does not know openat2),
				// or a rename raced it: check by walking, then by path.
				if err != unix.EAGAIN {
					d.m.walk.Store(true)
				}
				if _, _, err := d.m.dir(d.clean); err != nil {
					return -1, err
				}
				d.at = false
				return d.open(name, flags)
			case err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP || err == unix.EXDEV:
				// The cgroup, or only its file? dir says which.
				if _, _, derr := d.m.dir(d.clean); derr != nil {
					return -1, derr
				}
				return -1, missingFile(d.abs, name, err)
			}
			return -1, &fs.PathError{Op: "open", Path: p, Err: err}
		}
	}
	for {
		fd, err := unix.Open(p, flags, 0)
		switch {
		case err == nil:
			return fd, nil
		case err == unix.EINTR:
			continue
		case err == unix.ENOENT:
			return -1, missingFile(d.abs, name, err)
		}
		return -1, &fs.PathError{Op: "open", Path: p, Err: err}
	}
}

func missingFile(dir, name string, err error) error {
	return fmt.Errorf("%w: %s has no %s (controller not enabled for it?): %w", ErrNotFound, dir, name, err)
}

func (m *Manager) openRoot() {
	m.root, m.rootErr = unix.Open(m.mountpoint, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if m.rootErr != nil {
		m.rootErr = errWalk // the walk says what is wrong with it
	}
}

// Exists reports whether the cgroup p exists.
func (m *Manager) Exists(p string) (bool, error) {
	_, _, err := m.dir(p)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Children lists the cgroups directly below p, as paths in p's form. The
// agent compares two listings of a pod cgroup to tell whether a container
// of the pod started or stopped in between.
func (m *Manager) Children(p string) ([]string, error) {
	clean, d, err := m.dir(p)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(d)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, clean)
		}
		return nil, fmt.Errorf("cgroup %s: %w", clean, err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, path.Join(clean, e.Name()))
		}
	}
	return out, nil
}

// Read returns the current limits and memory usage of the cgroup p.
func (m *Manager) Read(p string) (State, error) {
	d, err := m.files(p)
	if err != nil {
		return State{}, err
	}
	return m.read(d)
}

// ReadFiles is Read of the named files only (FileCPUMax, FileCPUWeight,
// FileMemoryMax, FileMemoryCurrent); the fields of the others stay zero. A
// resize reads what it is about to change and no more: each file is three
// system calls, and under TCG they were most of a resize's own time
// (issue 16).
func (m *Manager) ReadFiles(p string, files ...string) (State, error) {
	d, err := m.files(p)
	if err != nil {
		return State{}, err
	}
	var s State
	for _, f := range files {
		if err := readInto(d, f, &s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// The library has no reader for these single files (its Stat reads every
// controller's statistics), so they are read by hand.
func (m *Manager) read(d cgdir) (State, error) {
	var s State
	for _, f := range []string{FileCPUMax, FileCPUWeight, FileMemoryMax, FileMemoryCurrent} {
		if err := readInto(d, f, &s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// readInto reads one of the files State holds into s.
func readInto(d cgdir, file string, s *State) error {
	raw, err := d.read(file)
	if err != nil {
		return err
	}
	return parseInto(file, raw, s)
}

// parseInto parses raw, the text of one of the files State holds, into s.
func parseInto(file, raw string, s *State) (err error) {
	switch file {
	case FileCPUMax:
		s.CPUMax, err = ParseCPUMax(raw)
	case FileCPUWeight:
		if s.CPUWeight, err = strconv.ParseUint(raw, 10, 64); err != nil {
			err = fmt.Errorf("%w: cpu.weight %q", ErrParse, raw)
		}
	case FileMemoryMax:
		s.MemoryMax, err = parseMax(raw)
	case FileMemoryCurrent:
		s.MemoryCurrent, err = parseMax(raw)
	default:
		err = fmt.Errorf("%w: %s is not a file State holds", ErrParse, file)
	}
	return err
}

// readFile reads the file name of the directory dir, which dir checked.
func readFile(dir, name string) (string, error) { return pathDir(dir).read(name) }

// read reads the file name of d, trimmed.
func (d cgdir) read(name string) (string, error) {
	b, err := d.readSmall(name)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(b), nil
}

// readSmall reads a file with open, read and close alone. os.ReadFile
// also stats the file and registers it with the runtime's poller (cgroupfs
// files are pollable), which made the reads the largest part of a resize's
// own cost (issue 16). The errors are os.ReadFile's, and ErrNotFound's
// where the cgroup or its file is missing (d.open).
func (d cgdir) readSmall(name string) (string, error) {
	fd, err := d.open(name, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	p := d.abs + "/" + name
	defer unix.Close(fd)
	var small [512]byte
	b := small[:0]
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, cap(b))
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return "", &fs.PathError{Op: "read", Path: p, Err: err}
		case n == 0:
			return string(b), nil
		case n < cap(b)-len(b) && oneValue(name):
			// The whole of a one-line file comes in one read, so a short
			// read is its end: the read that would say so (0 bytes) was
			// one system call in four of a resize's reads and writes
			// (issue 16). A file of many records (cgroup.procs) may come
			// short of a page before its end, so the others read to 0.
			return string(b[:len(b)+n]), nil
		}
		b = b[:len(b)+n]
	}
}

// oneValue reports whether the cgroup file name is one value on one line.
func oneValue(name string) bool {
	switch name {
	case FileCPUMax, FileCPUWeight, FileMemoryMax, FileMemoryCurrent, FileMemoryHigh:
		return true
	}
	return false
}

// Write writes r to the cgroup p (writeOne), reads every file
// back and checks it. If a write or a check fails, the files already written
// by this call are restored to what they held before, and the error (a
// *WriteError for the kernel's refusal, or ErrVerify) is returned. Under the
// systemd driver (WithDriver), a cgroup that is a systemd unit gets r as unit
// properties instead, so that systemd keeps them (see writeUnit).
func (m *Manager) Write(p string, r Resources) error {
	return m.write(p, r, nil)
}

// WriteFrom is Write for a caller that has just read p's files (Read or
// ReadFiles of at least the files r writes): what they hold is taken from
// cur instead of being read again before each write, for the check that a
// file already holds its value and for the restore of a failed write. The
// agent is the only writer of the files of a resize in progress; one
// that changed a file in between is caught by the read-back, and the
// restore puts back what cur says.
func (m *Manager) WriteFrom(p string, r Resources, cur State) error {
	return m.write(p, r, &cur)
}

func (m *Manager) write(p string, r Resources, cur *State) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidValue, err)
	}
	d, err := m.files(p)
	if err != nil {
		return err
	}
	clean := d.clean
	if unit, ok := m.systemdUnit(clean); ok {
		if _, _, err := m.dir(clean); err != nil {
			return err
		}
		return m.writeUnit(clean, d.abs, unit, r)
	}
	var done []Value // previous contents of the files written so far
	for _, v := range r.Values() {
		var old string
		if cur != nil {
			old = cur.Resources().Only(v.File).Values()[0].Data
		} else if old, err = d.read(v.File); err != nil {
			return errors.Join(err, m.restore(d, done))
		}
		if old == v.Data && m.failWrite == nil {
			continue // holds it already: nothing to write, undo or check
		}
		if m.failWrite != nil {
			err = m.failWrite(v.File)
		}
		var back string
		if err == nil {
			back, err = d.writeOne(v)
		}
		if err == nil {
			err = m.verify(d, v.File, back, r.Only(v.File))
		}
		done = append(done, Value{File: v.File, Data: old})
		if err != nil {
			return errors.Join(err, m.restore(d, done))
		}
	}
	return nil
}

// ErrInvalidValue is returned by Write for a value the kernel would refuse.
var ErrInvalidValue = errors.New("invalid cgroup value")

// writeOne writes one file's text and reads the file back on the same
// descriptor: open, write, pread from 0, close. A read after a write on one
// open file shows the kernel's value as a new open would (kernfs answers
// each read from the cgroup's state), and the read-back is what proves the
// write, so it costs no open and close of its own: under TCG those two were
// a tenth of a resize in the agent (issue 16). containerd/cgroups' Update
// writes the same text (the values are the kubelet's and runc's
// conversions, computed in spec) through os.WriteFile, which opens with
// O_CREAT|O_TRUNC and registers the file with the runtime's poller and
// unregisters it at close, and reads nothing back. It returns the text read
// back, untrimmed.
func (d cgdir) writeOne(v Value) (string, error) {
	fd, err := d.open(v.File, unix.O_RDWR|unix.O_TRUNC)
	if err != nil {
		return "", &WriteError{Path: d.clean, File: v.File, Value: v.Data, Err: err}
	}
	defer unix.Close(fd)
	if err := writeFD(fd, v.Data); err != nil {
		return "", &WriteError{Path: d.clean, File: v.File, Value: v.Data, Err: err}
	}
	var small [128]byte
	for {
		n, err := unix.Pread(fd, small[:], 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil || n == len(small):
			// Not readable on this descriptor, or longer than any value
			// written here: read it as any file is read.
			return d.readSmall(v.File)
		}
		return string(small[:n]), nil
	}
}

// writeSmall writes data to the existing file p in one write. It returns
// the errno, as the kernel refused the open or the write. O_TRUNC is what a
// shell's redirection asks too: cgroupfs ignores it, and the regular files
// of a test's fake tree need it.
func (d cgdir) writeSmall(name, data string) error {
	fd, err := d.open(name, unix.O_WRONLY|unix.O_TRUNC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return writeFD(fd, data)
}

// writeFD writes data to fd in one write.
func writeFD(fd int, data string) error {
	b := []byte(data)
	for {
		n, err := unix.Write(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n < len(b):
			// cgroupfs takes a value in one write or refuses it.
			return unix.EIO
		}
		return nil
	}
}

// verify checks back, the text of the one file just written, read back.
func (m *Manager) verify(d cgdir, file, back string, r Resources) error {
	var s State
	if err := parseInto(file, strings.TrimSpace(back), &s); err != nil {
		return err
	}
	if !s.Matches(r, m.pageSize) {
		want := ""
		if v := r.Values(); len(v) == 1 {
			want = v[0].Data
		}
		return fmt.Errorf("%w: %s %s holds %q after writing %q", ErrVerify, d.clean, file, strings.TrimSpace(back), want)
	}
	return nil
}

// verifyAll reads back every file of r.
func (m *Manager) verifyAll(clean, d string, r Resources) error {
	s, err := m.read(pathDir(d))
	if err != nil {
		return err
	}
	return m.check(clean, s, r)
}

func (m *Manager) check(clean string, s State, r Resources) error {
	if !s.Matches(r, m.pageSize) {
		return fmt.Errorf("%w: %s holds cpu.max=%q cpu.weight=%d memory.max=%s",
			ErrVerify, clean, s.CPUMax, s.CPUWeight, formatMax(s.MemoryMax))
	}
	return nil
}

// restore writes back the kernel's own text of each file, newest first. It is
// written by hand because it replays what was read, not a Resources.
func (m *Manager) restore(d cgdir, done []Value) error {
	var errs []error
	for _, v := range slices.Backward(done) {
		if err := d.writeSmall(v.File, v.Data); err != nil {
			errs = append(errs, fmt.Errorf("restore %s/%s to %q: %w", d.clean, v.File, v.Data, err))
		}
	}
	return errors.Join(errs...)
}

// Limits are the CPU and memory bounds a cgroup imposes on everything below it.
type Limits struct {
	MilliCPU int64 // from cpu.max; 0 when unlimited
	Memory   int64 // from memory.max; 0 when unlimited
}

// LimitsOf reads the cpu.max and memory.max of p ("/" for the root, which
// has neither file and so is unlimited).
func (m *Manager) LimitsOf(p string) (Limits, error) {
	d := m.mountpoint
	if p != "/" && p != "" {
		var err error
		if _, d, err = m.dir(p); err != nil {
			return Limits{}, err
		}
	}
	var l Limits
	if raw, err := readFile(d, FileCPUMax); err == nil {
		c, err := ParseCPUMax(raw)
		if err != nil {
			return l, err
		}
		if c.Quota != Unlimited && c.Period > 0 {
			l.MilliCPU = c.Quota * MilliCPUToCPU / int64(c.Period)
		}
	} else if !errors.Is(err, ErrNotFound) {
		return l, err
	}
	if raw, err := readFile(d, FileMemoryMax); err == nil {
		v, err := parseMax(raw)
		if err != nil {
			return l, err
		}
		if v != Unlimited {
			l.Memory = v
		}
	} else if !errors.Is(err, ErrNotFound) {
		return l, err
	}
	return l, nil
}

// PathOf returns the cgroup of a process, from /proc/<pid>/cgroup, as a
// clean path relative to the root (when the agent shares the host's cgroup
// namespace, as a DaemonSet with hostPID does).
func (m *Manager) PathOf(pid int) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: process %d is gone", ErrNotFound, pid)
		}
		return "", fmt.Errorf("cgroup of process %d: %w", pid, err)
	}
	defer f.Close()
	p, err := parseProcCgroup(f)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return "", fmt.Errorf("%w: process %d is gone", ErrNotFound, pid)
		}
		return "", fmt.Errorf("cgroup of process %d: %w", pid, err)
	}
	return p, nil
}
