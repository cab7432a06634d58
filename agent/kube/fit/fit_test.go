package fit_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resizer/resize-agent/agent/kube/fit"
)

const node = "node-a"

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func allocatable(cpu, mem, pods string) corev1.ResourceList {
	return rl("cpu", cpu, "memory", mem, "pods", pods)
}

// ctr is a container whose spec and allocation are req ("cpu", "1", ...).
type ctr struct {
	name     string
	req      corev1.ResourceList
	alloc    corev1.ResourceList // nil: same as req
	actuated corev1.ResourceList // status.resources.requests; nil: none reported
	init     bool
	sidecar  bool
}

// pod builds a running pod on the node with its containers allocated.
func pod(uid string, ctrs ...ctr) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable},
	}
	for _, c := range ctrs {
		spec := corev1.Container{Name: c.name, Image: "i", Resources: corev1.ResourceRequirements{Requests: c.req}}
		alloc := c.alloc
		if alloc == nil {
			alloc = c.req
		}
		st := corev1.ContainerStatus{Name: c.name, AllocatedResources: alloc}
		if c.actuated != nil {
			st.Resources = &corev1.ResourceRequirements{Requests: c.actuated}
		}
		if c.init || c.sidecar {
			if c.sidecar {
				spec.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
			}
			p.Spec.InitContainers = append(p.Spec.InitContainers, spec)
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, st)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, spec)
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, st)
		}
	}
	return p
}

// resize returns p with container name's spec requests set to req: the pod
// as a pods/resize patch leaves it, its status (allocation) unchanged.
func resize(p *corev1.Pod, name string, req corev1.ResourceList) *corev1.Pod {
	p = p.DeepCopy()
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				cs[i].Resources.Requests = req
				return p
			}
		}
	}
	panic("no container " + name)
}

func with(p *corev1.Pod, fn func(*corev1.Pod)) *corev1.Pod {
	p = p.DeepCopy()
	fn(p)
	return p
}

// The kubelet's own fixture, pkg/kubelet/allocation/allocation_manager_test.go
// TestRetryPendingResizes (1.35.0 and 1.37.2): allocatable 4 CPUs, 4Gi,
// 40 pods (makeAllocationManager); testPod2 (an init container of 1 CPU,
// 1Gi) and testPod3 (1 CPU, 1Gi) allocated; testPod1's container c1
// (1 CPU, 1Gi) is resized.
var (
	kubeletAlloc = allocatable("4", "4Gi", "40")
	testPod1     = pod("1111", ctr{name: "c1", req: rl("cpu", "1", "memory", "1Gi")})
	testPod2     = pod("2222", ctr{name: "c1-init", init: true, req: rl("cpu", "1", "memory", "1Gi")})
	testPod3     = pod("3333", ctr{name: "c1", req: rl("cpu", "1", "memory", "1Gi")})
	kubeletPods  = []*corev1.Pod{testPod1, testPod2, testPod3}
)

