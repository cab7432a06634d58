package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		err     string // "" = valid
		pod     string
		changes int
	}{
		{args: []string{"web", "--cpu-limit", "800m"}, pod: "web", changes: 1},
		{args: []string{"--memory-request=32Mi", "pod/web", "--memory-limit", "1Gi", "-c", "app", "-n", "ns"}, pod: "web", changes: 2},
		{args: []string{"pods/web", "--cpu-request", "0.5"}, pod: "web", changes: 1},
		{args: []string{"web", "--cpu-request", "0"}, pod: "web", changes: 1},
		{args: []string{"--cpu-limit", "1"}, err: "give the pod"},
		{args: []string{"a", "b", "--cpu-limit", "1"}, err: "one pod at a time"},
		{args: []string{"deployment/web", "--cpu-limit", "1"}, err: "only pods"},
		{args: []string{"pod/", "--cpu-limit", "1"}, err: "empty pod name"},
		{args: []string{"web"}, err: "nothing to change"},
		{args: []string{"web", "--cpu-limit", ""}, err: `--cpu-limit ""`},
		{args: []string{"web", "--cpu-limit", "-1"}, err: "must not be negative"},
		{args: []string{"web", "--memory-request", "-64Mi"}, err: "must not be negative"},
		{args: []string{"web", "--memory-limit", "1 Gi"}, err: "--memory-limit"},
		{args: []string{"web", "--cpu-limit", "1", "-o", "table"}, err: "use json or yaml"},
		{args: []string{"web", "--cpu-limit", "1", "--timeout", "0s"}, err: "must be positive"},
		{args: []string{"web", "--cpu-limit", "1", "--agent-wait", "-1s"}, err: "must not be negative"},
		{args: []string{"web", "--cpu-limt", "1"}, err: "unknown flag"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			o, err := parseOptions(tc.args, io.Discard)
			if tc.err != "" {
				var ue usageError
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &ue) {
					t.Fatalf("error %v, want a usage error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.pod != tc.pod || len(o.changes) != tc.changes {
				t.Errorf("pod %q, %d changes; want %q, %d", o.pod, len(o.changes), tc.pod, tc.changes)
			}
		})
	}
	if _, err := parseOptions([]string{"--help"}, io.Discard); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

func TestParseOptionsKeepsKubectlFlags(t *testing.T) {
	o, err := parseOptions([]string{"web", "--cpu-limit", "1", "--kubeconfig", "/k", "--context", "ctx", "-n", "ns", "--as", "someone"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if *o.config.KubeConfig != "/k" || *o.config.Context != "ctx" || *o.config.Namespace != "ns" || *o.config.Impersonate != "someone" {
		t.Errorf("connection flags not kept: %q %q %q %q", *o.config.KubeConfig, *o.config.Context, *o.config.Namespace, *o.config.Impersonate)
	}
	if o.changes[0].flag != "cpu-limit" || !o.changes[0].limit || o.changes[0].value.String() != "1" {
		t.Errorf("change %+v", o.changes[0])
	}
}
