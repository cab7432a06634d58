package spec

import "errors"

var (
	// ErrInvalidPath is returned for a cgroup path that is empty, not clean,
	// names the root itself or would escape the mountpoint.
	ErrInvalidPath = errors.New("invalid cgroup path")
	// ErrParse is returned when a cgroup file holds text of an unknown form.
	ErrParse = errors.New("cannot parse cgroup file")
)
