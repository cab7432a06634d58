// Package node holds the end-to-end tests that run against a real
// Kubernetes node: the agent deployed from deploy/ with kustomize, its
// DaemonSet pod Running and Ready, resizectl through kubectl exec, metrics
// through a port-forward, and an in-place resize by the kubelet
// (kubectl patch --subresource resize) beside the agent, timed.
//
// The tests take a kubeconfig (RESIZE_AGENT_NODE_KUBECONFIG) and kubectl
// ($KUBECTL or kubectl on PATH). Without a kubeconfig they skip, saying
// so; with RESIZE_AGENT_REQUIRE_NODE=1 they fail instead. Two places give
// them a cluster: test/node/run.sh (make test-node) brings up a node in the
// VM harness with a control plane on the host, and deploy/kind/e2e.sh runs
// them against a kind cluster.
package node
