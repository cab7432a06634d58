package admission

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Machine is what the node has before reservations.
type Machine struct {
	MilliCPU int64
	Memory   int64
}

// ReadMachine reads the CPU count from cpuinfo and MemTotal from meminfo
// under procRoot ("/proc" on a node; a fixture directory in tests).
func ReadMachine(procRoot string) (Machine, error) {
	var m Machine
	f, err := os.Open(filepath.Join(procRoot, "cpuinfo"))
	if err != nil {
		return m, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, _, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "processor" {
			m.MilliCPU += 1000
		}
	}
	if err := s.Err(); err != nil {
		return m, err
	}
	if m.MilliCPU == 0 {
		return m, errors.New("no processor lines in cpuinfo")
	}
	b, err := os.ReadFile(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("meminfo: unexpected MemTotal line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("meminfo: %w", err)
		}
		m.Memory = kb * 1024
	}
	if m.Memory == 0 {
		return m, errors.New("no MemTotal in meminfo")
	}
	return m, nil
}

// Allocatable is the machine, bounded by the limits of the cgroup the
// containers live under (0 = unlimited), less the reservations, never below
// zero.
func Allocatable(m Machine, limitCPU, limitMemory int64, reserved Capacity) Capacity {
	c := Capacity{MilliCPU: m.MilliCPU, Memory: m.Memory}
	if limitCPU > 0 && limitCPU < c.MilliCPU {
		c.MilliCPU = limitCPU
	}
	if limitMemory > 0 && limitMemory < c.Memory {
		c.Memory = limitMemory
	}
	c = c.sub(reserved)
	c.MilliCPU = max(c.MilliCPU, 0)
	c.Memory = max(c.Memory, 0)
	return c
}
