package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestParseSmaps: only the executable's read-only private mappings without
// private copies are released; its data, a relocated RELRO with private
// pages, a writable one and other files' mappings are not.
func TestParseSmaps(t *testing.T) {
	smaps := `00400000-00402000 r--p 00000000 fd:01 4242                               /usr/bin/resize-agent
Size:                  8 kB
Rss:                   8 kB
Anonymous:             0 kB
00402000-01f88000 r-xp 00002000 fd:01 4242                               /usr/bin/resize-agent
Size:              28184 kB
Rss:               14748 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
01f88000-041ac000 r--p 01b88000 fd:01 4242                               /usr/bin/resize-agent
Rss:               17620 kB
Anonymous:             0 kB
041ac000-041b0000 r--p 03dab000 fd:01 4242                               /usr/bin/resize-agent
Rss:                  16 kB
Anonymous:            12 kB
041b0000-04260000 rw-p 03daf000 fd:01 4242                               /usr/bin/resize-agent
Rss:                 700 kB
Anonymous:           120 kB
04260000-04270000 r--p 00000000 fd:02 4242                               /other/device/same/inode
Rss:                  64 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 99                         /usr/lib/libc.so.6
Rss:                 512 kB
Anonymous:             0 kB
c000000000-c004000000 rw-p 00000000 00:00 0
Rss:                8192 kB
Anonymous:          8192 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  20 kB
`
	maps, err := parseSmaps(strings.NewReader(smaps), 0x500000) // in the text
	if err != nil {
		t.Fatal(err)
	}
	if len(maps) != 5 {
		t.Fatalf("got %d mappings of the executable, want 5: %+v", len(maps), maps)
	}
	var released []uint64
	var bytes int64
	for _, m := range maps {
		if m.releasable() {
			released = append(released, m.start)
			bytes += m.rss
		}
	}
	if want := []uint64{0x400000, 0x402000, 0x1f88000}; !equalU64(released, want) {
		t.Errorf("released mappings at %x, want %x", released, want)
	}
	if bytes != (8+14748+17620)<<10 {
		t.Errorf("released %d bytes", bytes)
	}
	if _, err := parseSmaps(strings.NewReader("garbage\n"), 0x500000); err == nil {
		t.Error("a malformed header was accepted")
	}
	if _, err := parseSmaps(strings.NewReader(smaps), 0xc000001000); err == nil {
		t.Error("an anchor in the heap named a binary")
	}
	if _, err := parseSmaps(strings.NewReader(smaps), 0x10); err == nil {
		t.Error("an anchor outside every mapping named a binary")
	}
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestUnmapExecutable runs the real thing on this test binary: its text is
// unmapped, and the code that runs next still runs, faulted back from the
// file.
func TestUnmapExecutable(t *testing.T) {
	text := func() int64 {
		f, err := os.Open("/proc/self/smaps")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		maps, err := parseSmaps(f, uint64(reflect.ValueOf(TestUnmapExecutable).Pointer()))
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, m := range maps {
			if m.perms == "r-xp" {
				n += m.rss
			}
		}
		return n
	}
	before := text()
	if before == 0 {
		t.Fatal("no resident text in this test binary's mappings")
	}
	st, err := releaseMemory()
	if err != nil {
		t.Fatal(err)
	}
	after := text()
	t.Logf("text resident %d KiB -> %d KiB; unmapped %d KiB; RSS %d -> %d KiB",
		before>>10, after>>10, st.unmapped>>10, st.rssBefore>>10, st.rssAfter>>10)
	if st.unmapped < before || after >= before/2 || st.rssAfter >= st.rssBefore {
		t.Errorf("text resident %d -> %d bytes, unmapped %d, RSS %d -> %d: the binary's pages were not released",
			before, after, st.unmapped, st.rssBefore, st.rssAfter)
	}
	// Code and data that were unmapped work as before.
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString(regexp.MustCompile(`^a+$`).ReplaceAllString(strings.Repeat("a", i%7+1), "b"))
	}
	if sb.Len() != 1000 {
		t.Errorf("after the release, %d", sb.Len())
	}
}

