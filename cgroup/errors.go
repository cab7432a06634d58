package cgroup

import (
	"errors"
	"fmt"

	"github.com/resizer/resize-agent/cgroup/spec"
)

var (
	// ErrNotCgroup2 is returned when the mountpoint is not a cgroup v2
	// (unified) filesystem, as on hosts with a v1 or hybrid hierarchy.
	ErrNotCgroup2 = errors.New("not a cgroup v2 mount")
	// ErrMissingController is returned when the hierarchy lacks a controller
	// the agent needs (cpu or memory).
	ErrMissingController = errors.New("cgroup v2 controller not available")
	// ErrInvalidPath is returned for a cgroup path that is empty, not clean,
	// names the root itself or would escape the mountpoint.
	ErrInvalidPath = spec.ErrInvalidPath
	// ErrNotFound is returned when a cgroup directory does not exist.
	ErrNotFound = errors.New("cgroup not found")
	// ErrVerify is returned when a value read back from a cgroup file does
	// not match the value written.
	ErrVerify = errors.New("cgroup value read back does not match value written")
	// ErrParse is returned when a cgroup file holds text of an unknown form.
	ErrParse = spec.ErrParse
)

// WriteError reports which file and value a failed write was for; it
// unwraps to the kernel's error (for example syscall.EINVAL or EBUSY).
type WriteError struct {
	Path  string // cgroup path relative to the mountpoint
	File  string // e.g. "memory.max"
	Value string
	Err   error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("write %q to %s/%s: %v", e.Value, e.Path, e.File, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

var (
	// ErrNotSupported is returned by Reclaim where the kernel has no
	// memory.reclaim (before 5.19).
	ErrNotSupported = errors.New("not supported by this kernel")
	// ErrReclaimIncomplete is returned by Reclaim when the kernel could not
	// reclaim all that was asked (it answered EAGAIN); it is wrapped in a
	// *ReclaimError that says how much went.
	ErrReclaimIncomplete = errors.New("the kernel could not reclaim all that was asked")
)

// ReclaimError is a partial reclaim: Reclaimed is the drop of memory.current
// seen across the call (other charges and uncharges of the cgroup count too).
type ReclaimError struct {
	Path                 string
	Requested, Reclaimed int64
	Err                  error // ErrReclaimIncomplete, or the kernel's errno
}

func (e *ReclaimError) Error() string {
	return fmt.Sprintf("reclaim %d bytes from %s: %v (memory.current fell by %d)", e.Requested, e.Path, e.Err, e.Reclaimed)
}

func (e *ReclaimError) Unwrap() error { return e.Err }
