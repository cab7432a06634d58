package fit

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
)

// The kubelet minor versions whose resize admission this package follows.
// Before 1.33 the kubelet reported resizes in .status.resize, not in
// conditions; after 1.37 nobody has read the source yet.
const (
	OldestMinor = 33
	LatestMinor = 37
)

// ErrInvalid is returned, wrapped, for input the prediction cannot be made
// from; nothing is predicted then.
var ErrInvalid = errors.New("invalid input")

// Kubelet is what the prediction needs to know of the node's kubelet and
// API server (the same minor version: the agent targets clusters within
// the supported skew, where the validator plugin follows the API server).
type Kubelet struct {
	// Minor is the minor version, OldestMinor to LatestMinor; 0 means
	// LatestMinor.
	Minor int
	// CPUManagerPolicy and MemoryManagerPolicy are the kubelet's
	// (KubeletConfiguration cpuManagerPolicy, memoryManagerPolicy): with
	// "static" and "Static", a CPU or memory resize of a Guaranteed pod is
	// Infeasible (the exclusive-resources gates are alpha and off).
	CPUManagerPolicy    string
	MemoryManagerPolicy string
	// ValidatorOff: the API server runs without PodResizeValidator
	// (--disable-admission-plugins), so from 1.36 a resize above
	// allocatable reaches the kubelet, which defers it.
	ValidatorOff bool
}

// Verdict is what becomes of a pods/resize patch.
type Verdict string

const (
	// Fit: the kubelet allocates the new resources at once and sets
	// PodResizeInProgress.
	Fit Verdict = "Fit"
	// Deferred: PodResizePending with reason Deferred; the kubelet retries
	// when other pods shrink or leave.
	Deferred Verdict = "Deferred"
	// Infeasible: PodResizePending with reason Infeasible; the kubelet
	// never retries this spec.
	Infeasible Verdict = "Infeasible"
	// Refused: the API server refuses the patch itself (PodResizeValidator,
	// 1.36+, requests above allocatable), so the spec does not change and
	// the kubelet gives no verdict.
	Refused Verdict = "Refused"
)

// Verdicts lists every verdict, for metrics that initialise their series.
var Verdicts = []Verdict{Fit, Deferred, Infeasible, Refused}

// Shortfall is the resource that decided, in the kubelet's units (CPU in
// millicores, memory and storage in bytes, pods and others in units).
type Shortfall struct {
	Resource corev1.ResourceName
	// Requested is the resized pod's whole request; Used the sum of the
	// other pods' (zero where the rule compares with allocatable alone);
	// Capacity the node's allocatable.
	Requested, Used, Capacity int64
}

// Free is what the other pods leave of allocatable.
func (s Shortfall) Free() int64 { return s.Capacity - s.Used }

// Prediction is the verdict with the kubelet's own words.
type Prediction struct {
	Verdict Verdict
	// Reason is the admission reason the kubelet logs and puts in its
	// ResizeDeferred/ResizeInfeasible Event ("OutOfcpu", "Infeasible"), or
	// "NodeCapacity" for a refusal; empty for Fit.
	Reason string
	// Message is the PodResizePending condition's message the kubelet
	// writes, or the API server's refusal; empty for Fit.
	Message string
	// Shortfall holds the numbers when capacity decided; nil otherwise.
	Shortfall *Shortfall
}

// Node is the node as the API server shows it.
type Node struct {
	// Allocatable is Node.status.allocatable; cpu, memory and pods are
	// required (every kubelet reports them).
	Allocatable corev1.ResourceList
	// Pods are the pods bound to the node (spec.nodeName), with their
	// status; the resized pod may be among them and is left out.
	Pods []*corev1.Pod
}