func TestPredict(t *testing.T) {
	v37, v36, v35, v33 := fit.Kubelet{}, fit.Kubelet{Minor: 36}, fit.Kubelet{Minor: 35}, fit.Kubelet{Minor: 33}
	noValidator := fit.Kubelet{ValidatorOff: true}

	// The issue's example: allocatable 3700m, the other pods 3350m (one
	// with a sidecar), a container raised from 500m to 3000m.
	issueWeb := pod("web", ctr{name: "app", req: rl("cpu", "500m", "memory", "256Mi")})
	issuePods := []*corev1.Pod{issueWeb,
		pod("db", ctr{name: "db", req: rl("cpu", "2", "memory", "2Gi")}),
		pod("api", ctr{name: "proxy", sidecar: true, req: rl("cpu", "350m", "memory", "64Mi")}, ctr{name: "api", req: rl("cpu", "1", "memory", "512Mi")}),
	}
	issueAlloc := allocatable("3700m", "7Gi", "110")

	// Sidecar and init containers: the sidecar runs beside the later init
	// container, so the pod needs max(400m+300m, 2000m+300m) = 2300m, not
	// 2000m (which it would be with the sidecar after the init container).
	initPod := pod("init", ctr{name: "proxy", sidecar: true, req: rl("cpu", "300m")},
		ctr{name: "setup", init: true, req: rl("cpu", "2")}, ctr{name: "app", req: rl("cpu", "400m")})
	initPodLate := pod("init-late", ctr{name: "setup", init: true, req: rl("cpu", "2")},
		ctr{name: "proxy", sidecar: true, req: rl("cpu", "300m")}, ctr{name: "app", req: rl("cpu", "400m")})
	// The resized pod's own sidecar counts in what it requests.
	withSidecar := pod("resized", ctr{name: "log", sidecar: true, req: rl("cpu", "200m")}, ctr{name: "app", req: rl("cpu", "500m")})

	// Overhead (RuntimeClass) on both sides.
	overheadPod := with(pod("kata", ctr{name: "app", req: rl("cpu", "1")}), func(p *corev1.Pod) { p.Spec.Overhead = rl("cpu", "250m") })
	overheadResized := with(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), func(p *corev1.Pod) { p.Spec.Overhead = rl("cpu", "250m") })

	// Pod-level resources: the pod's requests are its spec.resources,
	// whatever its containers ask for.
	podLevel := with(pod("plr", ctr{name: "app", req: rl("cpu", "500m")}), func(p *corev1.Pod) {
		p.Spec.Resources = &corev1.ResourceRequirements{Requests: rl("cpu", "2")}
		p.Status.AllocatedResources = rl("cpu", "2")
	})
	// testPod1 with pod-level requests of 1500m, 1500Mi (the kubelet's
	// "pod-level: ..." cases).
	plr1 := with(testPod1, func(p *corev1.Pod) {
		p.Spec.Resources = &corev1.ResourceRequirements{Requests: rl("cpu", "1500m", "memory", "1500Mi")}
		p.Status.AllocatedResources = rl("cpu", "1500m", "memory", "1500Mi")
	})
	plrResize := func(cpu, mem string) *corev1.Pod {
		return with(plr1, func(p *corev1.Pod) { p.Spec.Resources.Requests = rl("cpu", cpu, "memory", mem) })
	}

	// Another pod's own pending resize does not count; its allocation does.
	deferredOther := with(pod("other", ctr{name: "app", req: rl("cpu", "1")}), func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = rl("cpu", "3")
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonDeferred}}
	})
	infeasibleOther := with(deferredOther, func(p *corev1.Pod) { p.Status.Conditions[0].Reason = corev1.PodReasonInfeasible })
	// A decrease the runtime has not applied yet: actuated 2 CPUs,
	// allocated 1; the node still carries 2.
	shrinking := pod("shrinking", ctr{name: "app", req: rl("cpu", "1"), actuated: rl("cpu", "2")})
	small := pod("small", ctr{name: "app", req: rl("cpu", "500m")})

	static := with(testPod1, func(p *corev1.Pod) {
		p.Annotations = map[string]string{"kubernetes.io/config.source": "file", "kubernetes.io/config.mirror": "x"}
	})
	guaranteed := with(pod("g", ctr{name: "app", req: rl("cpu", "1", "memory", "1Gi")}), func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits = rl("cpu", "1", "memory", "1Gi")
		p.Status.QOSClass = corev1.PodQOSGuaranteed
	})
	guaranteedTo := func(cpu, mem string) *corev1.Pod {
		return with(guaranteed, func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: rl("cpu", cpu, "memory", mem), Limits: rl("cpu", cpu, "memory", mem)}
		})
	}

	terminated := with(pod("done", ctr{name: "app", req: rl("cpu", "3")}), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })
	unadmitted := with(pod("new", ctr{name: "app", req: rl("cpu", "3")}), func(p *corev1.Pod) {
		p.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable}
	})
	deletedStopped := with(pod("gone", ctr{name: "app", req: rl("cpu", "3")}), func(p *corev1.Pod) {
		p.DeletionTimestamp = &metav1.Time{}
		p.Status.ContainerStatuses[0].State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0}
	})
	deletedRunning := with(deletedStopped, func(p *corev1.Pod) { p.Status.ContainerStatuses[0].State.Terminated = nil })

	fitOK := fit.Prediction{Verdict: fit.Fit}
	deferred := func(r string, req, used, capacity int64) fit.Prediction {
		return fit.Prediction{Verdict: fit.Deferred, Reason: "OutOf" + r,
			Message:   fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d", r, req, used, capacity),
			Shortfall: &fit.Shortfall{Resource: corev1.ResourceName(r), Requested: req, Used: used, Capacity: capacity}}
	}
	infeasibleCap := func(r string, req, capacity int64) fit.Prediction {
		return fit.Prediction{Verdict: fit.Infeasible, Reason: "Infeasible",
			Message:   fmt.Sprintf("Node didn't have enough capacity: %s, requested: %d, capacity: %d", r, req, capacity),
			Shortfall: &fit.Shortfall{Resource: corev1.ResourceName(r), Requested: req, Capacity: capacity}}
	}
	infeasibleMsg := func(msg string) fit.Prediction {
		return fit.Prediction{Verdict: fit.Infeasible, Reason: "Infeasible", Message: msg}
	}

	tests := []struct {
		name    string
		kubelet fit.Kubelet
		alloc   corev1.ResourceList
		pods    []*corev1.Pod
		desired *corev1.Pod
		want    fit.Prediction
	}{
		// allocation_manager_test.go TestRetryPendingResizes, 1.37.2, where
		// the kubelet is tested without the API server's validator.
		{"kubelet: cpu and memory decrease", noValidator, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "500m", "memory", "500Mi")), fitOK},
		{"kubelet: cpu increase, memory decrease", noValidator, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "1500m", "memory", "500Mi")), fitOK},
		{"kubelet: cpu and memory beyond current capacity, cpu named", noValidator, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "2500m", "memory", "2500Mi")), deferred("cpu", 2500, 2000, 4000)},
		{"kubelet: cpu decrease, memory beyond current capacity", noValidator, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "500m", "memory", "2500Mi")), deferred("memory", 2500<<20, 2<<30, 4<<30)},
		{"kubelet: memory beyond node capacity", noValidator, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "1", "memory", "4500Mi")), deferred("memory", 4718592000, 2147483648, 4294967296)},
		{"kubelet: cpu beyond node capacity", noValidator, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "5", "memory", "1Gi")), deferred("cpu", 5000, 2000, 4000)},
		{"kubelet: pod-level cpu beyond current capacity", noValidator, kubeletAlloc, []*corev1.Pod{plr1, testPod2, testPod3},
			plrResize("2500m", "1500Mi"), deferred("cpu", 2500, 2000, 4000)},
		{"kubelet: pod-level memory beyond node capacity", noValidator, kubeletAlloc, []*corev1.Pod{plr1, testPod2, testPod3},
			plrResize("1500m", "4500Mi"), deferred("memory", 4718592000, 2147483648, 4294967296)},
		// The same beyond-allocatable resizes with the validator on (1.36+
		// default): plugin/pkg/admission/podresize/admission_test.go.
		{"validator: cpu beyond allocatable", v37, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "5", "memory", "1Gi")),
			fit.Prediction{Verdict: fit.Refused, Reason: "NodeCapacity", Message: "node didn't have enough allocatable resources: cpu, requested: 5000, allocatable: 4000",
				Shortfall: &fit.Shortfall{Resource: "cpu", Requested: 5000, Capacity: 4000}}},
		{"validator: cpu and memory beyond allocatable", v36, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "5", "memory", "4500Mi")),
			fit.Prediction{Verdict: fit.Refused, Reason: "NodeCapacity",
				Message:   "node didn't have enough allocatable resources: cpu, requested: 5000, allocatable: 4000; memory, requested: 4718592000, allocatable: 4294967296",
				Shortfall: &fit.Shortfall{Resource: "cpu", Requested: 5000, Capacity: 4000}}},
		{"validator: within allocatable, not within free", v37, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "2500m", "memory", "1Gi")), deferred("cpu", 2500, 2000, 4000)},
		// 1.33-1.35 canResizePod: beyond allocatable is Infeasible,
		// memory named first (allocation_manager_test.go, 1.35.0).
		{"1.35: memory beyond node capacity", v35, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "1", "memory", "4500Mi")), infeasibleCap("memory", 4718592000, 4294967296)},
		{"1.35: cpu beyond node capacity", v35, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "5", "memory", "1Gi")), infeasibleCap("cpu", 5000, 4000)},
		{"1.35: both beyond node capacity, memory named", v35, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "5", "memory", "4500Mi")), infeasibleCap("memory", 4718592000, 4294967296)},
		{"1.35: beyond free only", v35, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "2500m", "memory", "1Gi")), deferred("cpu", 2500, 2000, 4000)},
		{"1.33: static pod", v33, kubeletAlloc, kubeletPods,
			resize(static, "c1", rl("cpu", "1500m", "memory", "1Gi")), infeasibleMsg("In-place resize of static-pods is not supported")},
		{"1.37: static pod", v37, kubeletAlloc, kubeletPods,
			resize(static, "c1", rl("cpu", "1500m", "memory", "1Gi")), fitOK},

		// The issue's example: the agent said "free 3500m"; the kubelet
		// leaves 350m.
		{"issue 13: 500m to 3000m with 3350m used of 3700m", v37, issueAlloc, issuePods,
			resize(issueWeb, "app", rl("cpu", "3", "memory", "256Mi")), deferred("cpu", 3000, 3350, 3700)},
		{"issue 13: exactly what is free fits", v37, issueAlloc, issuePods,
			resize(issueWeb, "app", rl("cpu", "350m", "memory", "256Mi")), fitOK},
		{"issue 13: a millicore more does not", v37, issueAlloc, issuePods,
			resize(issueWeb, "app", rl("cpu", "351m", "memory", "256Mi")), deferred("cpu", 351, 3350, 3700)},

		{"sidecar before an init container counts beside it", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{initPod},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "1800m")), deferred("cpu", 1800, 2300, 4000)},
		{"sidecar after an init container does not", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{initPodLate},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "1800m")), fitOK},
		{"the resized pod's sidecar counts in its request", v37, allocatable("2", "8Gi", "110"), []*corev1.Pod{small},
			resize(withSidecar, "app", rl("cpu", "1400m")), deferred("cpu", 1600, 500, 2000)},
		{"resizing the sidecar itself", v37, allocatable("2", "8Gi", "110"), []*corev1.Pod{small},
			resize(withSidecar, "log", rl("cpu", "1100m")), deferred("cpu", 1600, 500, 2000)},
		{"overhead on both sides", v37, allocatable("3", "8Gi", "110"), []*corev1.Pod{overheadPod},
			resize(overheadResized, "app", rl("cpu", "1501m")), deferred("cpu", 1751, 1250, 3000)},
		{"overhead: fits exactly", v37, allocatable("3", "8Gi", "110"), []*corev1.Pod{overheadPod},
			resize(overheadResized, "app", rl("cpu", "1500m")), fitOK},
		{"another pod's pod-level requests count, not its containers'", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{podLevel},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "2001m")), deferred("cpu", 2001, 2000, 4000)},
		{"1.33: pod-level requests not counted", v33, allocatable("4", "8Gi", "110"), []*corev1.Pod{podLevel},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "3500m")), fitOK},
		{"another pod's deferred resize is not counted", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{deferredOther},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "3")), fitOK},
		{"another pod's infeasible resize is not counted", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{infeasibleOther},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "3")), fitOK},
		{"an unapplied decrease still counts", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{shrinking},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "2500m")), deferred("cpu", 2500, 2000, 4000)},
		{"terminal and deleted-stopped pods do not count", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{terminated, deletedStopped},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "4")), fitOK},
		{"deleted pods with running containers count", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{deletedRunning},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "1500m")), deferred("cpu", 1500, 3000, 4000)},
		{"1.37: a pod not yet admitted does not count", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{unadmitted},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "1500m")), fitOK},
		{"1.36: a pod not yet admitted counts", v36, allocatable("4", "8Gi", "110"), []*corev1.Pod{unadmitted},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "500m")}), "app", rl("cpu", "1500m")), deferred("cpu", 1500, 3000, 4000)},
		{"pods: the node is full", v37, allocatable("4", "8Gi", "3"), []*corev1.Pod{small, shrinking, deferredOther},
			resize(pod("resized", ctr{name: "app", req: rl("cpu", "100m")}), "app", rl("cpu", "200m")), deferred("pods", 1, 3, 3)},

		// handlePodResourcesResize: desired == allocated is no resize, even
		// on a node with no room; a limit changed is one.
		{"the spec equals the allocation: nothing to admit", v37, allocatable("4", "8Gi", "1"), []*corev1.Pod{small},
			resize(testPod1, "c1", rl("cpu", "1", "memory", "1Gi")), fitOK},
		{"a deferred resize taken back to the allocation", v37, allocatable("4", "8Gi", "110"), []*corev1.Pod{small, shrinking},
			with(deferredOther, func(p *corev1.Pod) { p.Spec.Containers[0].Resources.Requests = rl("cpu", "1") }), fitOK},
		{"a limit changed is a resize", v37, allocatable("4", "8Gi", "1"), []*corev1.Pod{small},
			with(testPod1, func(p *corev1.Pod) { p.Spec.Containers[0].Resources.Limits = rl("cpu", "2") }), deferred("pods", 1, 1, 1)},
		// handlers.go: Guaranteed pods with the static managers
		// (allocation_manager_test.go "Infeasible due to static cpu policy").
		{"guaranteed, static CPU manager, cpu resize", fit.Kubelet{CPUManagerPolicy: "static"}, kubeletAlloc, nil,
			guaranteedTo("2", "1Gi"), infeasibleMsg(`Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"`)},
		{"guaranteed, static CPU manager, memory resize", fit.Kubelet{CPUManagerPolicy: "static"}, kubeletAlloc, nil,
			guaranteedTo("1", "2Gi"), fitOK},
		{"guaranteed, static memory manager, memory resize", fit.Kubelet{MemoryManagerPolicy: "Static"}, kubeletAlloc, nil,
			guaranteedTo("1", "2Gi"), infeasibleMsg(`Resize is infeasible for Guaranteed Pods alongside Memory Manager policy "Static"`)},
		{"1.33: guaranteed, static CPU manager", fit.Kubelet{Minor: 33, CPUManagerPolicy: "static"}, kubeletAlloc, nil,
			guaranteedTo("2", "1Gi"), infeasibleMsg("Resize is infeasible for Guaranteed Pods alongside CPU Manager static policy")},
		{"guaranteed without status.qosClass, static CPU manager", fit.Kubelet{CPUManagerPolicy: "static"}, kubeletAlloc, nil,
			with(guaranteedTo("2", "1Gi"), func(p *corev1.Pod) { p.Status.QOSClass = "" }),
			infeasibleMsg(`Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"`)},
		{"burstable without status.qosClass, static CPU manager", fit.Kubelet{CPUManagerPolicy: "static"}, kubeletAlloc, nil,
			with(guaranteedTo("2", "1Gi"), func(p *corev1.Pod) {
				p.Status.QOSClass = ""
				p.Spec.Containers[0].Resources.Limits = rl("cpu", "3", "memory", "1Gi")
			}), fitOK},
		{"burstable, static CPU manager", fit.Kubelet{CPUManagerPolicy: "static"}, kubeletAlloc, kubeletPods,
			resize(testPod1, "c1", rl("cpu", "1500m", "memory", "1Gi")), fitOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fit.Predict(tt.kubelet, fit.Node{Allocatable: tt.alloc, Pods: tt.pods}, tt.desired)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %s\nwant %s", show(got), show(tt.want))
			}
		})
	}
}

