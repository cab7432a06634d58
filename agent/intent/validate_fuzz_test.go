package intent_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
)

// maxMilliCPU mirrors the bound in resources.go.
const maxMilliCPU = 1 << 30

// FuzzValidate feeds Validate specs with random quantities for requests and
// limits, paths and IDs. It must never panic; it either refuses the spec with
// an error matching ErrInvalid, or returns a change whose values the agent
// can write (cpu in [0, 2^30] millicores, memory in [0, MaxInt64] bytes,
// cgroup values the kernel accepts at any period), which renders back to
// the same values, and a spec that validates again to itself.
func FuzzValidate(f *testing.F) {
	for _, s := range [][7]string{
		{"", "/kubepods/pod1/web", "/kubepods/pod1", "500m", "1", "256Mi", "512Mi"},
		{"id-1", "kubepods/pod1/web", "", "", "2", "", "1Gi"},
		{"", "/a", "", "-1", "", "", ""},
		{"", "/a", "", "", "10000000", "", ""},
		{"", "/a", "", "1n", "1u", "1n", "0.5"},
		{"", "/a", "", "", "", "", "1e100"},
		{"", "/a", "", "", "9e99", "", "9e99"},
		{"", "/a", "", "", "9e99999999", "", "1e-9999999"},
		{"", "/a", "", "", "", "", "9223372036854775807"},
		{"", "/a", "", "", "", "", "9223372036854775808"},
		{"", "/a", "", "", "", "", "8Ei"},
		{"", "/a", "", "", "", "", "7.99999Ei"},
		{"", "/a", "", "1073741824m", "1073741825m", "", ""},
		{"", "/a", "", "", "", "1.5", "0.1"},
		{"", "/a", "", "2", "1", "2Gi", "1Gi"},
		{"", "/a", "", "0", "0", "0", "0"},
		{"", "/a", "", "1E", "1P", "", ""},
		{"a b", "/a", "", "1", "", "", ""},
		{"", "/b/a", "/c", "1", "", "", ""},
		{"", "/../x", "", "1", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6])
	}
	f.Fuzz(func(t *testing.T, id, path, podPath, cpuReq, cpuLim, memReq, memLim string) {
		s := intent.Spec{ID: id, Target: intent.Target{Name: "c", CgroupPath: path, PodCgroupPath: podPath}}
		set := func(l *corev1.ResourceList, name corev1.ResourceName, v string) {
			if v == "" {
				return
			}
			if js, _ := json.Marshal(v); intent.CheckQuantities(js) != nil {
				return // refused before decoding
			}
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return // a JSON decoding error, before Validate
			}
			if *l == nil {
				*l = corev1.ResourceList{}
			}
			(*l)[name] = q
		}
		set(&s.Resources.Requests, corev1.ResourceCPU, cpuReq)
		set(&s.Resources.Limits, corev1.ResourceCPU, cpuLim)
		set(&s.Resources.Requests, corev1.ResourceMemory, memReq)
		set(&s.Resources.Limits, corev1.ResourceMemory, memLim)

		got, c, err := intent.Validate(s)
		if err != nil {
			if !errors.Is(err, intent.ErrInvalid) {
				t.Fatalf("Validate(%+v) = %v, not ErrInvalid", s, err)
			}
			return
		}
		check := func(what string, v *int64, max int64, format func(int64) string, value func(resource.Quantity) int64) {
			if v == nil {
				return
			}
			if *v < 0 || *v > max {
				t.Fatalf("%s = %d, outside [0, %d] (spec %+v)", what, *v, max, s.Resources)
			}
			q, err := resource.ParseQuantity(format(*v))
			if err != nil || value(q) != *v {
				t.Fatalf("%s = %d renders as %q, which parses back to %d, %v", what, *v, format(*v), value(q), err)
			}
		}
		milli := func(q resource.Quantity) int64 { return q.MilliValue() }
		bytes := func(q resource.Quantity) int64 { return q.Value() }
		check("cpu request", c.CPURequest, maxMilliCPU, intent.FormatCPU, milli)
		check("cpu limit", c.CPULimit, maxMilliCPU, intent.FormatCPU, milli)
		check("memory request", c.MemoryRequest, math.MaxInt64, intent.FormatMemory, bytes)
		check("memory limit", c.MemoryLimit, math.MaxInt64, intent.FormatMemory, bytes)

		if r, err := c.Apply(intent.Resources{}, true, true); err != nil {
			if !errors.Is(err, intent.ErrInvalid) {
				t.Fatalf("Apply = %v, not ErrInvalid", err)
			}
		} else {
			for _, period := range []uint64{cgroup.MinPeriod, cgroup.DefaultPeriod, cgroup.MaxPeriod} {
				if err := r.Cgroup(period, true, true).Validate(); err != nil {
					t.Fatalf("%+v at period %d: %v", r, period, err)
				}
			}
		}

		again, c2, err := intent.Validate(got)
		if err != nil || !reflect.DeepEqual(again, got) || !reflect.DeepEqual(c2, c) {
			t.Fatalf("Validate is not idempotent: %+v -> %+v, %v", got, again, err)
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var back intent.Spec
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s does not decode: %v", b, err)
		}
		if _, c3, err := intent.Validate(back); err != nil || !reflect.DeepEqual(c3, c) {
			t.Fatalf("%s validates to %+v, %v; want %+v", b, c3, err, c)
		}
	})
}

func TestCheckQuantities(t *testing.T) {
	for js, ok := range map[string]bool{
		`{"resources":{"limits":{"cpu":"1.5","memory":"1e9","x":"2E"}}}`: true,
		`{"id":"1e12"}`: true,
		`{"resources":{"limits":{"cpu":"1e-9999999"}}}`:                         false,
		`{"resources":{"limits":{"cpu":1e-9999999}}}`:                           false,
		`{"resources":{"limits":{"cpu":"1","cpu":" 9E+999 "}}}`:                 false,
		`{"resources":{"Limits":{"memory":"` + strings.Repeat("9", 70) + `"}}}`: false,
		`{"resources":`: true, // the decoder reports it
	} {
		if err := intent.CheckQuantities([]byte(js)); (err == nil) != ok || (err != nil && !errors.Is(err, intent.ErrInvalid)) {
			t.Errorf("CheckQuantities(%s) = %v, want ok=%v", js, err, ok)
		}
	}
}

// TestHugeQuantities: values Quantity.Value wraps (to 0: no limit) or
// takes minutes to compare are refused as too large, at once.
func TestHugeQuantities(t *testing.T) {
	for _, v := range []string{"1e100", "9e99999999", "9223372036854775808", "8Ei"} {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			s := intent.Spec{Target: intent.Target{Name: "c", CgroupPath: "/a"}}
			s.Resources.Limits = corev1.ResourceList{name: resource.MustParse(v)}
			_, c, err := intent.Validate(s)
			if name == corev1.ResourceMemory && v == "8Ei" {
				// The parser caps binary quantities at MaxInt64.
				if err != nil || *c.MemoryLimit != math.MaxInt64 {
					t.Errorf("memory 8Ei: %+v, %v", c, err)
				}
				continue
			}
			if !errors.Is(err, intent.ErrInvalid) || !strings.Contains(err.Error(), "too large") {
				t.Errorf("%s %s: Validate = %+v, %v", name, v, c, err)
			}
		}
	}
}
