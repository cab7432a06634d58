package main

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// defaultContainerAnnotation names the container kubectl picks when none
// is given (kubectl's k8s.io/kubectl/pkg/cmd/util/podcmd).
const defaultContainerAnnotation = "kubectl.kubernetes.io/default-container"

// target is the container to resize: a regular container, or a sidecar
// (an init container with restartPolicy Always, which 1.33+ resizes in
// place as well).
type target struct {
	name    string
	sidecar bool
	current corev1.ResourceRequirements
}

// pickContainer finds the container -c names or, without -c, the only
// container, or the one the default-container annotation names.
func pickContainer(p *corev1.Pod, name string) (target, error) {
	var names []string
	for _, c := range p.Spec.Containers {
		names = append(names, c.Name)
	}
	for _, c := range p.Spec.InitContainers {
		if isSidecar(c) {
			names = append(names, c.Name)
		}
	}
	if name == "" {
		switch a := p.Annotations[defaultContainerAnnotation]; {
		case a != "":
			name = a
		case len(p.Spec.Containers) == 1:
			name = p.Spec.Containers[0].Name
		default:
			return target{}, usagef("pod %s has %d containers, pick one with -c: %s", p.Name, len(names), strings.Join(names, ", "))
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return target{name: name, current: c.Resources}, nil
		}
	}
	for _, c := range p.Spec.InitContainers {
		if c.Name != name {
			continue
		}
		if !isSidecar(c) {
			return target{}, usagef("container %s of pod %s is an init container that runs to completion: it cannot be resized in place", name, p.Name)
		}
		return target{name: name, sidecar: true, current: c.Resources}, nil
	}
	return target{}, usagef("pod %s has no container %q; its containers: %s", p.Name, name, strings.Join(names, ", "))
}

func isSidecar(c corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// desired is the container's resources once the changes are applied to
// current; it refuses a request above its limit and a resize that would
// change nothing.
func desired(current corev1.ResourceRequirements, changes []change) (corev1.ResourceRequirements, error) {
	d := *current.DeepCopy()
	same := 0
	for _, c := range changes {
		l := &d.Requests
		if c.limit {
			l = &d.Limits
		}
		if old, ok := (*l)[c.resource]; ok && old.Cmp(c.value) == 0 {
			same++
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[c.resource] = c.value
	}
	if same == len(changes) {
		return d, usagef("nothing to change: the container already has %s", describe(changes))
	}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := d.Requests[res]
		lim, hasLim := d.Limits[res]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			return d, usagef("%s request %s would be above its limit %s", res, req.String(), lim.String())
		}
	}
	return d, nil
}

func describe(changes []change) string {
	var parts []string
	for _, c := range changes {
		kind := "request"
		if c.limit {
			kind = "limit"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s", c.resource, kind, c.value.String()))
	}
	return strings.Join(parts, ", ")
}

// resizePatch is the strategic-merge patch `kubectl patch --subresource
// resize` would send for these changes: the container by name (the merge
// key of spec.containers and spec.initContainers) and only the values
// given, so that the API server keeps every other request and limit.
func resizePatch(t target, changes []change) ([]byte, error) {
	res := map[string]map[string]string{}
	for _, c := range changes {
		kind := "requests"
		if c.limit {
			kind = "limits"
		}
		if res[kind] == nil {
			res[kind] = map[string]string{}
		}
		res[kind][string(c.resource)] = c.value.String()
	}
	list := "containers"
	if t.sidecar {
		list = "initContainers"
	}
	return json.Marshal(map[string]any{
		"spec": map[string]any{
			list: []any{map[string]any{"name": t.name, "resources": res}},
		},
	})
}
