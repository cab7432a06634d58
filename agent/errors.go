package agent

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound is returned for an unknown intent or container, or a
	// target cgroup that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned when a submission contradicts what the agent
	// holds: an intent ID reused with another spec, or a cgroup path already
	// managed under another name or pod.
	ErrConflict = errors.New("conflict")
	// ErrShuttingDown is returned once Close has begun.
	ErrShuttingDown = errors.New("agent is shutting down")
)

// ErrRuntime is returned when the container runtime fails a request.
var ErrRuntime = errors.New("container runtime error")

// ErrJournal is returned when an intent cannot be journaled: it is then
// not accepted.
var ErrJournal = errors.New("journal error")

// errClosing is why the writes in flight stop waiting (a reclaim) once
// Close begins; it ends up in the message of the intent that gave up.
var errClosing = errors.New("the agent is shutting down")

// ErrAmbiguous is returned when a container is named by a name several
// managed containers share; it matches ErrConflict too.
var ErrAmbiguous = fmt.Errorf("%w: ambiguous container name", ErrConflict)
