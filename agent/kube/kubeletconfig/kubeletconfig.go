// Package kubeletconfig reads what the agent must know of the node's
// kubelet and the API does not show: its KubeletConfiguration file (the
// one kubeadm and kind write to /var/lib/kubelet/config.yaml). The CPU and
// memory manager policies decide whether a resize can be admitted at all;
// cpuCFSQuota and cpuCFSQuotaPeriod what cpu.max a container holds;
// MemoryQoS, memoryThrottlingFactor and memoryReservationPolicy what
// memory.high it holds. Where the file says nothing, the kubelet's
// defaults for its release apply (Resolve).
//
// Flags on the kubelet's command line and drop-ins of --config-dir are not
// read: kubeadm and kind put these settings in the file, and the kubelet's
// flags for them are deprecated.
package kubeletconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// DefaultPath is where kubeadm and kind write the kubelet's configuration.
const DefaultPath = "/var/lib/kubelet/config.yaml"

// maxSize bounds what is read: a kubelet configuration is a few KiB.
const maxSize = 1 << 20

var (
	// ErrNotFound: there is no file at the path, or an empty one (what a
	// hostPath volume of type FileOrCreate leaves on a node whose kubelet
	// keeps its configuration elsewhere); the kubelet's defaults apply.
	ErrNotFound = errors.New("kubelet configuration not found")
	// ErrInvalid: the file is not a KubeletConfiguration the agent can
	// read; nothing of it is used.
	ErrInvalid = errors.New("invalid kubelet configuration")
)

// File is what the kubelet's configuration file sets of what the agent
// uses; a field the file leaves out is the zero value (nil, "").
type File struct {
	Path                    string
	CPUManagerPolicy        string
	MemoryManagerPolicy     string
	CPUCFSQuota             *bool
	CPUCFSQuotaPeriod       *time.Duration
	MemoryThrottlingFactor  *float64
	MemoryReservationPolicy string
	FeatureGates            map[string]bool
}

// Load reads the KubeletConfiguration at path. Errors match ErrNotFound
// when there is no file, ErrInvalid when it is not one the kubelet would
// read (wrong kind or version, bad YAML, a value out of range).
func Load(path string) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return File{}, fmt.Errorf("%w: %s", ErrNotFound, path)
		}
		return File{}, fmt.Errorf("kubelet configuration: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return File{}, fmt.Errorf("kubelet configuration %s: %w", path, err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return File{}, fmt.Errorf("%w: %s is empty", ErrNotFound, path)
	}
	if len(b) > maxSize {
		return File{}, fmt.Errorf("%w: %s is over %d bytes", ErrInvalid, path, maxSize)
	}
	out, err := Parse(b)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	out.Path = path
	return out, nil
}

// Parse reads a KubeletConfiguration. Fields the agent does not use are
// not checked (a newer kubelet has fields this build does not know).
func Parse(b []byte) (File, error) {
	var c kubeletv1beta1.KubeletConfiguration
	if err := yaml.Unmarshal(b, &c); err != nil {
		return File{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if want := kubeletv1beta1.SchemeGroupVersion.String(); c.APIVersion != want || c.Kind != "KubeletConfiguration" {
		return File{}, fmt.Errorf("%w: apiVersion %q kind %q, want %s KubeletConfiguration", ErrInvalid, c.APIVersion, c.Kind, want)
	}
	out := File{
		CPUManagerPolicy: c.CPUManagerPolicy, MemoryManagerPolicy: c.MemoryManagerPolicy,
		CPUCFSQuota: c.CPUCFSQuota, MemoryThrottlingFactor: c.MemoryThrottlingFactor,
		MemoryReservationPolicy: string(c.MemoryReservationPolicy), FeatureGates: c.FeatureGates,
	}
	if c.CPUCFSQuotaPeriod != nil {
		d := c.CPUCFSQuotaPeriod.Duration
		// The kernel's bounds for cpu.max's period, as the kubelet's
		// validation (pkg/kubelet/apis/config/validation).
		if d < time.Millisecond || d > time.Second {
			return File{}, fmt.Errorf("%w: cpuCFSQuotaPeriod %s outside [1ms, 1s]", ErrInvalid, d)
		}
		out.CPUCFSQuotaPeriod = &d
	}
	// The kubelet refuses a factor outside (0, 1] (validation.go).
	if f := c.MemoryThrottlingFactor; f != nil && (*f <= 0 || *f > 1) {
		return File{}, fmt.Errorf("%w: memoryThrottlingFactor %v outside (0, 1]", ErrInvalid, *f)
	}
	switch out.MemoryReservationPolicy {
	case "", reservationNone, reservationTiered:
	default:
		return File{}, fmt.Errorf("%w: memoryReservationPolicy %q is not None or TieredReservation", ErrInvalid, out.MemoryReservationPolicy)
	}
	return out, nil
}

const (
	reservationNone   = "None"
	reservationTiered = "TieredReservation"
)

// Kubelet is the kubelet's settings the agent follows, the file's values
// over the defaults of the kubelet's release.
type Kubelet struct {
	// CPUManagerPolicy ("none", "static") and MemoryManagerPolicy ("None",
	// "Static").
	CPUManagerPolicy    string
	MemoryManagerPolicy string
	// CPUQuota: the kubelet enforces CPU limits with cpu.max
	// (cpuCFSQuota, default true); Period is cpuCFSQuotaPeriod in µs.
	CPUQuota bool
	Period   uint64
	// MemoryQoS: the gate is on (beta and on by default from 1.37).
	MemoryQoS bool
	// ThrottlingFactor is memoryThrottlingFactor where the kubelet sets
	// memory.high from it (MemoryQoS on), else 0: no memory.high.
	ThrottlingFactor float64
	// TieredReservation: memory.min/low from requests (MemoryQoS on).
	TieredReservation bool
	// PodLevelResources: the gate is on (beta and on from 1.34).
	PodLevelResources bool
}

// Resolve is f over the defaults of the kubelet's minor release
// (pkg/kubelet/apis/config/v1beta1/defaults.go and pkg/features, 1.33 to
// 1.37).
func (f File) Resolve(minor int) Kubelet {
	k := Kubelet{CPUManagerPolicy: "none", MemoryManagerPolicy: "None", CPUQuota: true, Period: 100000}
	if f.CPUManagerPolicy != "" {
		k.CPUManagerPolicy = f.CPUManagerPolicy
	}
	if f.MemoryManagerPolicy != "" {
		k.MemoryManagerPolicy = f.MemoryManagerPolicy
	}
	if f.CPUCFSQuota != nil {
		k.CPUQuota = *f.CPUCFSQuota
	}
	if f.CPUCFSQuotaPeriod != nil {
		k.Period = uint64(*f.CPUCFSQuotaPeriod / time.Microsecond)
	}
	k.MemoryQoS = f.gate("MemoryQoS", minor >= 37)
	k.PodLevelResources = f.gate("PodLevelResources", minor >= 34)
	if k.MemoryQoS {
		switch {
		case f.MemoryThrottlingFactor != nil:
			k.ThrottlingFactor = *f.MemoryThrottlingFactor
		case minor <= 36:
			// Defaulted to 0.9 until 1.36; nil, no memory.high, since.
			k.ThrottlingFactor = 0.9
		}
		k.TieredReservation = f.MemoryReservationPolicy == reservationTiered
	}
	return k
}

func (f File) gate(name string, def bool) bool {
	if v, ok := f.FeatureGates[name]; ok {
		return v
	}
	return def
}
