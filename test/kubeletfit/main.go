//go:build ignore

// Compares agent/kube/fit's Predict with the kubelet 1.37.2's own allocation
// manager and admit handlers, on random nodes; run.sh builds it in a module
// of its own (see there). Exit status 1 on any mismatch.
package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/allocation"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/config"
	containertest "k8s.io/kubernetes/pkg/kubelet/container/testing"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	kubepod "k8s.io/kubernetes/pkg/kubelet/pod"
	"k8s.io/kubernetes/pkg/kubelet/status"
	statustest "k8s.io/kubernetes/pkg/kubelet/status/testing"
	kubeletutil "k8s.io/kubernetes/pkg/kubelet/util"

	"github.com/resizer/resize-agent/agent/kube/fit"
)

// The seed is the first argument's length, so that a second run with
// another argument covers other nodes.
var r = rand.New(rand.NewPCG(1, uint64(len(os.Args))))

func cpu(m int) resource.Quantity { return *resource.NewMilliQuantity(int64(m), resource.DecimalSI) }
func mem(mi int) resource.Quantity {
	return *resource.NewQuantity(int64(mi)<<20, resource.BinarySI)
}
func req() v1.ResourceList {
	return v1.ResourceList{v1.ResourceCPU: cpu(50 * (1 + r.IntN(30))), v1.ResourceMemory: mem(64 * (1 + r.IntN(30)))}
}

var restartAlways = v1.ContainerRestartPolicyAlways

// randPod: containers, maybe a sidecar and an init container, maybe
// overhead, maybe pod-level requests; allocated = spec at "admission".
func randPod(i int) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("p", i), Namespace: "ns", UID: types.UID(fmt.Sprint("uid-", i)),
		Annotations: map[string]string{"kubernetes.io/config.source": "api"}},
		Spec: v1.PodSpec{NodeName: "node-a"}, Status: v1.PodStatus{Phase: v1.PodRunning, QOSClass: v1.PodQOSBurstable}}
	add := func(c v1.Container, init bool) {
		st := v1.ContainerStatus{Name: c.Name, AllocatedResources: c.Resources.Requests.DeepCopy(),
			Resources: &v1.ResourceRequirements{Requests: c.Resources.Requests.DeepCopy()}}
		if init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, c)
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, st)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, c)
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, st)
		}
	}
	if r.IntN(3) == 0 {
		add(v1.Container{Name: "side", Image: "i", RestartPolicy: &restartAlways, Resources: v1.ResourceRequirements{Requests: req()}}, true)
	}
	if r.IntN(3) == 0 {
		add(v1.Container{Name: "init", Image: "i", Resources: v1.ResourceRequirements{Requests: req()}}, true)
	}
	for j := 0; j <= r.IntN(3); j++ {
		add(v1.Container{Name: fmt.Sprint("c", j), Image: "i", Resources: v1.ResourceRequirements{Requests: req()}}, false)
	}
	if r.IntN(4) == 0 {
		p.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: cpu(10 * r.IntN(30)), v1.ResourceMemory: mem(8 * r.IntN(10))}
	}
	if r.IntN(5) == 0 {
		p.Spec.Resources = &v1.ResourceRequirements{Requests: req()}
		// pod-level >= the containers' sum, as validation requires
		sum := v1.ResourceList{}
		for _, c := range p.Spec.Containers {
			for k, q := range c.Resources.Requests {
				s := sum[k]
				s.Add(q)
				sum[k] = s
			}
		}
		for k, q := range sum {
			pq := p.Spec.Resources.Requests[k]
			if pq.Cmp(q) < 0 {
				p.Spec.Resources.Requests[k] = q
			}
		}
		p.Status.AllocatedResources = p.Spec.Resources.Requests.DeepCopy()
	}
	return p
}