// Predict tells what the kubelet (and, from 1.36, the API server) will do
// with desired, the pod with the spec a pods/resize patch would give it and
// the status the API server has now (its allocated resources).
func Predict(k Kubelet, node Node, desired *corev1.Pod) (Prediction, error) {
	minor := k.Minor
	if minor == 0 {
		minor = LatestMinor
	}
	if minor < OldestMinor || minor > LatestMinor {
		return Prediction{}, fmt.Errorf("%w: kubelet 1.%d: predictions are written for 1.%d to 1.%d", ErrInvalid, minor, OldestMinor, LatestMinor)
	}
	if err := validate(node, desired); err != nil {
		return Prediction{}, err
	}
	// handlePodResourcesResize: a spec equal to the allocation is no
	// resize; the kubelet clears PodResizePending and admits nothing.
	if unchanged(minor, desired) {
		return Prediction{Verdict: Fit}, nil
	}
	if minor >= 36 && !k.ValidatorOff {
		if p, refused := validatorRefuses(desired, node.Allocatable); refused {
			return p, nil
		}
	}
	if p, ok := infeasible(k, minor, desired); ok {
		return p, nil
	}
	if minor <= 35 {
		if p, ok := aboveAllocatable(desired, node.Allocatable); ok {
			return p, nil
		}
	}
	if s := admit(minor, allocatedPods(minor, node.Pods, desired), desired, node.Allocatable); s != nil {
		// status_manager.go SetPodResizePendingCondition: every reason
		// but Infeasible is reported as Deferred, with the admission
		// failure's message.
		return Prediction{Verdict: Deferred, Reason: "OutOf" + string(s.Resource), Message: s.message(), Shortfall: s}, nil
	}
	return Prediction{Verdict: Fit}, nil
}

// maxQuantity bounds every quantity of the resized pod: beyond it int64
// millicores overflow, and no node has a petabyte or a quadrillion cores.
var maxQuantity = resource.MustParse("1P")

func validate(node Node, desired *corev1.Pod) error {
	if desired == nil {
		return fmt.Errorf("%w: no pod", ErrInvalid)
	}
	if desired.UID == "" || desired.Spec.NodeName == "" {
		return fmt.Errorf("%w: pod %s/%s has no UID or is not bound to a node", ErrInvalid, desired.Namespace, desired.Name)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods} {
		q, ok := node.Allocatable[r]
		if !ok || q.Sign() < 0 || q.Cmp(maxQuantity) > 0 {
			return fmt.Errorf("%w: node allocatable %s is missing or out of range", ErrInvalid, r)
		}
	}
	for i, p := range node.Pods {
		if p == nil {
			return fmt.Errorf("%w: pod %d is nil", ErrInvalid, i)
		}
		if p.Spec.NodeName != desired.Spec.NodeName {
			return fmt.Errorf("%w: pod %s/%s is on node %q, not %q", ErrInvalid, p.Namespace, p.Name, p.Spec.NodeName, desired.Spec.NodeName)
		}
	}
	check := func(where string, l corev1.ResourceList) error {
		for r, q := range l {
			if q.Sign() < 0 || q.Cmp(maxQuantity) > 0 {
				return fmt.Errorf("%w: %s %s %s is out of range", ErrInvalid, where, r, q.String())
			}
		}
		return nil
	}
	var errs []error
	for _, c := range slices.Concat(desired.Spec.InitContainers, desired.Spec.Containers) {
		errs = append(errs, check("container "+c.Name+" request", c.Resources.Requests), check("container "+c.Name+" limit", c.Resources.Limits))
	}
	if r := desired.Spec.Resources; r != nil {
		errs = append(errs, check("pod request", r.Requests), check("pod limit", r.Limits))
	}
	errs = append(errs, check("pod overhead", desired.Spec.Overhead))
	return errors.Join(errs...)
}

