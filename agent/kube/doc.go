// Package kube connects the agent to Kubernetes: an intake that watches the
// pods bound to this node and turns their resize requests into intents, and
// a status writer that reports what became of them the way Kubernetes users
// already read in-place resizes: the PodResizePending and PodResizeInProgress
// pod conditions, and Events on the pod.
//
// A resize request is either the agent's annotation on the pod
// (AnnotationResources, the default) or, opt-in, a change of a container's
// resources in the pod spec itself, as with Kubernetes in-place pod resize on
// nodes where the kubelet does not act on it. Every request becomes an
// intent for the container by pod UID and container name; its ID is derived
// from the pod UID, the container and the desired resources, so a re-list or
// a restart submits the same intents again without effect.
//
// The intake writes only what the agent owns: the two resize conditions,
// through the pods/status subresource, and Events. Its RBAC is in
// deploy/base/rbac.yaml.
package kube
