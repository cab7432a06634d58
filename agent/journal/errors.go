package journal

import "errors"

var (
	// ErrVersion is returned by Open for a file of a format version this
	// agent does not read (written by a newer agent).
	ErrVersion = errors.New("journal format version not supported")
	// ErrLocked is returned by Open when another process holds the state
	// directory.
	ErrLocked = errors.New("state directory is in use")
	// ErrClosed is returned for records appended after Close.
	ErrClosed = errors.New("journal is closed")
)
