package agent

import (
	"fmt"
	"slices"
	"strings"
)

// lookupLocked finds a managed container by its key (pod:<uid>/<name>,
// container:<id>, or the cgroup path of a bare cgroup), its cgroup path, or
// its name; exact matches only. The key and the cgroup path are unique; a
// name is not (a "web" container in two pods), and a name that several
// containers share is refused, listing what tells them apart.
func (a *Agent) lookupLocked(name string) (*container, error) {
	if c, ok := a.containers[name]; ok {
		return c, nil
	}
	var named []*container
	for _, c := range a.containers {
		if c.cgroup == name {
			return c, nil
		}
		if c.name == name {
			named = append(named, c)
		}
	}
	switch len(named) {
	case 0:
		return nil, fmt.Errorf("%w: container %q", ErrNotFound, name)
	case 1:
		return named[0], nil
	}
	ways := make([]string, 0, len(named))
	for _, c := range named {
		ways = append(ways, fmt.Sprintf("%s (cgroup %s)", c.key, c.cgroup))
	}
	slices.Sort(ways)
	return nil, fmt.Errorf("%w: %d managed containers are named %q; name one by its key or its cgroup path: %s",
		ErrAmbiguous, len(named), name, strings.Join(ways, ", "))
}
