package podcgroup_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/kube/podcgroup"
	"github.com/resizer/resize-agent/cgroup/spec"
)

// rl is getResourceList of the kubelet's tests: cpu and memory, "" for none.
func rl(cpu, mem string) corev1.ResourceList {
	l := corev1.ResourceList{}
	if cpu != "" {
		l[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		l[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	return l
}

func rr(req, lim corev1.ResourceList) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: req, Limits: lim}
}

func ctrs(rs ...corev1.ResourceRequirements) []corev1.Container {
	var out []corev1.Container
	for i, r := range rs {
		out = append(out, corev1.Container{Name: string(rune('a' + i)), Resources: r})
	}
	return out
}

const mi = 1 << 20

// The cases of TestResourceConfigForPod in kubernetes
// pkg/kubelet/cm/helpers_linux_test.go (v1.37.2) that concern cpu and
// memory with CFS quota enforced, their expected values written as the
// files hold them: the shares through the kubelet's linear cpu.weight
// (MilliCPUToShares(100) = 102 -> 4, MilliCPUToShares(200) = 204 -> 8,
// MinShares -> 1), the quota for the period, "max" where the kubelet sets
// no limit.
func TestKubeletResourceConfigForPod(t *testing.T) {
	const period, tuned = 100000, 5000
	for _, tc := range []struct {
		name         string
		pod          corev1.PodSpec
		period       uint64
		cpuMax       string
		weight       uint64
		memoryMax    int64 // 0: max
		wantRequest  int64
		wantQOSClass corev1.PodQOSClass
	}{
		{name: "besteffort", pod: corev1.PodSpec{Containers: ctrs(rr(rl("", ""), rl("", "")))},
			period: period, cpuMax: "max 100000", weight: 1},
		{name: "burstable-no-limits", pod: corev1.PodSpec{Containers: ctrs(rr(rl("100m", "100Mi"), rl("", "")))},
			period: period, cpuMax: "max 100000", weight: 4},
		{name: "burstable-with-limits", pod: corev1.PodSpec{Containers: ctrs(rr(rl("100m", "100Mi"), rl("200m", "200Mi")))},
			period: period, cpuMax: "20000 100000", weight: 4, memoryMax: 200 * mi},
		{name: "burstable-partial-limits", pod: corev1.PodSpec{Containers: ctrs(rr(rl("100m", "100Mi"), rl("200m", "200Mi")), rr(rl("100m", "100Mi"), rl("", "")))},
			period: period, cpuMax: "max 100000", weight: 8},
		{name: "burstable-with-limits-with-tuned-quota", pod: corev1.PodSpec{Containers: ctrs(rr(rl("100m", "100Mi"), rl("200m", "200Mi")))},
			period: tuned, cpuMax: "1000 5000", weight: 4, memoryMax: 200 * mi},
		{name: "guaranteed", pod: corev1.PodSpec{Containers: ctrs(rr(rl("100m", "100Mi"), rl("100m", "100Mi")))},
			period: period, cpuMax: "10000 100000", weight: 4, memoryMax: 100 * mi},
		{name: "guaranteed-with-tuned-quota", pod: corev1.PodSpec{Containers: ctrs(rr(rl("100m", "100Mi"), rl("100m", "100Mi")))},
			period: tuned, cpuMax: "1000 5000", weight: 4, memoryMax: 100 * mi},
		{name: "burstable-partial-limits-with-init-containers", pod: corev1.PodSpec{
			Containers:     ctrs(rr(rl("100m", "100m"), rl("100m", "100Mi")), rr(rl("100m", "100m"), rl("", ""))),
			InitContainers: ctrs(rr(rl("100m", "100m"), rl("100m", "100Mi")), rr(rl("100m", "100m"), rl("", "")))},
			period: tuned, cpuMax: "max 100000", weight: 8},
		{name: "besteffort-with-pod-level-resources-enabled", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("", ""), Limits: rl("", "")},
			Containers: ctrs(rr(rl("", ""), rl("", "")))},
			period: period, cpuMax: "max 100000", weight: 1},
		{name: "burstable-with-pod-level-requests", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("100m", "100Mi")},
			Containers: ctrs(rr(nil, nil))},
			period: period, cpuMax: "max 100000", weight: 4},
		{name: "burstable-with-pod-and-container-level-requests", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("100m", "100Mi")},
			Containers: ctrs(rr(rl("10m", "50Mi"), rl("", "")))},
			period: period, cpuMax: "max 100000", weight: 4},
		{name: "burstable-with-pod-level-resources", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("100m", "100Mi"), Limits: rl("200m", "200Mi")},
			Containers: ctrs(rr(nil, nil))},
			period: period, cpuMax: "20000 100000", weight: 4, memoryMax: 200 * mi},
		{name: "burstable-with-pod-and-container-level-resources", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("100m", "100Mi"), Limits: rl("200m", "200Mi")},
			Containers: ctrs(rr(rl("10m", "50Mi"), rl("50m", "100Mi")))},
			period: period, cpuMax: "20000 100000", weight: 4, memoryMax: 200 * mi},
		{name: "burstable-with-partial-pod-level-resources-limits", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("200m", "300Mi")},
			Containers: ctrs(rr(rl("200m", "200Mi"), rl("200m", "200Mi")))},
			period: period, cpuMax: "20000 100000", weight: 8, memoryMax: 200 * mi},
		{name: "guaranteed-with-pod-level-resources", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("100m", "100Mi"), Limits: rl("100m", "100Mi")},
			Containers: ctrs(rr(nil, nil))},
			period: period, cpuMax: "10000 100000", weight: 4, memoryMax: 100 * mi},
		{name: "guaranteed-with-pod-and-container-level-resources", pod: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: rl("100m", "100Mi"), Limits: rl("100m", "100Mi")},
			Containers: ctrs(rr(rl("10m", "50Mi"), rl("50m", "100Mi")))},
			period: period, cpuMax: "10000 100000", weight: 4, memoryMax: 100 * mi},
		{name: "guaranteed-pod-level-resources-with-init-containers", pod: corev1.PodSpec{
			Resources:      &corev1.ResourceRequirements{Requests: rl("100m", "100Mi"), Limits: rl("100m", "100Mi")},
			Containers:     ctrs(rr(rl("10m", "50Mi"), rl("50m", "50Mi"))),
			InitContainers: ctrs(rr(rl("10m", "50Mi"), rl("50m", "50Mi")))},
			period: period, cpuMax: "10000 100000", weight: 4, memoryMax: 100 * mi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{Spec: tc.pod}
			got := podcgroup.ForPod(p).Resources(tc.period)
			if s := got.CPUMax.String(); s != tc.cpuMax {
				t.Errorf("cpu.max %s, want %s", s, tc.cpuMax)
			}
			if *got.CPUWeight != tc.weight {
				t.Errorf("cpu.weight %d, want %d", *got.CPUWeight, tc.weight)
			}
			want := int64(spec.Unlimited)
			if tc.memoryMax > 0 {
				want = tc.memoryMax
			}
			if *got.MemoryMax != want {
				t.Errorf("memory.max %s, want %s", spec.FormatMax(*got.MemoryMax), spec.FormatMax(want))
			}
		})
	}
}

