package fit_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/kube/fit"
)

// The resize of issue 13: a container raised from 500m to 3000m on a node
// with 3700m allocatable of which the other pods hold 3350m. The machine
// has 4 idle CPUs; the kubelet defers the resize.
func ExamplePredict() {
	web := pod("web", ctr{name: "app", req: rl("cpu", "500m", "memory", "256Mi")})
	others := []*corev1.Pod{
		web,
		pod("db", ctr{name: "db", req: rl("cpu", "2", "memory", "2Gi")}),
		pod("api", ctr{name: "proxy", sidecar: true, req: rl("cpu", "350m")}, ctr{name: "api", req: rl("cpu", "1")}),
	}
	desired := resize(web, "app", rl("cpu", "3", "memory", "256Mi"))
	p, err := fit.Predict(fit.Kubelet{Minor: 37}, fit.Node{Allocatable: allocatable("3700m", "7Gi", "110"), Pods: others}, desired)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Verdict, p.Reason)
	fmt.Println(p.Message)
	fmt.Println("free:", p.Shortfall.Free(), "millicores")
	// Output:
	// Deferred OutOfcpu
	// Node didn't have enough resource: cpu, requested: 3000, used: 3350, capacity: 3700
	// free: 350 millicores
}
