// Package api is the agent's local HTTP/JSON API, versioned under /v1: its
// wire types and a client for it. The server (package apiserver) is normally
// reached over a unix socket. This package is a leaf: it links neither the
// agent nor gRPC, CRI, dbus or cilium/ebpf, so a client stays small.
//
//	POST   /v1/intents               submit an intent (202; 200 for a repeat of the same id)
//	POST   /v1/intents?wait=30s      the same, answered once it has settled (at most 5m)
//	GET    /v1/intents[?container=&state=]
//	GET    /v1/intents/{id}
//	GET    /v1/containers            managed containers with live cgroup values
//	DELETE /v1/containers/{name}     stop managing a container
//	GET    /v1/node                  allocatable, allocated, free
//	GET    /v1/watch[?intent=&container=]   newline-delimited JSON events
//
// Errors are JSON objects {"error": "...", "reason": "..."} with a 4xx or
// 5xx status; a rejected request changes nothing.
package api
