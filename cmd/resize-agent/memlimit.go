package main

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitEnv holds the container's memory limit, from the downward API
// (resourceFieldRef limits.memory in deploy/base/daemonset.yaml), in bytes
// or as a quantity.
const memoryLimitEnv = "RESIZE_AGENT_MEMORY_LIMIT"

// memoryLimitShare of the container's limit is the Go runtime's soft memory
// limit. The runtime reads its cgroup's CPU limit (Go 1.25) but not its
// memory limit, and without a soft limit the collector lets the heap grow
// to twice the live heap: 322-339 MiB RSS under issue 15's load, with
// 256Mi the limit. The rest of the limit is for what the runtime does not
// count: the binary's text and data, and the kernel's share.
const memoryLimitShare = 0.75

// setMemoryLimit sets the runtime's soft memory limit from memoryLimitEnv,
// unless GOMEMLIMIT already set one, and says what is in force.
func setMemoryLimit(log *slog.Logger) error {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("Go memory limit", "bytes", debug.SetMemoryLimit(-1), "from", "GOMEMLIMIT")
		return nil
	}
	v := os.Getenv(memoryLimitEnv)
	if v == "" {
		return nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return fmt.Errorf("%s=%q: want the container's memory limit, e.g. 268435456 or 256Mi", memoryLimitEnv, v)
	}
	limit := int64(math.MaxInt64)
	if b, ok := q.AsInt64(); ok {
		limit = int64(float64(b) * memoryLimitShare)
	}
	debug.SetMemoryLimit(limit)
	log.Info("Go memory limit", "bytes", limit, "from", memoryLimitEnv, "containerLimit", q.String(), "share", memoryLimitShare)
	return nil
}
