package kube

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/agent/kube/podcgroup"
)

// AnnotationResources is the agent's own resize request on a pod: a JSON
// object from container name to the resources it should have, e.g.
//
//	resize.resizer.io/resources: |
//	  {"web": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "512Mi"},
//	           "resizePolicy": [{"resourceName": "memory", "restartPolicy": "NotRequired"}]}}
//
// Each entry overrides the container's resources in the pod spec: for cpu
// and memory, a request or limit the entry gives replaces the spec's, one it
// leaves out keeps the spec's value (a limit with no request anywhere sets
// the request too, as the API server defaults a new pod's). Only cpu and
// memory can be resized. resizePolicy, when given, replaces the container's
// resizePolicy from the spec for this resize. Unknown fields are an error.
const AnnotationResources = "resize.resizer.io/resources"

// An annotation's refusals name at most maxUnknownRefusals unknown
// containers, each name cut to maxNameInMessage bytes.
const (
	maxUnknownRefusals = 5
	maxNameInMessage   = 64
)

// IDPrefix starts the ID of every intent the intake submits.
const IDPrefix = "k8s."

// Mode says whether the intake runs.
type Mode string

const (
	// ModeAnnotation takes resize requests from AnnotationResources
	// (default), once deploy/'s annotation policy is in force (guard.go).
	ModeAnnotation Mode = "annotation"
	// ModeOff disables the intake.
	ModeOff Mode = "off"
)

// ParseMode parses a --kube-intake value. The former spec and both modes
// are refused: with the kubelet resizing in place (on by default from 1.33,
// locked on from 1.35) the pod spec is the kubelet's to actuate, and an
// agent acting on it too was a second authority beside it (issue 13).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAnnotation, ModeOff:
		return m, nil
	case "":
		return ModeAnnotation, nil
	case "spec", "both":
		return "", fmt.Errorf("kube-intake: %q was removed: the kubelet resizes pods from their spec itself (kubectl patch --subresource resize); use annotation or off", s)
	}
	return "", fmt.Errorf("kube-intake: %q is not annotation or off", s)
}

// ContainerResize is one container's entry in AnnotationResources.
type ContainerResize struct {
	Requests     corev1.ResourceList            `json:"requests,omitempty"`
	Limits       corev1.ResourceList            `json:"limits,omitempty"`
	ResizePolicy []corev1.ContainerResizePolicy `json:"resizePolicy,omitempty"`
	// AllowMemoryBelowUsage lets a memory limit go below the container's
	// current usage (the kernel then reclaims and may OOM-kill it).
	AllowMemoryBelowUsage bool `json:"allowMemoryBelowUsage,omitempty"`
}

// ParseAnnotation decodes AnnotationResources strictly: unknown fields,
// trailing data, malformed quantities and resources other than cpu and
// memory are errors.
func ParseAnnotation(v string) (map[string]ContainerResize, error) {
	// Screened first: the quantity parser takes minutes on some exponents,
	// and anyone who may annotate a pod could send them.
	if err := intent.CheckQuantities([]byte(v)); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationResources, err)
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	var out map[string]ContainerResize
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationResources, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("annotation %s: trailing data after the JSON object", AnnotationResources)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("annotation %s: no container named", AnnotationResources)
	}
	for name, c := range out {
		for field, l := range map[string]corev1.ResourceList{"requests": c.Requests, "limits": c.Limits} {
			for res := range l {
				if res != corev1.ResourceCPU && res != corev1.ResourceMemory {
					return nil, fmt.Errorf("annotation %s: container %q: %s.%s: only cpu and memory can be resized", AnnotationResources, name, field, res)
				}
			}
		}
		if len(c.Requests) == 0 && len(c.Limits) == 0 {
			return nil, fmt.Errorf("annotation %s: container %q: give requests or limits", AnnotationResources, name)
		}
		if err := checkBounds(c); err != nil {
			return nil, fmt.Errorf("annotation %s: container %q: %w", AnnotationResources, truncate(name, maxNameInMessage), err)
		}
		if c.AllowMemoryBelowUsage {
			return nil, fmt.Errorf("annotation %s: container %q: allowMemoryBelowUsage has no effect in Kubernetes mode: the kubelet decides whether a memory limit may go below usage", AnnotationResources, truncate(name, maxNameInMessage))
		}
	}
	return out, nil
}