// validatorRefuses is the API server's PodResizeValidator (1.36+,
// plugin/pkg/admission/podresize/admission.go): the new requests,
// overhead and pod-level resources included, against allocatable alone.
func validatorRefuses(desired *corev1.Pod, alloc corev1.ResourceList) (Prediction, bool) {
	req := resourcehelper.PodRequests(desired, resourcehelper.PodResourcesOptions{})
	cpu, mem := req[corev1.ResourceCPU], req[corev1.ResourceMemory]
	var msg []string
	var short *Shortfall
	if cpu.Cmp(*alloc.Cpu()) > 0 {
		msg = append(msg, fmt.Sprintf("cpu, requested: %d, allocatable: %d", cpu.MilliValue(), alloc.Cpu().MilliValue()))
		short = &Shortfall{Resource: corev1.ResourceCPU, Requested: cpu.MilliValue(), Capacity: alloc.Cpu().MilliValue()}
	}
	if mem.Cmp(*alloc.Memory()) > 0 {
		msg = append(msg, fmt.Sprintf("memory, requested: %d, allocatable: %d", mem.Value(), alloc.Memory().Value()))
		if short == nil {
			short = &Shortfall{Resource: corev1.ResourceMemory, Requested: mem.Value(), Capacity: alloc.Memory().Value()}
		}
	}
	if short == nil {
		return Prediction{}, false
	}
	return Prediction{Verdict: Refused, Reason: "NodeCapacity", Shortfall: short,
		Message: "node didn't have enough allocatable resources: " + strings.Join(msg, "; ")}, true
}

// infeasible holds the kubelet's rules that no other pod's leaving can
// change: allocation/handlers.go (1.36+) and handlePodResourcesResize /
// canResizePod before it.
func infeasible(k Kubelet, minor int, desired *corev1.Pod) (Prediction, bool) {
	no := func(msg string) (Prediction, bool) {
		return Prediction{Verdict: Infeasible, Reason: string(corev1.PodReasonInfeasible), Message: msg}, true
	}
	// features_linux.go IsInPlacePodVerticalScalingAllowed, 1.33-1.35
	// (pkg/kubelet/types IsStaticPod: any config source but the API).
	if src, ok := desired.Annotations["kubernetes.io/config.source"]; minor <= 35 && ok && src != "api" {
		return no("In-place resize of static-pods is not supported")
	}
	if qos(desired) != corev1.PodQOSGuaranteed {
		return Prediction{}, false
	}
	policy := func(kind, name string) string {
		if minor == 33 {
			return fmt.Sprintf("Resize is infeasible for Guaranteed Pods alongside %s %s policy", kind, strings.ToLower(name))
		}
		return fmt.Sprintf("Resize is infeasible for Guaranteed Pods alongside %s policy %q", kind, name)
	}
	if k.CPUManagerPolicy == "static" && requestChanges(minor, desired, corev1.ResourceCPU) {
		return no(policy("CPU Manager", "static"))
	}
	if k.MemoryManagerPolicy == "Static" && requestChanges(minor, desired, corev1.ResourceMemory) {
		return no(policy("Memory Manager", "Static"))
	}
	return Prediction{}, false
}

// requestChanges is guaranteedPodResourceResizeRequired: a resizable
// container's desired request differs from its allocation (an absent
// allocation counts as zero, as the kubelet's empty checkpoint entry does).
func requestChanges(minor int, desired *corev1.Pod, r corev1.ResourceName) bool {
	changes := func(c corev1.Container) bool {
		var allocated resource.Quantity
		if st := status(desired, c.Name); st != nil {
			allocated = st.AllocatedResources[r]
		}
		return !c.Resources.Requests[r].Equal(allocated)
	}
	for _, c := range desired.Spec.InitContainers {
		// allocation_manager.go IsResizableContainer: sidecars always,
		// other init containers from 1.36 (InPlacePodVerticalScalingInitContainers).
		if (minor >= 36 || restartable(c)) && changes(c) {
			return true
		}
	}
	return slices.ContainsFunc(desired.Spec.Containers, changes)
}

