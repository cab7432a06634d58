// Package apiserver serves the agent's local API (package api holds its
// wire types, its routes and a client): the /v1 handlers over a Service such
// as *agent.Agent, and the peer-credential check of the unix socket.
package apiserver