// TestReleaserOncePerBurst: a release at start-up's end, none while intents
// change, one once they stand still, none again until they change; the
// collector at restGCPercent at rest, back to the operator's GOGC on the
// first change and when the releaser stops.
func TestReleaserOncePerBurst(t *testing.T) {
	var activity atomic.Uint64
	var mu sync.Mutex
	var at []uint64           // the activity at each release
	gogc, gcs := 100, []int{} // GOGC now, and each value set
	r := &releaser{every: 200 * time.Millisecond, activity: activity.Load, log: quiet,
		release: func() (releaseStats, error) {
			mu.Lock()
			at = append(at, activity.Load())
			mu.Unlock()
			return releaseStats{}, nil
		},
		setGCPercent: func(p int) int {
			mu.Lock()
			defer mu.Unlock()
			prev := gogc
			gogc, gcs = p, append(gcs, p)
			return prev
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx); close(done) }()
	state := func() ([]uint64, int) {
		mu.Lock()
		defer mu.Unlock()
		return append([]uint64(nil), at...), gogc
	}
	waitFor := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for got, _ := state(); len(got) < n; got, _ = state() {
			if time.Now().After(deadline) {
				t.Fatalf("%d releases, want %d", len(got), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(1) // start-up
	time.Sleep(300 * time.Millisecond)
	if got, gc := state(); len(got) != 1 || gc != restGCPercent {
		t.Fatalf("at rest: releases %v, GOGC %d; want 1 release, GOGC %d", got, gc, restGCPercent)
	}
	// A burst: while the activity changes at every tick, no release, and
	// the operator's GOGC.
	for range 10 {
		activity.Add(1)
		time.Sleep(10 * time.Millisecond)
	}
	if got, _ := state(); len(got) != 1 {
		t.Fatalf("released during the burst: %v", got)
	}
	waitFor(2)
	time.Sleep(300 * time.Millisecond)
	if got, gc := state(); len(got) != 2 || got[1] != 10 || gc != restGCPercent {
		t.Errorf("releases at activity %v (want [0 10]), GOGC %d", got, gc)
	}
	cancel()
	<-done
	mu.Lock()
	if want := []int{restGCPercent, 100, restGCPercent, 100}; !slices.Equal(gcs, want) {
		t.Errorf("GOGC set to %v, want %v: at rest, back on the first change, at rest, back when stopped", gcs, want)
	}
	mu.Unlock()

	// An operator's GOGC below restGCPercent, or off, is left alone.
	for _, op := range []int{10, -1} {
		gogc, gcs = op, nil
		at = nil
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.run(ctx); close(done) }()
		waitFor(1)
		time.Sleep(300 * time.Millisecond)
		if _, gc := state(); gc != op {
			t.Errorf("operator's GOGC %d became %d at rest", op, gc)
		}
		cancel()
		<-done
	}
}

// TestRunReleasesAtRest: the daemon releases once it is ready and at rest,
// and says so in its metrics; "off" turns it off.
func TestRunReleasesAtRest(t *testing.T) {
	for _, after := range []string{"50ms", "off"} {
		t.Run(after, func(t *testing.T) {
			o := DefaultOptions()
			o.StateDir = t.TempDir()
			o.Socket = filepath.Join(t.TempDir(), "agent.sock")
			o.MetricsAddress = "127.0.0.1:0"
			o.ReleaseMemoryAfter = after
			d := startDaemon(t, o, "/kubepods/pod1/web")
			scrape := func() string {
				resp, err := http.Get("http://" + d.addrs["metrics"] + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return string(b)
			}
			released := regexp.MustCompile(`(?m)^resize_agent_memory_releases_total [1-9]`)
			if after == "off" {
				time.Sleep(300 * time.Millisecond)
				if m := scrape(); strings.Contains(m, "resize_agent_memory_releases_total") {
					t.Error("released with --release-memory-after=off")
				}
			} else {
				deadline := time.Now().Add(10 * time.Second)
				for !released.MatchString(scrape()) {
					if time.Now().After(deadline) {
						t.Fatal("no release at rest within 10s")
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			d.stop()
		})
	}
}

// TestDisableHugePages: the process asks the kernel for no transparent huge
// pages, and the kernel says it holds.
func TestDisableHugePages(t *testing.T) {
	disableHugePages(quiet)
	got, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0)
	if err != nil || got != 1 {
		t.Fatalf("PR_GET_THP_DISABLE = %d, %v; want 1", got, err)
	}
}

// releaseHelperEnv makes the test binary, run again from an overlayfs
// mount, release its memory and print how much of its binary it unmapped.
const releaseHelperEnv = "RESIZE_AGENT_TEST_RELEASE_HELPER"

func TestReleaseHelper(t *testing.T) {
	if os.Getenv(releaseHelperEnv) == "" {
		t.Skip("runs only as TestUnmapExecutableOverlay's child")
	}
	st, err := releaseMemory()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("unmapped=%d\n", st.unmapped)
}

// TestUnmapExecutableOverlay: in a container the binary is on overlayfs,
// where stat(/proc/self/exe) and the mappings name different files (the
// overlay's and the layer's). The release must find its mappings there
// too: the test binary, copied into an overlay's lower layer, runs from the
// merged mount and unmaps its pages.
func TestUnmapExecutableOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an overlayfs needs root (make test runs this package as root)")
	}
	dir := t.TempDir()
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lower", "agent.test"), self, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	merged := filepath.Join(dir, "merged")
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mounting an overlayfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	var exe, real unix.Stat_t
	if err := unix.Stat(filepath.Join(merged, "agent.test"), &exe); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dir, "lower", "agent.test"), &real); err != nil {
		t.Fatal(err)
	}
	t.Logf("overlay file %d:%d, layer file %d:%d", exe.Dev, exe.Ino, real.Dev, real.Ino)
	cmd := exec.Command(filepath.Join(merged, "agent.test"), "-test.run=^TestReleaseHelper$", "-test.v")
	cmd.Env = append(os.Environ(), releaseHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := regexp.MustCompile(`unmapped=(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the helper did not say what it unmapped:\n%s", out)
	}
	if n, _ := strconv.ParseInt(string(m[1]), 10, 64); n < 1<<20 {
		t.Errorf("run from an overlayfs, the binary unmapped %d bytes of itself:\n%s", n, out)
	}
}