// Overhead enters the requests and the limits that are set
// (component-helpers' PodRequests and PodLimits, the kubelet's "includes
// the Pod overhead when sizing the Pod cgroup"); init containers count as
// the largest against the sum of the regular containers and sidecars.
func TestOverheadAndInitContainers(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Overhead:   rl("250m", "120Mi"),
		Containers: ctrs(rr(rl("100m", "128Mi"), rl("500m", "256Mi"))),
	}}
	got := podcgroup.ForPod(p)
	// 350m -> 358 shares -> 1 + 356*9999/262142 = 14.
	if got.CPURequest != 350 || got.CPULimit != 750 || got.MemoryLimit != 376*mi || spec.SharesToPodWeight(got.Shares()) != 14 {
		t.Errorf("overhead: %+v", got)
	}
	// A sidecar adds to the containers; the init container (1 CPU, with
	// the sidecar started before it) is larger than both: it decides the
	// request; every container has limits, so the pod has them too.
	sidecar := corev1.Container{Name: "side", RestartPolicy: &always, Resources: rr(rl("200m", "64Mi"), rl("200m", "64Mi"))}
	initC := corev1.Container{Name: "init", Resources: rr(rl("1", "32Mi"), rl("1", "32Mi"))}
	p = &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{sidecar, initC},
		Containers:     ctrs(rr(rl("100m", "128Mi"), rl("500m", "256Mi"))),
	}}
	got = podcgroup.ForPod(p)
	if got.QOS != corev1.PodQOSBurstable || got.CPURequest != 1200 || got.CPULimit != 1200 || got.MemoryLimit != 320*mi {
		t.Errorf("init containers: %+v", got)
	}
	// An init container without a CPU limit takes the pod's CPU limit
	// away.
	p.Spec.InitContainers[1].Resources.Limits = rl("", "32Mi")
	if got := podcgroup.ForPod(p); got.CPULimit != 0 || got.MemoryLimit != 320*mi {
		t.Errorf("init container without a CPU limit: %+v", got)
	}
}

