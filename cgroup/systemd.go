package cgroup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// Driver says who owns the cgroups the agent writes: the files themselves
// (cgroupfs) or systemd, whose units the cgroups are (the kubelet's and the
// runtime's systemd cgroup driver).
type Driver string

const (
	// DriverAuto uses systemd for a cgroup that is a systemd unit (see
	// IsSystemdLayout) when systemd runs the host, and the files otherwise.
	DriverAuto Driver = "auto"
	// DriverCgroupfs always writes the files.
	DriverCgroupfs Driver = "cgroupfs"
	// DriverSystemd sets unit properties for every cgroup that is a unit and
	// fails if systemd cannot be reached; other cgroups get the files.
	DriverSystemd Driver = "systemd"
)

// ParseDriver parses "auto", "cgroupfs" or "systemd".
func ParseDriver(s string) (Driver, error) {
	switch d := Driver(s); d {
	case DriverAuto, DriverCgroupfs, DriverSystemd:
		return d, nil
	}
	return "", fmt.Errorf("%w: cgroup driver %q (want auto, cgroupfs or systemd)", ErrInvalidValue, s)
}

var (
	// ErrSystemd is returned when systemd cannot be reached or refuses to
	// set a unit's properties.
	ErrSystemd = errors.New("systemd")
	// ErrNoSystemd is returned by the systemd driver on a host that is not
	// run by systemd.
	ErrNoSystemd = errors.New("systemd is not running on this host")
)

// WithDriver selects the cgroup driver (default DriverCgroupfs).
func WithDriver(d Driver) Option {
	return func(m *Manager) { m.sd = newSystemdDriver(d, dialSystemd) }
}

// WithSystemd is WithDriver(DriverSystemd).
func WithSystemd() Option { return WithDriver(DriverSystemd) }

// systemdRunDir exists when systemd is PID 1 (sd_booted(3)).
const systemdRunDir = "/run/systemd/system"

// How long systemd may take to apply properties to the files: it writes
// them from its event loop, after it has answered the D-Bus call.
const (
	systemdCallTimeout = 10 * time.Second
	systemdApplyWait   = 2 * time.Second
)

// unitConn is the part of a go-systemd connection the driver uses.
type unitConn interface {
	SetUnitPropertiesContext(ctx context.Context, name string, runtime bool, props ...sddbus.Property) error
	Connected() bool
	Close()
}

type systemdDriver struct {
	driver Driver
	dial   func(context.Context) (unitConn, error)
	runDir string
	// applyWait bounds the wait for systemd to write the files.
	applyWait time.Duration

	mu     sync.Mutex
	conn   unitConn
	booted *bool
}

func newSystemdDriver(d Driver, dial func(context.Context) (unitConn, error)) *systemdDriver {
	return &systemdDriver{driver: d, dial: dial, runDir: systemdRunDir, applyWait: systemdApplyWait}
}

// dialSystemd connects to systemd over the system bus, or, as root without
// a bus daemon, over its private socket (as runc and systemctl do).
func dialSystemd(ctx context.Context) (unitConn, error) {
	c, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// UsesSystemd reports whether Write sets the limits of the cgroup p as
// systemd unit properties.
func (m *Manager) UsesSystemd(p string) bool {
	clean, err := CleanPath(p)
	if err != nil {
		return false
	}
	_, ok := m.systemdUnit(clean)
	return ok
}

// Stored returns what the files of the cgroup p hold after a successful
// Write(p, r): r itself, or, where Write goes through systemd, r with the
// CPU quota systemd keeps (SystemdStored). Compare a State with it, not
// with r, to tell a change made by someone else from systemd's rounding.
func (m *Manager) Stored(p string, r Resources) Resources {
	if !m.UsesSystemd(p) {
		return r
	}
	return SystemdStored(r)
}

// systemdUnit returns the unit whose properties Write must set for the
// clean path p, if any.
func (m *Manager) systemdUnit(p string) (string, bool) {
	s := m.sd
	if s == nil || s.driver == DriverCgroupfs || !IsSystemdLayout(p) {
		return "", false
	}
	if s.driver == DriverAuto && !s.isBooted() {
		return "", false
	}
	return UnitName(p)
}

func (s *systemdDriver) isBooted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.booted == nil {
		fi, err := os.Stat(s.runDir)
		b := err == nil && fi.IsDir()
		s.booted = &b
	}
	return *s.booted
}

func (s *systemdDriver) setProperties(unit string, props []sddbus.Property) error {
	ctx, cancel := context.WithTimeout(context.Background(), systemdCallTimeout)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.conn.Connected() {
		s.conn.Close()
		s.conn = nil
	}
	if s.conn == nil {
		if s.driver == DriverSystemd {
			if fi, err := os.Stat(s.runDir); err != nil || !fi.IsDir() {
				return fmt.Errorf("%w (%s is missing)", ErrNoSystemd, s.runDir)
			}
		}
		c, err := s.dial(ctx)
		if err != nil {
			return fmt.Errorf("%w: connect: %w", ErrSystemd, err)
		}
		s.conn = c
	}
	// runtime=true: the properties go to /run/systemd/system.control, so
	// they survive a daemon-reload but not a reboot (the unit does not
	// either), as runc sets them.
	if err := s.conn.SetUnitPropertiesContext(ctx, unit, true, props...); err != nil {
		return fmt.Errorf("%w: set properties of %s: %w", ErrSystemd, unit, err)
	}
	return nil
}

