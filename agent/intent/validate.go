package intent

import (
	"fmt"
	"regexp"
	"unicode"
	"unicode/utf8"

	"github.com/resizer/resize-agent/cgroup/spec"
)

var (
	idPattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	uidPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)
	cidPattern = regexp.MustCompile(`^[a-f0-9]{12,64}$`)
)

// Validate checks a spec on its own, before anything is looked up, and
// returns it with its paths in canonical form and its change parsed.
func Validate(s Spec) (Spec, Change, error) {
	if s.ID != "" && !idPattern.MatchString(s.ID) {
		return s, Change{}, invalid("id %q: use up to 128 letters, digits, '.', '_' or '-'", s.ID)
	}
	if s.Target.Name == "" || len(s.Target.Name) > 253 {
		return s, Change{}, invalid("target.name is required (at most 253 bytes)")
	}
	for field, v := range map[string]string{"target.name": s.Target.Name, "target.cgroupPath": s.Target.CgroupPath, "target.podCgroupPath": s.Target.PodCgroupPath} {
		if err := CheckPrintable(field, v); err != nil {
			return s, Change{}, err
		}
	}
	ways := 0
	for _, set := range []bool{s.Target.CgroupPath != "", s.Target.PodUID != "", s.Target.ContainerID != ""} {
		if set {
			ways++
		}
	}
	if ways != 1 {
		return s, Change{}, invalid("target: give exactly one of cgroupPath, podUID (with name) or containerID")
	}
	if s.Target.PodUID != "" && !uidPattern.MatchString(s.Target.PodUID) {
		return s, Change{}, invalid("target.podUID %q is not a UID", s.Target.PodUID)
	}
	if s.Target.ContainerID != "" && !cidPattern.MatchString(s.Target.ContainerID) {
		return s, Change{}, invalid("target.containerID %q is not a container ID", s.Target.ContainerID)
	}
	p := ""
	if s.Target.CgroupPath != "" {
		var err error
		if p, err = spec.CleanPath(s.Target.CgroupPath); err != nil {
			return s, Change{}, invalid("target.cgroupPath: %v", err)
		}
		s.Target.CgroupPath = p
	}
	if s.Target.PodCgroupPath != "" {
		pp, err := spec.CleanPath(s.Target.PodCgroupPath)
		if err != nil {
			return s, Change{}, invalid("target.podCgroupPath: %v", err)
		}
		if p != "" && !spec.IsUnder(p, pp) {
			return s, Change{}, invalid("target.cgroupPath %s is not below target.podCgroupPath %s", p, pp)
		}
		s.Target.PodCgroupPath = pp
	}
	if _, err := Policies(s.ResizePolicy); err != nil {
		return s, Change{}, err
	}
	c, err := ParseChange(s.Resources)
	if err != nil {
		return s, Change{}, err
	}
	return s, c, nil
}

// CheckPrintable refuses a name that is not valid UTF-8 or holds a control
// character: C0 (tab and newline too), DEL, C1, and the bidirectional
// controls that reorder what a terminal shows. Names are printed by
// resizectl, logged and put in metric labels; an ANSI escape in one could
// recolour or rewrite an operator's terminal, a newline forge a log line.
func CheckPrintable(field, v string) error {
	for i, r := range v {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(v[i:]); n == 1 {
				return invalid("%s is not valid UTF-8 (byte %d)", field, i)
			}
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return invalid("%s has the control character %s at byte %d: names must be printable", field, fmt.Sprintf("%U", r), i)
		}
	}
	return nil
}
