package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/resizer/resize-agent/agent/api"
)

// daemon is a running resize-agent process.
type daemon struct {
	cmd    *exec.Cmd
	socket string
	client *api.Client
	bpf    string
	log    *os.File
}

// startDaemon runs the real daemon binary with admission wide enough for
// every benchmark cgroup, and waits until its API answers.
func startDaemon(bpf, socket, logPath, stateDir string) (*daemon, error) {
	_ = os.Remove(socket)
	// Each daemon its own journal, so that none recovers another's containers.
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("resize-agent", "--socket", socket, "--metrics-address", "",
		"--cpu-allocatable", "100000", "--memory-allocatable", "1Ti", "--bpf", bpf, "--state-dir", stateDir,
		"--target-root", "/") // the benchmarks' cgroups are not all below kubepods
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting resize-agent: %w", err)
	}
	d := &daemon{cmd: cmd, socket: socket, client: api.NewClient(socket), bpf: bpf, log: lf}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := d.client.Node(ctx)
		cancel()
		if err == nil {
			return d, nil
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			d.stop()
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("resize-agent did not come up: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pid is the daemon's, or this process's for an agent run in-process.
func (d *daemon) pid() int {
	if d.cmd == nil {
		return os.Getpid()
	}
	return d.cmd.Process.Pid
}

func (d *daemon) stop() {
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
	d.log.Close()
}

// procSample is a process's CPU time and memory at one moment.
type procSample struct {
	at       time.Time
	cpuTicks int64 // utime + stime, in clock ticks
	rssKiB   int64
	hwmKiB   int64
	// VmRSS splits into anonymous memory (the heap, stacks: what the agent
	// holds), file pages and shared memory. The mapped binary's pages are
	// file pages on a node's disk, but shmem in the VM, whose root is a
	// tmpfs: there they are ~31 MiB of the RSS that are not the agent's.
	anonKiB, fileKiB, shmemKiB int64
}

// clockTicks is USER_HZ, 100 on every Linux architecture the agent runs on.
const clockTicks = 100

func sample(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command name may hold spaces: fields start after the last ')'.
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	s.cpuTicks = ut + st
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			s.rssKiB = n
		case "VmHWM":
			s.hwmKiB = n
		case "RssAnon":
			s.anonKiB = n
		case "RssFile":
			s.fileKiB = n
		case "RssShmem":
			s.shmemKiB = n
		}
	}
	return s, sc.Err()
}

// cpuPercent is the CPU used between a and b, in percent of one CPU.
func cpuPercent(a, b procSample) float64 {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return float64(b.cpuTicks-a.cpuTicks) / clockTicks / wall * 100
}