func show(p fit.Prediction) string {
	if p.Shortfall == nil {
		return fmt.Sprintf("%+v", p)
	}
	s := *p.Shortfall
	p.Shortfall = nil
	return fmt.Sprintf("%+v shortfall %+v", p, s)
}

func TestPredictRefusesBadInput(t *testing.T) {
	ok := resize(testPod1, "c1", rl("cpu", "2"))
	elsewhere := with(testPod3, func(p *corev1.Pod) { p.Spec.NodeName = "node-b" })
	for name, tc := range map[string]struct {
		k       fit.Kubelet
		n       fit.Node
		desired *corev1.Pod
		want    string
	}{
		"no pod":               {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc}, nil, "no pod"},
		"kubelet 1.32":         {fit.Kubelet{Minor: 32}, fit.Node{Allocatable: kubeletAlloc}, ok, "1.32"},
		"kubelet 1.38":         {fit.Kubelet{Minor: 38}, fit.Node{Allocatable: kubeletAlloc}, ok, "1.38"},
		"no allocatable cpu":   {fit.Kubelet{}, fit.Node{Allocatable: rl("memory", "1Gi", "pods", "10")}, ok, "allocatable cpu"},
		"no allocatable pods":  {fit.Kubelet{}, fit.Node{Allocatable: rl("cpu", "1", "memory", "1Gi")}, ok, "allocatable pods"},
		"unbound pod":          {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc}, with(ok, func(p *corev1.Pod) { p.Spec.NodeName = "" }), "not bound"},
		"pod on another node":  {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc, Pods: []*corev1.Pod{elsewhere}}, ok, `on node "node-b"`},
		"nil pod in the list":  {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc, Pods: []*corev1.Pod{nil}}, ok, "nil"},
		"1e99 cpu":             {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc}, resize(testPod1, "c1", rl("cpu", "1e99")), "out of range"},
		"1e18 memory":          {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc}, resize(testPod1, "c1", rl("memory", "1e18")), "out of range"},
		"negative pod request": {fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc}, with(ok, func(p *corev1.Pod) { p.Spec.Resources = &corev1.ResourceRequirements{Requests: rl("cpu", "-1")} }), "out of range"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := fit.Predict(tc.k, tc.n, tc.desired)
			if !errors.Is(err, fit.ErrInvalid) || !strings.Contains(err.Error(), tc.want) || got != (fit.Prediction{}) {
				t.Errorf("got %+v, %v; want ErrInvalid mentioning %q", got, err, tc.want)
			}
		})
	}
}

// Predict does not change what it is given.
func TestPredictLeavesItsInputAlone(t *testing.T) {
	pods := []*corev1.Pod{testPod2.DeepCopy(), testPod3.DeepCopy()}
	before := fmt.Sprintf("%v", pods)
	desired := resize(testPod1, "c1", rl("cpu", "2500m"))
	d := desired.DeepCopy()
	if _, err := fit.Predict(fit.Kubelet{}, fit.Node{Allocatable: kubeletAlloc, Pods: pods}, desired); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%v", pods) != before || fmt.Sprintf("%v", d) != fmt.Sprintf("%v", desired) {
		t.Error("Predict changed its input")
	}
}
