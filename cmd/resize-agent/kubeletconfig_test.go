package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resizer/resize-agent/agent/kube/kubeletconfig"
)

// --kubelet-config: a missing file (or an empty one, as the DaemonSet's
// FileOrCreate mount leaves) means the kubelet's defaults, said in the
// log; one the agent cannot read stops it.
func TestKubeletFile(t *testing.T) {
	dir := t.TempDir()
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	o := DefaultOptions()
	if o.KubeletConfig != kubeletconfig.DefaultPath {
		t.Errorf("default --kubelet-config %q", o.KubeletConfig)
	}
	o.KubeletConfig = filepath.Join(dir, "none.yaml")
	if f, err := kubeletFile(o, log); err != nil || f.Path != "" {
		t.Errorf("missing: %+v %v", f, err)
	}
	if !strings.Contains(logs.String(), "kubelet configuration not found") {
		t.Errorf("no warning: %s", logs.String())
	}
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o.KubeletConfig = empty
	if _, err := kubeletFile(o, log); err != nil {
		t.Errorf("empty: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryThrottlingFactor: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.KubeletConfig = bad
	if _, err := kubeletFile(o, log); !errors.Is(err, kubeletconfig.ErrInvalid) {
		t.Errorf("invalid: %v, want ErrInvalid", err)
	}
	good := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(good, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryThrottlingFactor: 0.8\ncpuCFSQuotaPeriod: 50ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.KubeletConfig = good
	logs.Reset()
	f, err := kubeletFile(o, log)
	if err != nil || f.MemoryThrottlingFactor == nil || *f.MemoryThrottlingFactor != 0.8 {
		t.Errorf("good: %+v %v", f, err)
	}
	if !strings.Contains(logs.String(), "takes the kubelet's CFS period") {
		t.Errorf("a period other than --cpu-period not said: %s", logs.String())
	}
	o.KubeletConfig = ""
	if _, err := kubeletFile(o, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Errorf("not read: %v", err)
	}
}
