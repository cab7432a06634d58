// Package actuate carries out one admitted resize: it orders the writes of
// a container's cgroup and its pod's, writes them through the container
// runtime or the files, verifies them, reclaims memory before a decrease
// below usage, restarts a container whose resize policy asks for it, rolls
// back what it wrote when a step fails, and reports what happened.
//
// It decides nothing and keeps nothing between calls: the agent's core
// admits, queues and records intents (package agent) and hands this package
// a Job; the Result says what the files hold now. The split follows the
// kubelet's, where pkg/kubelet/allocation admits and records what was
// allocated and kuberuntime's doPodResizeAction actuates
// (pkg/kubelet/kuberuntime/kuberuntime_manager.go), and koordlet's, whose
// resourceexecutor writes the cgroup files its strategies chose, parents
// and children in order (pkg/koordlet/resourceexecutor).
//
// Files, ContainerFiles and PodFiles are the one rule for what a
// container's and its pod's files must hold: apply writes it, verification
// checks it, and the agent's drift check compares the files with it.
package actuate