// The QoS class is the status's; without it, pod-level resources decide
// alone (the kubelet's TestComputePodQOS cases with pod-level resources,
// pkg/apis/core/helper/qos/qos_test.go).
func TestQOS(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  corev1.PodSpec
		want corev1.PodQOSClass
	}{
		{"guaranteed-with-pod-level-resources", corev1.PodSpec{Containers: ctrs(rr(rl("", ""), rl("", ""))),
			Resources: &corev1.ResourceRequirements{Requests: rl("10m", "100Mi"), Limits: rl("10m", "100Mi")}}, corev1.PodQOSGuaranteed},
		{"guaranteed-with-pod-and-container-level-resources", corev1.PodSpec{Containers: ctrs(rr(rl("3m", "10Mi"), rl("5m", "20Mi"))),
			Resources: &corev1.ResourceRequirements{Requests: rl("10m", "100Mi"), Limits: rl("10m", "100Mi")}}, corev1.PodQOSGuaranteed},
		{"burstable-with-pod-level-resources", corev1.PodSpec{Containers: ctrs(rr(rl("", ""), rl("", ""))),
			Resources: &corev1.ResourceRequirements{Requests: rl("10m", "10Mi"), Limits: rl("20m", "50Mi")}}, corev1.PodQOSBurstable},
		{"burstable-with-pod-and-container-level-resources", corev1.PodSpec{Containers: ctrs(rr(rl("5m", "10Mi"), rl("5m", "10Mi"))),
			Resources: &corev1.ResourceRequirements{Requests: rl("10m", "10Mi"), Limits: rl("20m", "50Mi")}}, corev1.PodQOSBurstable},
		{"burstable-with-pod-and-container-level-requests", corev1.PodSpec{Containers: ctrs(rr(rl("5m", "10Mi"), rl("", ""))),
			Resources: &corev1.ResourceRequirements{Requests: rl("10m", "10Mi"), Limits: rl("", "")}}, corev1.PodQOSBurstable},
		{"best-effort", corev1.PodSpec{Containers: ctrs(rr(rl("", ""), rl("", "")))}, corev1.PodQOSBestEffort},
		{"init container burstable", corev1.PodSpec{Containers: ctrs(rr(rl("", ""), rl("", ""))),
			InitContainers: ctrs(rr(rl("10m", "100Mi"), rl("100m", "200Mi")))}, corev1.PodQOSBurstable},
	} {
		if got := podcgroup.QOS(&corev1.Pod{Spec: tc.pod}); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: ctrs(rr(rl("", ""), rl("", "")))}, Status: corev1.PodStatus{QOSClass: corev1.PodQOSBurstable}}
	if got := podcgroup.QOS(p); got != corev1.PodQOSBurstable {
		t.Errorf("status.qosClass ignored: %s", got)
	}
}