// The largest quantities a request or limit may give. Beyond them a value is
// no limit in all but name (1e18 bytes of memory), or wraps when converted
// to cgroup units (1e99; 1e15 CPUs in cpu.max microseconds): refused rather
// than patched.
var (
	maxCPU    = resource.MustParse("100k") // 100,000 CPUs
	maxMemory = resource.MustParse("1Pi")
)

// checkBounds refuses the quantities that do not mean what they say: a
// negative value, a limit of 0 (which the kubelet takes as no limit), and
// values beyond maxCPU and maxMemory. To lift a limit, resize from the pod
// spec (kubectl), where the API server's validation applies.
func checkBounds(c ContainerResize) error {
	for field, l := range map[string]corev1.ResourceList{"requests": c.Requests, "limits": c.Limits} {
		for res, q := range l {
			max := maxMemory
			if res == corev1.ResourceCPU {
				max = maxCPU
			}
			switch {
			case q.Sign() < 0:
				return fmt.Errorf("%s.%s %s is negative", field, res, q.String())
			case q.Sign() == 0 && field == "limits":
				return fmt.Errorf("limits.%s 0 would mean no limit; a limit must be above 0", res)
			case q.Cmp(max) > 0:
				return fmt.Errorf("%s.%s %s is above %s: it would mean no limit or wrap when converted", field, res, q.String(), max.String())
			case res == corev1.ResourceCPU && q.Sign() > 0 && q.MilliValue() == 0:
				return fmt.Errorf("%s.%s %s is below 1m", field, res, q.String())
			}
		}
	}
	return nil
}

// Desired is what one container of a pod should have.
type Desired struct {
	Container string
	// FieldPath is the container's field path in the pod, for Events:
	// spec.containers{name} or spec.initContainers{name}.
	FieldPath string
	// Source is "annotation" or "spec".
	Source string
	// Spec is the intent to submit, without its ID.
	Spec intent.Spec
	// Hash identifies the spec (the ID's last part).
	Hash string
	// Request is the annotation's entry: what the pods/resize patch sets
	// (only the requests and limits it names).
	Request ContainerResize
	// Init is set for a native sidecar (spec.initContainers).
	Init bool
}

// Refusal is a resize request the intake refuses before the agent sees it,
// for one container or (Container "") for the pod.
type Refusal struct {
	Container string
	Message   string
}

// resizable lists the containers of a pod that can be resized: the regular
// containers and the native sidecars (init containers with restartPolicy
// Always), which run for the pod's life.
func resizable(pod *corev1.Pod) map[string]container {
	out := map[string]container{}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			out[c.Name] = container{c, "spec.initContainers{" + c.Name + "}"}
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		out[c.Name] = container{c, "spec.containers{" + c.Name + "}"}
	}
	return out
}

type container struct {
	*corev1.Container
	fieldPath string
}

func fieldPathOf(pod *corev1.Pod, name string) string {
	if c, ok := resizable(pod)[name]; ok {
		return c.fieldPath
	}
	return ""
}

