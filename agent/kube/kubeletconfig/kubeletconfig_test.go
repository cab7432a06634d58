package kubeletconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kind node's configuration as kubeadm writes it, with the settings
// the agent follows changed from their defaults.
const kindConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  webhook: {enabled: true, cacheTTL: 0s}
cgroupDriver: systemd
cpuManagerPolicy: static
memoryManagerPolicy: Static
cpuCFSQuotaPeriod: 50ms
memoryThrottlingFactor: 0.8
memoryReservationPolicy: TieredReservation
featureGates:
  MemoryQoS: true
someFieldOfALaterRelease: 1
`

func TestLoadAndResolve(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(kindConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, minor := range []int{33, 36, 37} {
		k := f.Resolve(minor)
		want := Kubelet{CPUManagerPolicy: "static", MemoryManagerPolicy: "Static", CPUQuota: true, Period: 50000,
			MemoryQoS: true, ThrottlingFactor: 0.8, TieredReservation: true, PodLevelResources: minor >= 34}
		if k != want {
			t.Errorf("1.%d: %+v, want %+v", minor, k, want)
		}
	}
}

// The defaults of each release: MemoryQoS on from 1.37, where the factor
// defaults to nil (kubelet config v1beta1 types.go: "Default: 0.9" in
// v0.36.6, "Default: nil" in v0.37.2).
func TestDefaults(t *testing.T) {
	f, err := Parse([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		minor int
		want  Kubelet
	}{
		{33, Kubelet{CPUManagerPolicy: "none", MemoryManagerPolicy: "None", CPUQuota: true, Period: 100000}},
		{34, Kubelet{CPUManagerPolicy: "none", MemoryManagerPolicy: "None", CPUQuota: true, Period: 100000, PodLevelResources: true}},
		{37, Kubelet{CPUManagerPolicy: "none", MemoryManagerPolicy: "None", CPUQuota: true, Period: 100000, PodLevelResources: true, MemoryQoS: true}},
	}
	for _, c := range cases {
		if got := f.Resolve(c.minor); got != c.want {
			t.Errorf("1.%d: %+v, want %+v", c.minor, got, c.want)
		}
	}
	// MemoryQoS switched on in 1.36 takes that release's default factor.
	f.FeatureGates = map[string]bool{"MemoryQoS": true}
	if got := f.Resolve(36); !got.MemoryQoS || got.ThrottlingFactor != 0.9 {
		t.Errorf("1.36 with MemoryQoS: %+v, want factor 0.9", got)
	}
	// And switched off in 1.37, no memory.high whatever the factor.
	f.FeatureGates = map[string]bool{"MemoryQoS": false}
	factor := 0.5
	f.MemoryThrottlingFactor = &factor
	if got := f.Resolve(37); got.MemoryQoS || got.ThrottlingFactor != 0 {
		t.Errorf("1.37 without MemoryQoS: %+v, want no factor", got)
	}
	off := false
	f.CPUCFSQuota = &off
	if got := f.Resolve(37); got.CPUQuota {
		t.Errorf("cpuCFSQuota false: %+v", got)
	}
}

func TestInvalid(t *testing.T) {
	head := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	for name, in := range map[string]string{
		"not yaml":        "{",
		"another kind":    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
		"another version": "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n",
		"no kind":         "cpuManagerPolicy: static\n",
		"factor 0":        head + "memoryThrottlingFactor: 0\n",
		"factor 1.5":      head + "memoryThrottlingFactor: 1.5\n",
		"period 2s":       head + "cpuCFSQuotaPeriod: 2s\n",
		"period 10us":     head + "cpuCFSQuotaPeriod: 10us\n",
		"policy":          head + "memoryReservationPolicy: Tiered\n",
		"wrong type":      head + "cpuManagerPolicy: [static]\n",
	} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "none.yaml")); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing file: %v, want ErrNotFound", err)
	}
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(empty); !errors.Is(err, ErrNotFound) {
		t.Errorf("empty file: %v, want ErrNotFound", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n#"+strings.Repeat("x", maxSize)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); !errors.Is(err, ErrInvalid) {
		t.Errorf("a file over the bound: %v, want ErrInvalid", err)
	}
}
