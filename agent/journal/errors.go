package journal

import "errors"

var (
	// ErrCorrupt is returned by Open when the file has a bad record with
	// good records after it.
	ErrCorrupt = errors.New("journal is corrupt")
	// ErrLocked is returned by Open when another process holds the state
	// directory.
	ErrLocked = errors.New("state directory is in use")
	// ErrClosed is returned for records appended after Close.
	ErrClosed = errors.New("journal is closed")
)