// DesiredFor works out what the pod's containers should have from its
// annotation. The result is sorted by container name.
func DesiredFor(pod *corev1.Pod) ([]Desired, []Refusal) {
	if podcgroup.Mirror(pod) {
		// Refused here, not by a patch the API server would refuse: the
		// same answer, said the same way every time, without a request.
		return nil, []Refusal{{Message: "annotation " + AnnotationResources + " ignored: a static pod cannot be resized in place (the API server refuses pods/resize for a mirror pod); change its manifest in the kubelet's staticPodPath"}}
	}
	ctrs := resizable(pod)
	want := map[string]Desired{}
	var refusals []Refusal
	if v, ok := pod.Annotations[AnnotationResources]; ok {
		ann, err := ParseAnnotation(v)
		if err != nil {
			refusals = append(refusals, Refusal{Message: err.Error()})
		}
		names := make([]string, 0, len(ann))
		for name := range ann {
			names = append(names, name)
		}
		sort.Strings(names)
		overrides := map[string]corev1.ResourceRequirements{}
		unknown := 0
		for _, name := range names {
			if _, ok := ctrs[name]; !ok {
				// One annotation of 256 KB named 8,000 containers, and each
				// refusal was a log line and an Event (issue 15): a few are
				// told apart, the rest counted in one.
				if unknown++; unknown <= maxUnknownRefusals {
					refusals = append(refusals, Refusal{Container: name, Message: fmt.Sprintf(
						"annotation %s names container %q, which is not a container or a native sidecar of the pod (ordinary init containers and ephemeral containers cannot be resized)",
						AnnotationResources, truncate(name, maxNameInMessage))})
				}
				continue
			}
			e := ann[name]
			overrides[name], _ = fromSpec(ctrs[name].Resources, &e)
		}
		if more := unknown - maxUnknownRefusals; more > 0 {
			refusals = append(refusals, Refusal{Message: fmt.Sprintf(
				"annotation %s names %d more containers that are not in the pod", AnnotationResources, more)})
		}
		if before, after := podQOS(pod, nil), podQOS(pod, overrides); before != after {
			refusals = append(refusals, Refusal{Message: fmt.Sprintf(
				"annotation %s: the resize would change the pod's QoS class from %s to %s, which in-place resize does not allow",
				AnnotationResources, before, after)})
		} else {
			for name, rr := range overrides {
				e := ann[name]
				pol := e.ResizePolicy
				if pol == nil {
					pol = ctrs[name].ResizePolicy
				}
				d := newDesired(pod.UID, name, ctrs[name].fieldPath, "annotation", rr, pol, false)
				d.Request, d.Init = e, strings.HasPrefix(ctrs[name].fieldPath, "spec.initContainers")
				want[name] = d
			}
		}
	}
	out := make([]Desired, 0, len(want))
	for _, d := range want {
		// Not part of the hash: a pod's priority never changes.
		if pod.Spec.Priority != nil {
			d.Spec.Priority = *pod.Spec.Priority
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Container < out[j].Container })
	return out, refusals
}

// fromSpec is the full cpu and memory requirements of a container: its
// spec's, overridden by the annotation's entry when there is one. For a
// resource that either names, both the request and the limit are given: a
// request missing everywhere is the limit (the API server's defaulting), a
// limit missing everywhere is 0, which the agent takes as no limit, as the
// kubelet does. It reports false when neither names cpu or memory.
func fromSpec(spec corev1.ResourceRequirements, ann *ContainerResize) (corev1.ResourceRequirements, bool) {
	out := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := spec.Requests[res]
		lim, hasLim := spec.Limits[res]
		if ann != nil {
			if q, ok := ann.Requests[res]; ok {
				req, hasReq = q, true
			}
			if q, ok := ann.Limits[res]; ok {
				lim, hasLim = q, true
			}
		}
		if !hasReq && !hasLim {
			continue
		}
		if !hasReq {
			req = lim
		}
		if !hasLim {
			lim = resource.Quantity{}
		}
		out.Requests[res] = canonical(req, res)
		out.Limits[res] = canonical(lim, res)
	}
	return out, len(out.Requests) > 0
}

// canonical renders a quantity the same way whatever its input form
// ("0.5" and "500m" are one CPU request), so that the intent's ID depends on
// the value only.
func canonical(q resource.Quantity, res corev1.ResourceName) resource.Quantity {
	if res == corev1.ResourceCPU {
		return *resource.NewMilliQuantity(q.MilliValue(), resource.DecimalSI)
	}
	return *resource.NewQuantity(q.Value(), resource.BinarySI)
}

