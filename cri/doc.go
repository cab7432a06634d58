// Package cri is the only package of the agent that talks to the container
// runtime. It is a client of the Kubernetes CRI runtime service (v1) over
// the runtime's unix socket (containerd's by default): it finds a container
// by pod UID and container name or by ID, reads its state and resources,
// updates its resources with UpdateContainerResources so that the runtime's
// own record matches what the agent writes, and restarts it with new
// resources when a resize policy says RestartContainer.
package cri
