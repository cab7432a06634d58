package intent_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/intent"
)

var (
	sinkSpec intent.Spec
	sinkRes  intent.Resources
)

func benchSpec(t intent.Target) intent.Spec {
	s := intent.Spec{ID: "bench-0001", Target: t}
	s.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("128Mi")}
	s.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.NotRequired}}
	return s
}

// BenchmarkValidate is the check every submission goes through, for each
// kind of target.
func BenchmarkValidate(b *testing.B) {
	for _, c := range []struct {
		name string
		t    intent.Target
	}{
		{"cgroup", intent.Target{Name: "web", CgroupPath: "/kubepods/burstable/pod1234/ctr", PodCgroupPath: "/kubepods/burstable/pod1234"}},
		{"podUID", intent.Target{Name: "web", PodUID: "0f6e4c1a-7d2b-4e8f-9a3c-5b1d2e3f4a5b"}},
		{"containerID", intent.Target{Name: "web", ContainerID: "4f2a9c8e1b7d3a6f5e0c9b8a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := benchSpec(c.t)
			b.ReportAllocs()
			for b.Loop() {
				out, _, err := intent.Validate(s)
				if err != nil {
					b.Fatal(err)
				}
				sinkSpec = out
			}
		})
	}
}

// BenchmarkApply merges a parsed change into a container's resources.
func BenchmarkApply(b *testing.B) {
	_, ch, err := intent.Validate(benchSpec(intent.Target{Name: "web", CgroupPath: "/a/b"}))
	if err != nil {
		b.Fatal(err)
	}
	cur := intent.Resources{CPURequest: 100, CPULimit: 200, MemoryRequest: 32 << 20, MemoryLimit: 64 << 20}
	b.ReportAllocs()
	for b.Loop() {
		out, err := ch.Apply(cur, false, false)
		if err != nil {
			b.Fatal(err)
		}
		sinkRes = out
	}
}