func main() {
	ctx := context.Background()
	logger := klog.Background()
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	n, mismatches := 0, 0
	verdicts := map[fit.Verdict]int{}
	reasons := map[string]int{}
	for iter := 0; iter < 20000; iter++ {
		alloc := v1.ResourceList{v1.ResourceCPU: cpu(500 * (1 + r.IntN(12))), v1.ResourceMemory: mem(512 * (1 + r.IntN(16))),
			v1.ResourcePods: *resource.NewQuantity(int64(110), resource.DecimalSI)}
		if r.IntN(10) == 0 {
			alloc[v1.ResourcePods] = *resource.NewQuantity(int64(1+r.IntN(6)), resource.DecimalSI)
		}
		var pods []*v1.Pod
		for i := 0; i < r.IntN(6); i++ {
			pods = append(pods, randPod(i))
		}
		target := randPod(99)
		// other pods' pending resizes: spec raised, allocation kept.
		for _, p := range pods {
			if r.IntN(4) == 0 {
				p.Spec.Containers[0].Resources.Requests = req()
				reason := v1.PodReasonDeferred
				if r.IntN(2) == 0 {
					reason = v1.PodReasonInfeasible
				}
				p.Status.Conditions = []v1.PodCondition{{Type: v1.PodResizePending, Status: v1.ConditionTrue, Reason: reason}}
			}
			if r.IntN(5) == 0 { // actuated lags: status.resources larger
				p.Status.ContainerStatuses[0].Resources.Requests = req()
			}
		}
		desired := target.DeepCopy()
		if desired.Spec.Resources != nil && r.IntN(2) == 0 {
			q := desired.Spec.Resources.Requests[v1.ResourceCPU]
			q.Add(cpu(100 * r.IntN(40)))
			desired.Spec.Resources.Requests[v1.ResourceCPU] = q
		} else {
			c := &desired.Spec.Containers[r.IntN(len(desired.Spec.Containers))]
			c.Resources.Requests = req()
			c.Resources.Requests[v1.ResourceCPU] = cpu(50 * (1 + r.IntN(40)))
			if desired.Spec.Resources != nil { // keep pod-level >= sum
				desired.Spec.Resources = nil
				target.Spec.Resources = nil
				target.Status.AllocatedResources = nil
				desired.Status.AllocatedResources = nil
			}
		}
		all := append(append([]*v1.Pod{}, pods...), desired)

		sm := status.NewManager(&fake.Clientset{}, kubepod.NewBasicPodManager(), &statustest.FakePodDeletionSafetyProvider{}, kubeletutil.NewPodStartupLatencyTracker())
		am := allocation.NewInMemoryManager(logger, sm, func(context.Context, *v1.Pod) {},
			func() []*v1.Pod { return all },
			func(uid types.UID) (*v1.Pod, bool) {
				for _, p := range all {
					if p.UID == uid {
						return p, true
					}
				}
				return nil, false
			},
			config.NewSourcesReady(func(sets.Set[string]) bool { return true }), record.NewFakeRecorder(100))
		getNode := func(context.Context, bool) (*v1.Node, error) {
			return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: v1.NodeStatus{Capacity: alloc, Allocatable: alloc}}, nil
		}
		cmgr := cm.NewFakeContainerManager(logger)
		am.AddPodAdmitHandlers(lifecycle.PodAdmitHandlers{
			allocation.NewPodResizesAdmitHandler(cmgr, &containertest.FakeRuntime{}, am),
			lifecycle.NewPredicateAdmitHandler(getNode, lifecycle.NewAdmissionFailureHandlerStub(), cmgr.UpdatePluginResources),
		})
		// The kubelet's checkpoint: every pod as admitted (allocated = the
		// status' allocatedResources, which randPod made the spec at start).
		for _, p := range append(append([]*v1.Pod{}, pods...), target) {
			a := p.DeepCopy()
			for i := range a.Spec.Containers {
				a.Spec.Containers[i].Resources.Requests = a.Status.ContainerStatuses[i].AllocatedResources
			}
			for i := range a.Spec.InitContainers {
				a.Spec.InitContainers[i].Resources.Requests = a.Status.InitContainerStatuses[i].AllocatedResources
			}
			if a.Spec.Resources != nil && a.Status.AllocatedResources != nil {
				a.Spec.Resources.Requests = a.Status.AllocatedResources
			}
			if err := am.SetAllocatedResources(logger, a); err != nil {
				panic(err)
			}
		}
		am.PushPendingResize(logger, desired.UID)
		am.RetryPendingResizes(ctx, "diff")
		kubelet, msg := fit.Fit, ""
		for _, c := range sm.GetPodResizeConditions(desired.UID) {
			if c.Type == v1.PodResizePending {
				kubelet, msg = fit.Verdict(c.Reason), c.Message
			}
		}
		got, err := fit.Predict(fit.Kubelet{Minor: 37, ValidatorOff: true}, fit.Node{Allocatable: alloc, Pods: all}, desired)
		if err != nil {
			panic(err)
		}
		n++
		verdicts[kubelet]++
		reasons[got.Reason]++
		if got.Verdict != kubelet || got.Message != msg {
			mismatches++
			if mismatches <= 5 {
				fmt.Printf("MISMATCH %d (unchanged spec %v): kubelet %s %q, fit %s %q\n", iter, equality.Semantic.DeepEqual(desired.Spec, target.Spec), kubelet, msg, got.Verdict, got.Message)
			}
		}
	}
	fmt.Printf("%d scenarios, kubelet verdicts %v, predicted reasons %v, mismatches %d\n", n, verdicts, reasons, mismatches)
	if mismatches > 0 || verdicts[fit.Fit] == 0 || verdicts[fit.Deferred] == 0 {
		os.Exit(1)
	}
}
