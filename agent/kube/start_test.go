package kube

import (
	"context"
	"testing"
)

func TestConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		c       Config
		enabled bool
		valid   bool
	}{
		"default outside kubernetes": {Config{Intake: "annotation"}, false, true},
		"in cluster":                 {Config{Intake: "annotation", NodeName: "n"}, true, true},
		"off":                        {Config{Intake: "off", NodeName: "n"}, false, true},
		"bad mode":                   {Config{Intake: "pods", NodeName: "n"}, false, false},
		"kubeconfig, no node":        {Config{Intake: "annotation", Kubeconfig: "/k"}, false, false},
		"spec (removed)":             {Config{Intake: "spec", NodeName: "n"}, false, false},
		"both (removed)":             {Config{Intake: "both", NodeName: "n"}, false, false},
	} {
		if got := tc.c.Enabled(); got != tc.enabled {
			t.Errorf("%s: Enabled %v", name, got)
		}
		if err := tc.c.Validate(); (err == nil) != tc.valid {
			t.Errorf("%s: Validate %v", name, err)
		}
	}
	// Disabled: Start does nothing and needs no cluster.
	stop, err := Start(context.Background(), Config{Intake: "annotation", Logger: quiet}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := Start(context.Background(), Config{Intake: "annotation", NodeName: "n", Kubeconfig: "/does/not/exist", Logger: quiet}, nil); err == nil {
		t.Error("Start with a missing kubeconfig succeeded")
	}
}
