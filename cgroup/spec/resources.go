package spec

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Unlimited stands for "max" in cpu.max (quota) and memory.max.
const Unlimited int64 = -1

// Files the agent writes and reads.
const (
	FileCPUMax        = "cpu.max"
	FileCPUWeight     = "cpu.weight"
	FileMemoryMax     = "memory.max"
	FileMemoryCurrent = "memory.current"
)

// CPUMax is the content of cpu.max. Quota is in microseconds per Period, or
// Unlimited.
type CPUMax struct {
	Quota  int64
	Period uint64
}

func (c CPUMax) String() string {
	q := "max"
	if c.Quota != Unlimited {
		q = strconv.FormatInt(c.Quota, 10)
	}
	return q + " " + strconv.FormatUint(c.Period, 10)
}

// ParseCPUMax parses the text of cpu.max ("max 100000", "50000 100000"; the
// period is optional on write and defaults to DefaultPeriod).
func ParseCPUMax(s string) (CPUMax, error) {
	f := strings.Fields(s)
	if len(f) < 1 || len(f) > 2 {
		return CPUMax{}, fmt.Errorf("%w: cpu.max %q", ErrParse, s)
	}
	c := CPUMax{Quota: Unlimited, Period: DefaultPeriod}
	if f[0] != "max" {
		q, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || q < 0 {
			return CPUMax{}, fmt.Errorf("%w: cpu.max quota %q", ErrParse, f[0])
		}
		c.Quota = q
	}
	if len(f) == 2 {
		p, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return CPUMax{}, fmt.Errorf("%w: cpu.max period %q", ErrParse, f[1])
		}
		c.Period = p
	}
	return c, nil
}

// Resources is a set of limits to write to one cgroup. A nil field is left
// as it is.
type Resources struct {
	CPUMax    *CPUMax
	CPUWeight *uint64
	MemoryMax *int64 // bytes, or Unlimited
}

// Value is one file/content pair of a Resources.
type Value struct {
	File string
	Data string
}

// Validate reports values the kernel would reject, before anything is written.
func (r Resources) Validate() error {
	if c := r.CPUMax; c != nil {
		if c.Period < MinPeriod || c.Period > MaxPeriod {
			return fmt.Errorf("cpu.max period %d outside [%d, %d]", c.Period, MinPeriod, MaxPeriod)
		}
		if c.Quota != Unlimited && c.Quota < MinQuotaPeriod {
			return fmt.Errorf("cpu.max quota %d below the minimum %d", c.Quota, MinQuotaPeriod)
		}
	}
	if w := r.CPUWeight; w != nil && (*w < 1 || *w > 10000) {
		return fmt.Errorf("cpu.weight %d outside [1, 10000]", *w)
	}
	if m := r.MemoryMax; m != nil && *m != Unlimited && *m < 0 {
		return fmt.Errorf("memory.max %d is negative", *m)
	}
	return nil
}

// Values lists the files r writes, in write order.
func (r Resources) Values() []Value {
	var v []Value
	if r.CPUWeight != nil {
		v = append(v, Value{FileCPUWeight, strconv.FormatUint(*r.CPUWeight, 10)})
	}
	if r.CPUMax != nil {
		v = append(v, Value{FileCPUMax, r.CPUMax.String()})
	}
	if r.MemoryMax != nil {
		v = append(v, Value{FileMemoryMax, FormatMax(*r.MemoryMax)})
	}
	return v
}

// Only returns the part of r that writes file.
func (r Resources) Only(file string) Resources {
	switch file {
	case FileCPUWeight:
		return Resources{CPUWeight: r.CPUWeight}
	case FileCPUMax:
		return Resources{CPUMax: r.CPUMax}
	case FileMemoryMax:
		return Resources{MemoryMax: r.MemoryMax}
	}
	return Resources{}
}

// IsZero reports whether r writes nothing.
func (r Resources) IsZero() bool { return len(r.Values()) == 0 }

// FormatMax is the text of memory.max (or memory.high) for v: "max" for
// Unlimited.
func FormatMax(v int64) string {
	if v == Unlimited {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// ParseMax parses the text of memory.max, memory.high or memory.current.
func ParseMax(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return Unlimited, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: %q", ErrParse, s)
	}
	return v, nil
}

// State is what the agent reads of one cgroup.
type State struct {
	CPUMax        CPUMax
	CPUWeight     uint64
	MemoryMax     int64 // bytes, or Unlimited
	MemoryCurrent int64 // bytes
}

// Resources returns the writable part of s, to restore it later.
func (s State) Resources() Resources {
	c, w, m := s.CPUMax, s.CPUWeight, s.MemoryMax
	return Resources{CPUMax: &c, CPUWeight: &w, MemoryMax: &m}
}

// Matches reports whether s holds every value r sets, allowing for the
// kernel's rounding of memory.max down to whole pages.
func (s State) Matches(r Resources, pageSize int64) bool {
	if r.CPUMax != nil && s.CPUMax != *r.CPUMax {
		return false
	}
	if r.CPUWeight != nil && s.CPUWeight != *r.CPUWeight {
		return false
	}
	if r.MemoryMax != nil && s.MemoryMax != PageAlign(*r.MemoryMax, pageSize) {
		return false
	}
	return true
}

// PageAlign is what the kernel stores for a memory.max write: the byte count
// rounded down to whole pages, and Unlimited ("max") from the page
// counter's maximum up (linux mm/page_counter.c page_counter_memparse takes
// min(bytes/PAGE_SIZE, PAGE_COUNTER_MAX), and memory.max shows
// PAGE_COUNTER_MAX as "max"; PAGE_COUNTER_MAX is LONG_MAX/PAGE_SIZE on
// 64-bit, include/linux/page_counter.h).
func PageAlign(v, pageSize int64) int64 {
	if v == Unlimited || pageSize <= 0 {
		return v
	}
	if v/pageSize >= math.MaxInt64/pageSize {
		return Unlimited
	}
	return v / pageSize * pageSize
}
