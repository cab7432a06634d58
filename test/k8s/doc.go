// Package k8s holds the Kubernetes integration tests: the intake and its
// status against a real kube-apiserver and etcd started on loopback
// (test/k8s/run.sh builds them from the Go module proxy and runs the
// tests), and the checks of the manifests under deploy/.
package k8s
