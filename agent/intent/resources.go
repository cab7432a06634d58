package intent

import (
	"fmt"
	"math"
	"math/big"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/cgroup/spec"
)

// Resources is a container's requests and limits in base units; zero means
// unset.
type Resources struct {
	CPURequest    int64 `json:"cpuRequestMilli"`
	CPULimit      int64 `json:"cpuLimitMilli"`
	MemoryRequest int64 `json:"memoryRequestBytes"`
	MemoryLimit   int64 `json:"memoryLimitBytes"`
}

// Change is the part of Resources an intent names; nil means keep.
type Change struct {
	CPURequest, CPULimit, MemoryRequest, MemoryLimit *int64
}

// maxMilliCPU bounds CPU quantities (a million cores) so that the quota
// arithmetic cannot overflow.
const maxMilliCPU = 1 << 30

// ParseChange validates the resources of a spec: only cpu and memory, no
// negative or absurd quantities, requests not above limits among the values
// given.
func ParseChange(r corev1.ResourceRequirements) (Change, error) {
	var c Change
	if len(r.Claims) > 0 {
		return c, invalid("resources.claims cannot be resized")
	}
	parse := func(field string, l corev1.ResourceList, cpu, mem **int64) error {
		for name, q := range l {
			switch name {
			case corev1.ResourceCPU:
				v, err := quantity(field, name, q, true)
				if err != nil {
					return err
				}
				*cpu = &v
			case corev1.ResourceMemory:
				v, err := quantity(field, name, q, false)
				if err != nil {
					return err
				}
				*mem = &v
			default:
				return invalid("%s.%s: only cpu and memory can be resized", field, name)
			}
		}
		return nil
	}
	if err := parse("requests", r.Requests, &c.CPURequest, &c.MemoryRequest); err != nil {
		return c, err
	}
	if err := parse("limits", r.Limits, &c.CPULimit, &c.MemoryLimit); err != nil {
		return c, err
	}
	if c.IsZero() {
		return c, invalid("resources: nothing to resize (give requests or limits for cpu or memory)")
	}
	return c, nil
}

func quantity(field string, name corev1.ResourceName, q resource.Quantity, milli bool) (int64, error) {
	if q.Sign() < 0 {
		return 0, invalid("%s.%s: %s is negative", field, name, q.String())
	}
	unit, max := int64(0), int64(math.MaxInt64)
	if milli {
		unit, max = 3, maxMilliCPU
	}
	v, ok := scaled(q, unit, max)
	if !ok {
		return 0, invalid("%s.%s: %s is too large", field, name, q.String())
	}
	return v, nil
}

// scaled returns q in units of 10^-unit, rounded up (fractional bytes and
// millicores round up, as the API server's canonical form does), or false
// when that is above max. It works on the decimal's digits and exponent, as
// Quantity.Value and Cmp do not: Value wraps to 0 for 1e100 and Cmp takes
// minutes to scale 9e99999999.
func scaled(q resource.Quantity, unit, max int64) (int64, bool) {
	d := q.AsDec()
	u := d.UnscaledBig()
	if u.Sign() == 0 {
		return 0, true
	}
	ten := big.NewInt(10)
	// q * 10^unit = u * 10^e
	e := unit - int64(d.Scale())
	v := new(big.Int)
	switch digits := int64(len(u.Text(10))); {
	case e > 19:
		return 0, false
	case e >= 0:
		v.Mul(u, new(big.Int).Exp(ten, big.NewInt(e), nil))
	case -e >= digits:
		v.SetInt64(1) // below one unit
	default:
		var rem big.Int
		v.QuoRem(u, new(big.Int).Exp(ten, big.NewInt(-e), nil), &rem)
		if rem.Sign() != 0 {
			v.Add(v, big.NewInt(1))
		}
	}
	if !v.IsInt64() || v.Int64() > max {
		return 0, false
	}
	return v.Int64(), true
}

// IsZero reports whether c changes nothing.
func (c Change) IsZero() bool {
	return c.CPURequest == nil && c.CPULimit == nil && c.MemoryRequest == nil && c.MemoryLimit == nil
}

// Touches reports whether c names the resource ("cpu" or "memory").
func (c Change) Touches(res corev1.ResourceName) bool {
	if res == corev1.ResourceCPU {
		return c.CPURequest != nil || c.CPULimit != nil
	}
	return c.MemoryRequest != nil || c.MemoryLimit != nil
}

