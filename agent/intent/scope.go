package intent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// ErrOutsideTargetRoot is matched, with ErrInvalid, by a target whose cgroup
// lies outside the subtree the agent may change.
var ErrOutsideTargetRoot = errors.New("target outside the target root")

// DefaultTargetRoots are where the kubelet puts pods: the kubepods slice
// with the systemd cgroup driver, the kubepods cgroup with cgroupfs (as
// pkg/kubelet/cm/cgroup_manager_linux.go names them), and the same below
// the --cgroup-root=/kubelet that kind gives its nodes' kubelets.
var DefaultTargetRoots = []string{"/kubepods.slice", "/kubepods", "/kubelet.slice/kubelet-kubepods.slice", "/kubelet/kubepods"}

// Scope is the part of the cgroup tree whose cgroups intents may target:
// strictly below one of Roots (never a root itself, whose limits bound all
// the pods), or at or below one of Allowed, cgroups named one by one.
// Outside Allowed, the host's own services are refused even below a root
// of "/": a member of the API group could otherwise throttle the kubelet,
// the runtime or init (issue 15).
type Scope struct {
	Roots   []string
	Allowed []string
}

// Check returns an error matching ErrInvalid and ErrOutsideTargetRoot when
// path, a clean cgroup path, is outside the scope.
func (s Scope) Check(field, path string) error {
	for _, a := range s.Allowed {
		if path == a || spec.IsUnder(path, a) {
			return nil
		}
	}
	for _, r := range s.Roots {
		if path == r {
			return s.refuse(field, path, "is the target root itself")
		}
		if r == "/" || spec.IsUnder(path, r) {
			if sys, ok := systemCgroup(path); ok {
				return s.refuse(field, path, fmt.Sprintf("is in %s, a cgroup of the host's own services (allow it by name to resize it)", sys))
			}
			return nil
		}
	}
	return s.refuse(field, path, "is not below the target root")
}

func (s Scope) refuse(field, path, why string) error {
	msg := fmt.Sprintf("%s %s %s %s", field, path, why, strings.Join(s.Roots, " or "))
	if len(s.Allowed) > 0 {
		msg += "; allowed besides: " + strings.Join(s.Allowed, ", ")
	}
	return fmt.Errorf("%w: %w: %s", ErrInvalid, ErrOutsideTargetRoot, msg)
}

// systemCgroup reports whether path is in a cgroup systemd gives the host's
// own services and sessions: system.slice, user.slice, init.scope, or any
// service unit.
func systemCgroup(path string) (string, bool) {
	elems := strings.Split(strings.TrimPrefix(path, "/"), "/")
	switch elems[0] {
	case "system.slice", "user.slice", "init.scope":
		return "/" + elems[0], true
	}
	for i, e := range elems {
		if strings.HasSuffix(e, ".service") {
			return "/" + strings.Join(elems[:i+1], "/"), true
		}
	}
	return "", false
}
