package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

const capsChildEnv = "RESIZE_AGENT_TEST_CAPS_CHILD"

// capsChild runs the daemon with dropCaps as main does, on the fake tree in
// root, and prints its capability sets once it is ready; it serves until
// its stdin closes.
func capsChild(root string) {
	dir, _ := os.MkdirTemp("", "caps")
	defer os.RemoveAll(dir)
	o := DefaultOptions()
	o.StateDir = filepath.Join(dir, "state")
	o.CgroupRoot, o.skipFSCheck = root, true
	o.Socket = filepath.Join(dir, "agent.sock")
	o.MetricsAddress = ""
	o.BPF = "off"
	o.CPUAllocatable, o.MemoryAllocatable = "2", "4Gi"
	o.dropCaps = true
	ctx, cancel := context.WithCancel(context.Background())
	o.onReady = func(string) {
		st, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "Cap") {
				fmt.Println(l)
			}
		}
		// A privileged act it no longer may do: give a file away.
		f := filepath.Join(dir, "chown")
		os.WriteFile(f, nil, 0o600)
		fmt.Printf("chown: %v\n", os.Chown(f, 12345, 12345))
		fmt.Printf("socket: %s\n", o.Socket)
		go func() { bufio.NewReader(os.Stdin).ReadString('\n'); cancel() }()
	}
	if err := run(ctx, o, quiet); err != nil {
		fmt.Printf("run: %v\n", err)
		os.Exit(1)
	}
}

// TestDropsCapabilities starts the daemon in a child process as main does:
// once it serves, only CAP_DAC_OVERRIDE is left (no eBPF here) and a
// privileged act fails, yet a resize still writes the root-owned files.
func TestDropsCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test checks what root loses")
	}
	root := cgrouptest.FakeTree(t, "/kubepods/pod1/web")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), capsChildEnv+"="+root)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	got := map[string]string{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		got[k] = strings.TrimSpace(v)
		if k == "socket" || k == "run" {
			break
		}
	}
	if got["socket"] == "" {
		t.Fatalf("child did not start: %v", got)
	}
	const dacOverride = 1 << 1 // CAP_DAC_OVERRIDE
	for set, want := range map[string]uint64{"CapInh": 0, "CapAmb": 0, "CapPrm": dacOverride, "CapEff": dacOverride, "CapBnd": dacOverride} {
		v, err := strconv.ParseUint(got[set], 16, 64)
		if err != nil || v != want {
			t.Errorf("%s = %q after start-up, want %x", set, got[set], want)
		}
	}
	if !strings.Contains(got["chown"], "operation not permitted") {
		t.Errorf("chown to another user after the drop: %q, want EPERM", got["chown"])
	}
	c := api.NewClient(got["socket"])
	s := intent.Spec{Target: intent.Target{Name: "web", CgroupPath: "/kubepods/pod1/web"}}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("300m")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	it, _, err := c.Submit(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if it, err = c.WaitSettled(ctx, it.ID); err != nil || it.Status.State != intent.Completed {
		t.Fatalf("resize after the drop: %+v %v", it.Status, err)
	}
	if v := cgrouptest.ReadFile(t, root, "/kubepods/pod1/web", "cpu.max"); v != "30000 100000" {
		t.Errorf("cpu.max = %s", v)
	}
}