func newDesired(uid types.UID, name, fieldPath, source string, rr corev1.ResourceRequirements, pol []corev1.ContainerResizePolicy, allowBelow bool) Desired {
	s := intent.Spec{
		Target:                intent.Target{Name: name, PodUID: string(uid)},
		Resources:             rr,
		ResizePolicy:          pol,
		AllowMemoryBelowUsage: allowBelow,
	}
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return Desired{Container: name, FieldPath: fieldPath, Source: source, Spec: s, Hash: hex.EncodeToString(sum[:6])}
}

// IntentID is the ID of the intent for d: k8s.<pod UID>.<container>.<hash>,
// with .<n> appended for n > 0. n is raised only when the same resources
// are asked for again after others (A, B, then A again), so that the new
// request is not taken for the old, already completed, intent.
func IntentID(d Desired, n int) string {
	id := IDPrefix + d.Spec.Target.PodUID + "." + d.Container + "." + d.Hash
	if len(id) > 120 { // not a UUID: keep the ID within the agent's 128 bytes
		sum := sha256.Sum256([]byte(d.Spec.Target.PodUID + "/" + d.Container))
		id = IDPrefix + hex.EncodeToString(sum[:12]) + "." + d.Hash
	}
	if n > 0 {
		id += fmt.Sprintf(".%d", n)
	}
	return id
}

// podQOS is the pod's QoS class with the given containers' requirements
// replaced, as the API server computes it from every container (init
// containers included) on cpu and memory; with pod-level resources, from
// those alone (ComputePodQOS, pkg/apis/core/helper/qos/qos.go): a
// container's resize cannot change it then.
func podQOS(pod *corev1.Pod, override map[string]corev1.ResourceRequirements) corev1.PodQOSClass {
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		return podcgroup.QOS(&corev1.Pod{Spec: pod.Spec})
	}
	var all []intent.Resources
	add := func(c *corev1.Container) {
		rr := c.Resources
		if o, ok := override[c.Name]; ok {
			rr = o
		}
		all = append(all, toResources(rr))
	}
	for i := range pod.Spec.InitContainers {
		add(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return intent.QOSClass(all...)
}

func toResources(rr corev1.ResourceRequirements) intent.Resources {
	get := func(l corev1.ResourceList, res corev1.ResourceName, milli bool) int64 {
		q, ok := l[res]
		if !ok {
			return 0
		}
		if milli {
			return q.MilliValue()
		}
		return q.Value()
	}
	r := intent.Resources{
		CPURequest: get(rr.Requests, corev1.ResourceCPU, true), CPULimit: get(rr.Limits, corev1.ResourceCPU, true),
		MemoryRequest: get(rr.Requests, corev1.ResourceMemory, false), MemoryLimit: get(rr.Limits, corev1.ResourceMemory, false),
	}
	// A request that is not given defaults to the limit.
	if _, ok := rr.Requests[corev1.ResourceCPU]; !ok {
		r.CPURequest = r.CPULimit
	}
	if _, ok := rr.Requests[corev1.ResourceMemory]; !ok {
		r.MemoryRequest = r.MemoryLimit
	}
	return r
}

// describe renders the requirements for an Event, e.g.
// "requests cpu=500m memory=64Mi, limits cpu=1 memory=128Mi".
func describe(rr corev1.ResourceRequirements) string {
	var b bytes.Buffer
	part := func(name string, l corev1.ResourceList) {
		if len(l) == 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(name)
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := l[res]; ok {
				v := q.String()
				if name == "limits" && q.IsZero() {
					v = "none"
				}
				fmt.Fprintf(&b, " %s=%s", res, v)
			}
		}
	}
	part("requests", rr.Requests)
	part("limits", rr.Limits)
	return b.String()
}
