package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// CleanPath and IsUnder are spec's: pure, and needed by API clients too.
var (
	CleanPath = spec.CleanPath
	IsUnder   = spec.IsUnder
)

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
