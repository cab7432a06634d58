package cgroup

import (
	"fmt"
	"path"
	"strings"
)

// Under the systemd cgroup driver every cgroup the kubelet and the runtime
// create is a systemd unit named after the last element of its path: pods
// are slices, containers are scopes, for example
//
//	/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
//
// A slice's name also encodes its ancestors: "a-b-c.slice" lives in
// "a-b.slice", which lives in "a.slice" (systemd.slice(5)).

const (
	suffixSlice = ".slice"
	suffixScope = ".scope"
)

// UnitName returns the systemd unit that the cgroup p is, and whether it is
// one: its last element when that names a slice or a scope. A clean path is
// expected (see CleanPath).
func UnitName(p string) (string, bool) {
	u := path.Base(p)
	if !strings.HasSuffix(u, suffixSlice) && !strings.HasSuffix(u, suffixScope) {
		return "", false
	}
	if len(u) == len(suffixSlice) || strings.ContainsRune(u, '/') {
		return "", false
	}
	return u, true
}

// ExpandSlice returns the cgroup path of a slice unit, with every ancestor
// its name implies: "kubepods-burstable-pod1.slice" is
// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
// and "-.slice" (the root slice) is "/". It refuses names systemd refuses:
// an empty part ("a--b", a leading or trailing "-") or a "/".
func ExpandSlice(slice string) (string, error) {
	if slice == "-"+suffixSlice {
		return "/", nil
	}
	name, ok := strings.CutSuffix(slice, suffixSlice)
	if !ok || name == "" {
		return "", fmt.Errorf("%w: %q is not a slice unit name", ErrInvalidPath, slice)
	}
	if strings.ContainsRune(name, '/') {
		return "", fmt.Errorf("%w: slice name %q contains a /", ErrInvalidPath, slice)
	}
	parts := strings.Split(name, "-")
	var b strings.Builder
	prefix := ""
	for i, part := range parts {
		if part == "" {
			return "", fmt.Errorf("%w: slice name %q has an empty part", ErrInvalidPath, slice)
		}
		if i > 0 {
			prefix += "-"
		}
		prefix += part
		b.WriteString("/" + prefix + suffixSlice)
	}
	return b.String(), nil
}

// ScopePath returns the cgroup path of a scope unit in a slice, the way runc
// and the kubelet lay it out with the systemd driver: for a cgroup parent
// "kubepods-burstable-pod1.slice", prefix "cri-containerd" and a container
// id, ".../kubepods-burstable-pod1.slice/cri-containerd-<id>.scope".
func ScopePath(slice, prefix, id string) (string, error) {
	dir, err := ExpandSlice(slice)
	if err != nil {
		return "", err
	}
	if id == "" || strings.ContainsAny(id, "/\x00") {
		return "", fmt.Errorf("%w: container id %q", ErrInvalidPath, id)
	}
	name := id + suffixScope
	if prefix != "" {
		name = prefix + "-" + name
	}
	return path.Join(dir, name), nil
}

// KubePodSlice returns the slice the kubelet (systemd driver) puts a pod in:
// "kubepods-pod<uid>.slice" for the Guaranteed class and
// "kubepods-<class>-pod<uid>.slice" for "burstable" and "besteffort", with
// the dashes of the UID turned into underscores (a dash would nest).
func KubePodSlice(qosClass, uid string) (string, error) {
	if uid == "" || strings.ContainsAny(uid, "/\x00") {
		return "", fmt.Errorf("%w: pod uid %q", ErrInvalidPath, uid)
	}
	u := strings.ReplaceAll(uid, "-", "_")
	switch strings.ToLower(qosClass) {
	case "guaranteed", "":
		return "kubepods-pod" + u + suffixSlice, nil
	case "burstable", "besteffort":
		return "kubepods-" + strings.ToLower(qosClass) + "-pod" + u + suffixSlice, nil
	}
	return "", fmt.Errorf("%w: unknown QoS class %q", ErrInvalidPath, qosClass)
}

// IsSystemdLayout reports whether the clean cgroup path p is laid out by
// systemd: it is a unit, and every slice on the way to it is the one the
// slice names imply (so "/kubepods/burstable/x.scope", made by hand under
// the cgroupfs driver, is not).
func IsSystemdLayout(p string) bool {
	u, ok := UnitName(p)
	if !ok {
		return false
	}
	slice, dir := u, p
	if strings.HasSuffix(u, suffixScope) {
		if dir = path.Dir(p); dir == "/" {
			return true
		}
		slice = path.Base(dir)
	}
	want, err := ExpandSlice(slice)
	return err == nil && want == dir
}