// writeUnit is Write for a cgroup that is the systemd unit `unit`: it sets
// the unit's properties, then waits until the files hold what systemd
// stores for them (see SystemdStored). On a failure it puts the old values
// back the same way.
func (m *Manager) writeUnit(clean, d, unit string, r Resources) error {
	old, err := m.read(pathDir(d))
	if err != nil {
		return err
	}
	if err := m.applyUnit(clean, d, unit, r); err != nil {
		back := onlyFields(old.Resources(), r)
		if rerr := m.applyUnit(clean, d, unit, back); rerr != nil {
			return errors.Join(err, fmt.Errorf("restore %s: %w", clean, rerr))
		}
		return err
	}
	return nil
}

func (m *Manager) applyUnit(clean, d, unit string, r Resources) error {
	if m.failWrite != nil {
		for _, v := range r.Values() {
			if err := m.failWrite(v.File); err != nil {
				return &WriteError{Path: clean, File: v.File, Value: v.Data, Err: err}
			}
		}
	}
	if err := m.sd.setProperties(unit, SystemdProperties(r)); err != nil {
		return err
	}
	want := SystemdStored(r)
	deadline := time.Now().Add(m.sd.applyWait)
	for {
		err := m.verifyAll(clean, d, want)
		if err == nil || !errors.Is(err, ErrVerify) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// onlyFields returns the fields of r that are set in which.
func onlyFields(r, which Resources) Resources {
	var out Resources
	if which.CPUMax != nil {
		out.CPUMax = r.CPUMax
	}
	if which.CPUWeight != nil {
		out.CPUWeight = r.CPUWeight
	}
	if which.MemoryMax != nil {
		out.MemoryMax = r.MemoryMax
	}
	return out
}

// quotaStep is systemd's resolution of CPUQuotaPerSecUSec for cpu.max: 10ms
// of CPU time per second (1%).
const quotaStep = 10000

// usecInfinity is systemd's USEC_INFINITY and CGROUP_LIMIT_MAX.
const usecInfinity = math.MaxUint64

// QuotaPerSec converts a cpu.max quota per period (microseconds) into
// systemd's CPUQuotaPerSecUSec, rounded up to the next 10ms like runc does:
// systemd keeps the quota as a percentage of one CPU, so a finer value
// cannot be stored, and rounding up never limits the container below what
// was asked. Unlimited maps to infinity.
func QuotaPerSec(c CPUMax) uint64 {
	if c.Quota == Unlimited || c.Period == 0 {
		return usecInfinity
	}
	perSec := uint64(c.Quota) * 1000000 / c.Period
	if perSec%quotaStep != 0 {
		perSec = (perSec/quotaStep + 1) * quotaStep
	}
	return perSec
}

// SystemdProperties converts r into the unit properties systemd sets the
// same files from: CPUWeight, CPUQuotaPerSecUSec with CPUQuotaPeriodUSec
// (systemd 242 and later), MemoryMax.
func SystemdProperties(r Resources) []sddbus.Property {
	var props []sddbus.Property
	prop := func(name string, v uint64) {
		props = append(props, sddbus.Property{Name: name, Value: dbus.MakeVariant(v)})
	}
	if r.CPUWeight != nil {
		prop("CPUWeight", *r.CPUWeight)
	}
	if r.CPUMax != nil {
		prop("CPUQuotaPeriodUSec", r.CPUMax.Period)
		prop("CPUQuotaPerSecUSec", QuotaPerSec(*r.CPUMax))
	}
	if r.MemoryMax != nil {
		v := uint64(usecInfinity)
		if *r.MemoryMax != Unlimited {
			v = uint64(*r.MemoryMax)
		}
		prop("MemoryMax", v)
	}
	return props
}

// SystemdStored returns what the files hold once systemd has applied
// SystemdProperties(r): cpu.max's quota becomes QuotaPerSec scaled back to
// the period, truncated and at least 1ms, as systemd writes it
// (src/core/cgroup.c cgroup_apply_unified_cpu_quota: MAX(quota * period /
// USEC_PER_SEC, USEC_PER_MSEC)); with a period that is not a multiple of
// 100µs the truncation shows. The weight and memory.max are as given.
func SystemdStored(r Resources) Resources {
	if r.CPUMax == nil || r.CPUMax.Quota == Unlimited {
		return r
	}
	perSec := QuotaPerSec(*r.CPUMax)
	q := perSec * r.CPUMax.Period / 1000000
	if q < 1000 {
		q = 1000
	}
	c := CPUMax{Quota: int64(q), Period: r.CPUMax.Period}
	r.CPUMax = &c
	return r
}
