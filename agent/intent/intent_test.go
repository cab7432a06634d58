package intent_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
)

func spec(t *testing.T, js string) intent.Spec {
	t.Helper()
	var s intent.Spec
	d := json.NewDecoder(strings.NewReader(js))
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		t.Fatalf("decode %s: %v", js, err)
	}
	return s
}

func TestValidate(t *testing.T) {
	ok := spec(t, `{"target":{"name":"web","cgroupPath":"kubepods/pod1/web","podCgroupPath":"/kubepods/pod1"},
		"resources":{"requests":{"cpu":"500m","memory":"256Mi"},"limits":{"cpu":"1","memory":"512Mi"}},
		"resizePolicy":[{"resourceName":"memory","restartPolicy":"NotRequired"}]}`)
	s, c, err := intent.Validate(ok)
	if err != nil {
		t.Fatal(err)
	}
	if s.Target.CgroupPath != "/kubepods/pod1/web" {
		t.Errorf("path not canonical: %q", s.Target.CgroupPath)
	}
	if *c.CPURequest != 500 || *c.CPULimit != 1000 || *c.MemoryRequest != 256<<20 || *c.MemoryLimit != 512<<20 {
		t.Errorf("change = %+v", c)
	}
	for name, js := range map[string]string{
		"escape":        `{"target":{"name":"a","cgroupPath":"../../etc"},"resources":{"limits":{"cpu":"1"}}}`,
		"root":          `{"target":{"name":"a","cgroupPath":"/"},"resources":{"limits":{"cpu":"1"}}}`,
		"no name":       `{"target":{"cgroupPath":"/a"},"resources":{"limits":{"cpu":"1"}}}`,
		"negative":      `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"-1"}}}`,
		"negative mem":  `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"requests":{"memory":"-5Mi"}}}`,
		"huge cpu":      `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"10000000"}}}`,
		"gpu":           `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"nvidia.com/gpu":"1"}}}`,
		"empty":         `{"target":{"name":"a","cgroupPath":"/a"},"resources":{}}`,
		"outside pod":   `{"target":{"name":"a","cgroupPath":"/b/a","podCgroupPath":"/c"},"resources":{"limits":{"cpu":"1"}}}`,
		"bad policy":    `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"1"}},"resizePolicy":[{"resourceName":"cpu","restartPolicy":"Sometimes"}]}`,
		"twice policy":  `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"1"}},"resizePolicy":[{"resourceName":"cpu","restartPolicy":"NotRequired"},{"resourceName":"cpu","restartPolicy":"NotRequired"}]}`,
		"policy on gpu": `{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"1"}},"resizePolicy":[{"resourceName":"gpu","restartPolicy":"NotRequired"}]}`,
		"bad id":        `{"id":"a b","target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"1"}}}`,
	} {
		if _, _, err := intent.Validate(spec(t, js)); !errors.Is(err, intent.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
	}
}

func TestMalformedQuantityIsADecodeError(t *testing.T) {
	var s intent.Spec
	err := json.Unmarshal([]byte(`{"target":{"name":"a","cgroupPath":"/a"},"resources":{"limits":{"cpu":"1.2.3"}}}`), &s)
	if err == nil {
		t.Fatal("malformed quantity decoded")
	}
}

func i64(v int64) *int64 { return &v }

func TestApply(t *testing.T) {
	cur := intent.Resources{CPURequest: 500, CPULimit: 1000, MemoryRequest: 1 << 20, MemoryLimit: 2 << 20}
	got, err := intent.Change{CPULimit: i64(2000)}.Apply(cur, false, false)
	if err != nil || got != (intent.Resources{500, 2000, 1 << 20, 2 << 20}) {
		t.Errorf("Apply = %+v, %v", got, err)
	}
	// A fresh container's requests default to its limits.
	got, err = intent.Change{CPULimit: i64(2000), MemoryLimit: i64(4 << 20)}.Apply(intent.Resources{}, true, true)
	if err != nil || got != (intent.Resources{2000, 2000, 4 << 20, 4 << 20}) {
		t.Errorf("Apply fresh = %+v, %v", got, err)
	}
	if _, err := (intent.Change{CPULimit: i64(100)}).Apply(cur, false, false); !errors.Is(err, intent.ErrInvalid) {
		t.Errorf("limit below request: %v", err)
	}
	if _, err := (intent.Change{MemoryRequest: i64(3 << 20)}).Apply(cur, false, false); !errors.Is(err, intent.ErrInvalid) {
		t.Errorf("memory request above limit: %v", err)
	}
}

func TestQOSClass(t *testing.T) {
	g := intent.Resources{1000, 1000, 1 << 20, 1 << 20}
	b := intent.Resources{CPURequest: 100}
	for _, tc := range []struct {
		in   []intent.Resources
		want corev1.PodQOSClass
	}{
		{[]intent.Resources{g}, corev1.PodQOSGuaranteed},
		{[]intent.Resources{g, g}, corev1.PodQOSGuaranteed},
		{[]intent.Resources{g, b}, corev1.PodQOSBurstable},
		{[]intent.Resources{b}, corev1.PodQOSBurstable},
		{[]intent.Resources{{}}, corev1.PodQOSBestEffort},
		{[]intent.Resources{{}, b}, corev1.PodQOSBurstable},
		{[]intent.Resources{{CPULimit: 1000, MemoryLimit: 5}}, corev1.PodQOSBurstable},
	} {
		if got := intent.QOSClass(tc.in...); got != tc.want {
			t.Errorf("QOSClass(%+v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestCgroupConversion(t *testing.T) {
	r := intent.Resources{CPURequest: 250, CPULimit: 500, MemoryLimit: 128 << 20}.Cgroup(100000, true, true)
	if *r.CPUWeight != 35 || r.CPUMax.String() != "50000 100000" || *r.MemoryMax != 128<<20 {
		t.Errorf("Cgroup = %v", r.Values())
	}
	r = intent.Resources{}.Cgroup(100000, true, true)
	if *r.CPUWeight != 1 || r.CPUMax.String() != "max 100000" || *r.MemoryMax != cgroup.Unlimited {
		t.Errorf("Cgroup of nothing = %v", r.Values())
	}
	if r := (intent.Resources{CPULimit: 1000}).Cgroup(100000, false, true); r.CPUMax != nil || r.CPUWeight != nil || r.MemoryMax == nil {
		t.Errorf("unmanaged cpu written: %v", r.Values())
	}
}

func TestFromCgroup(t *testing.T) {
	r := intent.FromCgroup(cgroup.State{CPUMax: cgroup.CPUMax{Quota: 150000, Period: 100000}, CPUWeight: 1000, MemoryMax: 64 << 20})
	if r != (intent.Resources{CPULimit: 1500, MemoryLimit: 64 << 20}) {
		t.Errorf("FromCgroup = %+v", r)
	}
	r = intent.FromCgroup(cgroup.State{CPUMax: cgroup.CPUMax{Quota: cgroup.Unlimited, Period: 100000}, CPUWeight: 100, MemoryMax: cgroup.Unlimited})
	if r != (intent.Resources{}) {
		t.Errorf("FromCgroup of an unlimited cgroup = %+v", r)
	}
}

// TestValidateRefusesControlCharacters: names are printed, logged and put in
// metric labels (issue 15: resizectl printed ANSI escapes raw).
func TestValidateRefusesControlCharacters(t *testing.T) {
	base := func(name, path string) intent.Spec {
		s := intent.Spec{Target: intent.Target{Name: name, CgroupPath: path}}
		s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		return s
	}
	if _, _, err := intent.Validate(base("web-1.ü x", "/kubepods/pod1/web")); err != nil {
		t.Fatalf("a printable name: %v", err)
	}
	for name, s := range map[string]intent.Spec{
		"ANSI escape":     base("web\x1b[31mred", "/a"),
		"C0 newline":      base("web\nfake log line", "/a"),
		"tab":             base("we\tb", "/a"),
		"DEL":             base("web\x7f", "/a"),
		"C1 CSI":          base("web\u009b2J", "/a"),
		"bidi override":   base("web\u202egnp.exe", "/a"),
		"invalid UTF-8":   base("web\xff", "/a"),
		"path escape":     base("web", "/kubepods/\x1b]0;title\x07"),
		"pod path C1":     {Target: intent.Target{Name: "web", CgroupPath: "/p/web", PodCgroupPath: "/p\u0085"}, Resources: base("a", "/a").Resources},
		"bell in a path":  base("web", "/a\a"),
		"NUL in the name": base("we\x00b", "/a"),
	} {
		_, _, err := intent.Validate(s)
		if !errors.Is(err, intent.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		} else if strings.ContainsAny(err.Error(), "\x1b\n\x7f\u009b\u202e") {
			t.Errorf("%s: the error repeats the character: %q", name, err)
		}
	}
}
