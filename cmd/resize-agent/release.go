package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Memory at rest (issue 16). With 1,000 containers, RSS after a burst of
// resizes was 73 MiB: 40 MiB anonymous, of which the collector keeps up to
// the heap goal (twice the live heap) for allocations that do not come
// while the agent is at rest, and 33 MiB of the binary's own pages. Those
// are start-up's: package initialisation across client-go, gRPC and the
// protobuf registries touches text and rodata all over the binary, and the
// kernel keeps them mapped. Over 30 s at rest the agent referenced 236 KiB
// of its text (/proc/PID/clear_refs, then smaps' Referenced, in the VM).
//
// So once the intents have stood still for a while, the agent gives back
// what it holds for nothing: the heap's free pages (debug.FreeOSMemory),
// and the mappings of its binary's read-only segments (MADV_DONTNEED,
// after which the pages it runs fault back from the page cache, where the
// rest stay until the kernel wants the memory). It does so once after each
// burst, not periodically: the cost is one collection.
//
// Released pages come back as the agent allocates at rest (drift checks,
// resyncs, scrapes): the heap refilled to its goal within the bench's five
// minutes at rest with 1,000 containers (38 MiB anonymous, live heap about
// 19). So at rest the collector also runs at restGCPercent, a heap goal a
// quarter above the live heap, and goes back to the operator's GOGC within
// a poll of the first change. At rest a collection's cost is spread over
// little allocation: the runtime's forced collection every two minutes
// already runs more of them than the lower goal adds.

// restGCPercent is GOGC while the agent is at rest; an operator's lower
// GOGC, or GOGC=off, stays as it is.
const restGCPercent = 25

// releasePoll is how often the releaser looks at the activity at most: how
// soon after a burst begins GOGC is back to the operator's.
const releasePoll = time.Second

// releaser returns memory once the agent's intents have stood still for
// every.
type releaser struct {
	every    time.Duration
	activity func() uint64 // agent.Activity
	release  func() (releaseStats, error)
	log      *slog.Logger
	done     func() // counts a release (the metric)
	// setGCPercent is debug.SetGCPercent (nil), or a test's.
	setGCPercent func(int) int
}

// releaseStats says what one release did, for the log.
type releaseStats struct {
	rssBefore, rssAfter int64 // bytes
	unmapped            int64 // bytes of the binary's pages unmapped
}

// run releases at start-up's end and after each burst, once the activity
// has not changed for every, and holds the collector at restGCPercent
// until it changes again.
func (r *releaser) run(ctx context.Context) {
	setGC := r.setGCPercent
	if setGC == nil {
		setGC = debug.SetGCPercent
	}
	poll := min(r.every, releasePoll)
	t := time.NewTicker(poll)
	defer t.Stop()
	last, changed, pending := r.activity(), time.Now(), true // start-up is a burst too
	resting, restoreTo := false, 0
	defer func() {
		if resting {
			setGC(restoreTo)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if a := r.activity(); a != last {
				last, changed, pending = a, now, true
				if resting {
					setGC(restoreTo)
					resting = false
				}
				continue
			}
			if !pending || now.Sub(changed) < r.every {
				continue
			}
		}
		pending = false
		st, err := r.release()
		if err != nil {
			r.log.Warn("releasing memory at rest", "err", err)
		}
		if prev := setGC(restGCPercent); prev > restGCPercent {
			resting, restoreTo = true, prev
		} else {
			setGC(prev) // the operator's is lower, or off
		}
		if r.done != nil {
			r.done()
		}
		r.log.Debug("released memory at rest", "rssBefore", st.rssBefore, "rssAfter", st.rssAfter, "binaryUnmapped", st.unmapped)
	}
}