// Apply returns cur with c applied. For a resource the agent has not
// managed before (freshCPU, freshMemory), a limit given without its request
// also sets the request, as the API server defaults a new pod's requests to
// its limits.
func (c Change) Apply(cur Resources, freshCPU, freshMemory bool) (Resources, error) {
	set := func(dst *int64, v *int64) {
		if v != nil {
			*dst = *v
		}
	}
	out := cur
	set(&out.CPURequest, c.CPURequest)
	set(&out.CPULimit, c.CPULimit)
	set(&out.MemoryRequest, c.MemoryRequest)
	set(&out.MemoryLimit, c.MemoryLimit)
	if freshCPU && c.CPURequest == nil && c.CPULimit != nil {
		out.CPURequest = *c.CPULimit
	}
	if freshMemory && c.MemoryRequest == nil && c.MemoryLimit != nil {
		out.MemoryRequest = *c.MemoryLimit
	}
	if out.CPULimit > 0 && out.CPURequest > out.CPULimit {
		return out, invalid("cpu request %s must be less than or equal to cpu limit %s", FormatCPU(out.CPURequest), FormatCPU(out.CPULimit))
	}
	if out.MemoryLimit > 0 && out.MemoryRequest > out.MemoryLimit {
		return out, invalid("memory request %s must be less than or equal to memory limit %s", FormatMemory(out.MemoryRequest), FormatMemory(out.MemoryLimit))
	}
	return out, nil
}

// Cgroup returns the cgroup values for r, converted as the kubelet and runc
// do, for the resources that are managed (cpu: cpu.weight and cpu.max;
// memory: memory.max): requests.cpu -> cpu.weight, limits.cpu -> cpu.max, limits.memory ->
// memory.max (no limit: "max"). The memory request is not written: it only
// counts for admission, as with the kubelet.
func (r Resources) Cgroup(period uint64, cpu, memory bool) spec.Resources {
	var out spec.Resources
	if cpu {
		weight := spec.MilliCPUToWeight(r.CPURequest)
		out.CPUWeight = &weight
		out.CPUMax = &spec.CPUMax{Quota: spec.MilliCPUToQuota(r.CPULimit, period), Period: period}
	}
	if memory {
		mem := spec.Unlimited
		if r.MemoryLimit > 0 {
			mem = r.MemoryLimit
		}
		out.MemoryMax = &mem
	}
	return out
}

// FromCgroup infers the limits of a container the agent has not managed
// before from its cgroup's cpu.max and memory.max. Requests cannot be known
// (cpu.weight 100 is both the kernel's default and a 1-CPU request), so they
// stay zero until an intent declares them.
func FromCgroup(s spec.State) Resources {
	var r Resources
	if s.CPUMax.Quota != spec.Unlimited && s.CPUMax.Period > 0 {
		r.CPULimit = s.CPUMax.Quota * spec.MilliCPUToCPU / int64(s.CPUMax.Period)
	}
	if s.MemoryMax != spec.Unlimited {
		r.MemoryLimit = s.MemoryMax
	}
	return r
}

// QOSClass is the Kubernetes QoS class of a pod with these containers.
func QOSClass(containers ...Resources) corev1.PodQOSClass {
	guaranteed, bestEffort := true, true
	for _, r := range containers {
		if r != (Resources{}) {
			bestEffort = false
		}
		if r.CPULimit == 0 || r.MemoryLimit == 0 || r.CPURequest != r.CPULimit || r.MemoryRequest != r.MemoryLimit {
			guaranteed = false
		}
	}
	switch {
	case bestEffort:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// Policies returns the restart policy per resource, NotRequired unless set.
func Policies(p []corev1.ContainerResizePolicy) (map[corev1.ResourceName]corev1.ResourceResizeRestartPolicy, error) {
	out := map[corev1.ResourceName]corev1.ResourceResizeRestartPolicy{
		corev1.ResourceCPU:    corev1.NotRequired,
		corev1.ResourceMemory: corev1.NotRequired,
	}
	var seen []corev1.ResourceName
	for _, rp := range p {
		if rp.ResourceName != corev1.ResourceCPU && rp.ResourceName != corev1.ResourceMemory {
			return nil, invalid("resizePolicy: resourceName %q is not cpu or memory", rp.ResourceName)
		}
		if slices.Contains(seen, rp.ResourceName) {
			return nil, invalid("resizePolicy: %s given twice", rp.ResourceName)
		}
		seen = append(seen, rp.ResourceName)
		switch rp.RestartPolicy {
		case corev1.NotRequired, corev1.RestartContainer:
		default:
			return nil, invalid("resizePolicy: restartPolicy %q for %s is not NotRequired or RestartContainer", rp.RestartPolicy, rp.ResourceName)
		}
		out[rp.ResourceName] = rp.RestartPolicy
	}
	return out, nil
}

// FormatCPU renders millicores as a Kubernetes quantity.
func FormatCPU(milli int64) string {
	return resource.NewMilliQuantity(milli, resource.DecimalSI).String()
}

// FormatMemory renders bytes as a Kubernetes quantity.
func FormatMemory(b int64) string {
	return resource.NewQuantity(b, resource.BinarySI).String()
}

func (r Resources) String() string {
	f := func(v int64, fn func(int64) string) string {
		if v == 0 {
			return "-"
		}
		return fn(v)
	}
	return fmt.Sprintf("cpu %s/%s memory %s/%s",
		f(r.CPURequest, FormatCPU), f(r.CPULimit, FormatCPU), f(r.MemoryRequest, FormatMemory), f(r.MemoryLimit, FormatMemory))
}
