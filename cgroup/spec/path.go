package spec

import (
	"fmt"
	"path"
	"strings"
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
	// The checks of containerd/cgroups' cgroup2.VerifyGroupPath, written out
	// because that package is not a leaf (see doc.go): a path that is not
	// clean, and one that repeats the /sys/fs/cgroup mountpoint, a common
	// mistake.
	if path.Clean(p) != p || strings.HasPrefix(p, "/sys/fs/cgroup") {
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