// Allocated takes what the status reports: a container's actuated
// resources, an allocation where nothing is actuated; the pod-level
// resources stay the spec's.
func TestAllocated(t *testing.T) {
	p := &corev1.Pod{
		Spec: corev1.PodSpec{
			Resources:      &corev1.ResourceRequirements{Requests: rl("2", "1Gi"), Limits: rl("4", "2Gi")},
			InitContainers: []corev1.Container{{Name: "init", Resources: rr(rl("300m", ""), nil)}},
			Containers:     []corev1.Container{{Name: "app", Resources: rr(rl("1", "128Mi"), rl("2", "256Mi"))}},
		},
		Status: corev1.PodStatus{
			AllocatedResources:    rl("1", "512Mi"),
			Resources:             &corev1.ResourceRequirements{Requests: rl("7", "7Gi"), Limits: rl("7", "7Gi")},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "init", AllocatedResources: rl("200m", "")}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", AllocatedResources: rl("500m", "128Mi"),
				Resources: &corev1.ResourceRequirements{Requests: rl("500m", "128Mi"), Limits: rl("1", "256Mi")}}},
		},
	}
	a := podcgroup.Allocated(p)
	if q := a.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU]; q.String() != "1" {
		t.Errorf("app cpu limit %s, want the actuated 1", q.String())
	}
	if q := a.Spec.InitContainers[0].Resources.Requests[corev1.ResourceCPU]; q.String() != "200m" {
		t.Errorf("init cpu request %s, want the allocated 200m", q.String())
	}
	if q := a.Spec.Resources.Requests[corev1.ResourceCPU]; q.String() != "2" {
		t.Errorf("pod cpu request %s, want the spec's 2 (status.allocatedResources is the whole pod's)", q.String())
	}
	if r := podcgroup.Requests(a); r.Cpu().String() != "2" || r.Memory().String() != "1Gi" {
		t.Errorf("requests %v, want the pod-level ones", r)
	}
	if q := a.Spec.Resources.Limits[corev1.ResourceCPU]; q.String() != "4" {
		t.Errorf("pod cpu limit %s, want the spec's 4 (status.resources is read back from the cgroup)", q.String())
	}
	if q := p.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU]; q.String() != "2" {
		t.Errorf("the pod itself changed: %s", q.String())
	}
	v := podcgroup.ForPod(a)
	if v.CPURequest != 2000 || v.CPULimit != 4000 || v.MemoryLimit != 2<<30 {
		t.Errorf("allocated pod cgroup %+v", v)
	}
}

// The overhead cases of TestPodRequestsAndLimits (k8s.io/component-helpers
// resource/helpers_test.go, v0.37.2), the sums ResourceConfigForPod starts
// from, as the pod cgroup holds them: cpu 1 + overhead 5 gives 6144
// shares, the kubelet's weight 1 + 6142*9999/262142 = 235; limit 2 + 5 a
// quota of 7 CPUs; memory 12 + 5 bytes where a memory limit is declared.
func TestKubeletOverheadSums(t *testing.T) {
	for _, tc := range []struct {
		name   string
		c      corev1.ResourceRequirements
		cpuMax string
		weight uint64
		mem    string
	}{
		{"all-req-lim-and-overhead", rr(rl("1", "10"), rl("2", "12")), "700000 100000", 235, "17"},
		{"req-some-lim-and-overhead", rr(rl("1", "10"), rl("2", "")), "700000 100000", 235, "max"},
		{"req-and-overhead", rr(rl("1", "10"), nil), "max 100000", 235, "max"},
	} {
		p := &corev1.Pod{Spec: corev1.PodSpec{Overhead: rl("5", "5"), Containers: ctrs(tc.c)}}
		got := podcgroup.ForPod(p).Resources(100000)
		if s := got.CPUMax.String(); s != tc.cpuMax || *got.CPUWeight != tc.weight || spec.FormatMax(*got.MemoryMax) != tc.mem {
			t.Errorf("%s: %s / %d / %s, want %s / %d / %s", tc.name, s, *got.CPUWeight, spec.FormatMax(*got.MemoryMax), tc.cpuMax, tc.weight, tc.mem)
		}
	}
}