// disableHugePages turns transparent huge pages off for this process
// (PR_SET_THP_DISABLE). Where the kernel's THP setting is "always" with
// khugepaged's default max_ptes_none (511: Debian's and RHEL's kernels),
// khugepaged collapses any 2 MiB of the heap with one page in use into a
// huge page, and gives back the pages the runtime returned: in the VM
// (Debian 6.1), eBPF on, the agent at rest went from 9 to 18.3 MiB
// anonymous within 30 s, 16 MiB of it huge pages, and stayed at 7.5 MiB
// with this. The Go GC guide describes the problem (go.dev/issue/64332);
// its GODEBUG=disablethp is read before main and cannot be set from here.
// A heap of tens of MiB gains nothing from huge pages.
func disableHugePages(log *slog.Logger) {
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		log.Warn("transparent huge pages stay on for the agent", "err", err)
	}
}

// releaseMemory returns the heap's free pages to the kernel and unmaps the
// binary's read-only segments.
func releaseMemory() (releaseStats, error) {
	var st releaseStats
	st.rssBefore, _ = residentBytes()
	debug.FreeOSMemory()
	n, err := unmapExecutable()
	st.unmapped = n
	st.rssAfter, _ = residentBytes()
	return st, err
}

// residentBytes is this process's RSS.
func residentBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, fmt.Errorf("statm: %q", b)
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	return pages * int64(os.Getpagesize()), err
}

// unmapExecutable drops the page-table entries of this process's binary
// where that loses nothing: read-only private mappings of the executable
// file with no page of their own (smaps' Anonymous: 0). Such a mapping's
// every page is the file's, so the next access maps it again from the page
// cache. A writable mapping (data) or one with private copies (a dynamic
// binary's relocated RELRO, a debugger's breakpoint) is left alone.
func unmapExecutable() (int64, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	maps, err := parseSmaps(f, uint64(reflect.ValueOf(unmapExecutable).Pointer()))
	f.Close()
	if err != nil {
		return 0, err
	}
	var n int64
	var errs []error
	for _, m := range maps {
		if !m.releasable() {
			continue
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); e != 0 {
			errs = append(errs, fmt.Errorf("madvise %x-%x: %w", m.start, m.end, e))
			continue
		}
		n += m.rss
	}
	return n, errors.Join(errs...)
}

// mapping is one entry of /proc/self/smaps, of the executable's file.
type mapping struct {
	start, end uint64
	perms      string
	rss, anon  int64 // bytes; anon: private copies of the file's pages
}

func (m mapping) releasable() bool {
	return len(m.perms) == 4 && m.perms[0] == 'r' && m.perms[1] == '-' && m.perms[3] == 'p' && m.anon == 0 && m.rss > 0
}

// parseSmaps returns the mappings of the file that holds the code at
// anchor (this binary), with their Rss and Anonymous. The file is known by
// the device and inode smaps gives the mapping around anchor, not by
// stat(/proc/self/exe): in a container the binary is on overlayfs, whose
// mappings are of the file in the layer below, another device and inode.
func parseSmaps(r io.Reader, anchor uint64) ([]mapping, error) {
	type ident struct{ dev, ino string }
	var all []mapping
	var ids []ident
	var cur *mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if k := f[0]; k[len(k)-1] == ':' { // a field of the current mapping
			if cur == nil || len(f) < 2 {
				continue
			}
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "Rss:":
				cur.rss = v << 10
			case "Anonymous:":
				cur.anon = v << 10
			}
			continue
		}
		// A header: start-end perms offset major:minor inode [path].
		if len(f) < 5 {
			return nil, fmt.Errorf("smaps: unexpected line %q", line)
		}
		var start, end uint64
		if _, err := fmt.Sscanf(f[0], "%x-%x", &start, &end); err != nil {
			return nil, fmt.Errorf("smaps: range in %q: %w", line, err)
		}
		all = append(all, mapping{start: start, end: end, perms: f[1]})
		ids = append(ids, ident{f[3], f[4]})
		cur = &all[len(all)-1]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	i := slices.IndexFunc(all, func(m mapping) bool { return m.start <= anchor && anchor < m.end })
	if i < 0 || ids[i].ino == "0" {
		return nil, fmt.Errorf("smaps: no file mapping holds this binary's code at %#x", anchor)
	}
	var out []mapping
	for j, m := range all {
		if ids[j] == ids[i] {
			out = append(out, m)
		}
	}
	return out, nil
}