// unchanged: every resizable container's requests equal its
// allocatedResources and its limits the limits in status.resources (the
// kubelet's checkpoint holds both; the API shows the allocated requests and
// the actuated limits), and, from 1.36, the pod-level requests equal
// status.allocatedResources. Where the status does not tell, the resize is
// taken to change something.
func unchanged(minor int, desired *corev1.Pod) bool {
	same := func(c corev1.Container) bool {
		st := status(desired, c.Name)
		if st == nil || st.AllocatedResources == nil {
			return false
		}
		var limits corev1.ResourceList
		if st.Resources != nil {
			limits = st.Resources.Limits
		} else if len(c.Resources.Limits) > 0 {
			return false
		}
		return equal(c.Resources.Requests, st.AllocatedResources) && equal(c.Resources.Limits, limits)
	}
	for _, c := range desired.Spec.InitContainers {
		if (minor >= 36 || restartable(c)) && !same(c) {
			return false
		}
	}
	for _, c := range desired.Spec.Containers {
		if !same(c) {
			return false
		}
	}
	if minor >= 36 && resourcehelper.IsPodLevelRequestsSet(desired) {
		for r, q := range desired.Spec.Resources.Requests {
			if a, ok := desired.Status.AllocatedResources[r]; resourcehelper.IsSupportedPodLevelResource(r) && (!ok || !q.Equal(a)) {
				return false
			}
		}
	}
	return true
}

func equal(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for r, q := range a {
		if o, ok := b[r]; !ok || !q.Equal(o) {
			return false
		}
	}
	return true
}

// aboveAllocatable is canResizePod's capacity rule, 1.33-1.35: requests
// (pkg/api/v1/resource GetResourceRequest: pod-level resources replace the
// containers', overhead added to a non-zero sum) above allocatable are
// Infeasible, memory named first.
func aboveAllocatable(desired *corev1.Pod, alloc corev1.ResourceList) (Prediction, bool) {
	podLevel := resourcehelper.IsPodLevelResourcesSet(desired)
	req := resourcehelper.PodRequests(desired, resourcehelper.PodResourcesOptions{SkipContainerLevelResources: podLevel, ExcludeOverhead: true})
	total := func(r corev1.ResourceName) resource.Quantity {
		q := req[r].DeepCopy()
		if o, ok := desired.Spec.Overhead[r]; ok && !q.IsZero() {
			q.Add(o)
		}
		return q
	}
	cpu, mem := total(corev1.ResourceCPU), total(corev1.ResourceMemory)
	var s *Shortfall
	switch {
	case mem.Value() > alloc.Memory().Value():
		s = &Shortfall{Resource: corev1.ResourceMemory, Requested: mem.Value(), Capacity: alloc.Memory().Value()}
	case cpu.MilliValue() > alloc.Cpu().MilliValue():
		s = &Shortfall{Resource: corev1.ResourceCPU, Requested: cpu.MilliValue(), Capacity: alloc.Cpu().MilliValue()}
	default:
		return Prediction{}, false
	}
	return Prediction{Verdict: Infeasible, Reason: string(corev1.PodReasonInfeasible), Shortfall: s,
		Message: fmt.Sprintf("Node didn't have enough capacity: %s, requested: %d, capacity: %d", s.Resource, s.Requested, s.Capacity)}, true
}

func (s *Shortfall) message() string {
	// lifecycle/predicate.go InsufficientResourceError.Error.
	return fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d", s.Resource, s.Requested, s.Used, s.Capacity)
}

func qos(p *corev1.Pod) corev1.PodQOSClass {
	// The API server sets status.qosClass at creation and a resize cannot
	// change it; without it, the plain container rule.
	if p.Status.QOSClass != "" {
		return p.Status.QOSClass
	}
	guaranteed, set := true, false
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			l, hasLimit := c.Resources.Limits[r]
			q, hasReq := c.Resources.Requests[r]
			set = set || hasLimit || hasReq
			if !hasLimit || (hasReq && !q.Equal(l)) {
				guaranteed = false
			}
		}
	}
	switch {
	case !set:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

func restartable(c corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func status(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, l := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}
