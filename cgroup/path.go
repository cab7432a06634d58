package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2"
)

// CleanPath validates a cgroup path given relative to the mountpoint and
// returns it in canonical form ("/kubepods/pod1/c1"). A leading slash is
// optional. It rejects the empty path, the root itself, NUL bytes, "." and
// ".." elements, elements over NAME_MAX and doubled slashes: anything that is not already clean is
// refused rather than silently reinterpreted, so no path can escape the root.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidPath)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidPath, p)
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if len(p) > 4096 {
		return "", fmt.Errorf("%w: longer than 4096 bytes", ErrInvalidPath)
	}
	for _, elem := range strings.Split(p[1:], "/") {
		if elem == ".." || elem == "." {
			return "", fmt.Errorf("%w: %q has a %q element", ErrInvalidPath, p, elem)
		}
		if len(elem) > 255 {
			return "", fmt.Errorf("%w: an element of %q is longer than 255 bytes (NAME_MAX)", ErrInvalidPath, p)
		}
	}
	// VerifyGroupPath also refuses a path that is not clean and one that
	// repeats the /sys/fs/cgroup mountpoint, a common mistake.
	if err := cgroup2.VerifyGroupPath(p); err != nil {
		return "", fmt.Errorf("%w: %q is not a clean path relative to the cgroup root", ErrInvalidPath, p)
	}
	if p == "/" {
		return "", fmt.Errorf("%w: the root cgroup cannot be resized", ErrInvalidPath)
	}
	return p, nil
}

// IsUnder reports whether child is a strict descendant of parent; both must
// be clean.
func IsUnder(child, parent string) bool {
	return strings.HasPrefix(child, parent+"/") && path.Clean(child) == child
}

// parseProcCgroup returns the cgroup v2 path in the text of
// /proc/<pid>/cgroup: its one "0::" line, which must hold a path CleanPath
// accepts (a cgroup outside the agent's cgroup namespace shows as "/../..").
func parseProcCgroup(r io.Reader) (string, error) {
	s := bufio.NewScanner(r)
	var p string
	n := 0
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "0::"); ok {
			p, n = v, n+1
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("%w: /proc/<pid>/cgroup: %w", ErrParse, err)
	}
	if n != 1 || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: /proc/<pid>/cgroup has %d cgroup v2 lines (want one \"0::/path\")", ErrParse, n)
	}
	return CleanPath(p)
}
