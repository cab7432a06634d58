package apiserver_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/intent"
)

// TestForgetAmbiguousName: with a "web" container in each of two pods,
// forgetting "web" picked either (issue 15: 4 and 16 of 20 runs); it is now
// refused with 409 AmbiguousName naming both keys, and nothing is forgotten.
// The key or the cgroup path names one.
func TestForgetAmbiguousName(t *testing.T) {
	ra := agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 << 30})
	ra.AddContainer(t, "uid-1", "web", "/kubepods/pod1/web")
	ra.AddContainer(t, "uid-2", "web", "/kubepods/pod2/web")
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: apiserver.NewHandler(ra.Agent)}
	go srv.Serve(l)
	defer srv.Close()
	c := api.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, uid := range []string{"uid-1", "uid-2"} {
		s := intent.Spec{Target: intent.Target{Name: "web", PodUID: uid}}
		s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		it, _, err := c.Submit(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if it, err = c.WaitSettled(ctx, it.ID); err != nil || it.Status.State != intent.Completed {
			t.Fatalf("%+v %v", it.Status, err)
		}
	}
	for range 20 {
		err := c.Forget(ctx, "web")
		var se *api.StatusError
		if !errors.As(err, &se) || se.Code != 409 || se.Body.Reason != "AmbiguousName" ||
			!strings.Contains(se.Body.Error, "pod:uid-1/web") || !strings.Contains(se.Body.Error, "pod:uid-2/web") ||
			!strings.Contains(se.Body.Error, "/kubepods/pod2/web") {
			t.Fatalf("forget web = %v", err)
		}
	}
	if cs, _ := c.Containers(ctx); len(cs) != 2 {
		t.Fatalf("an ambiguous forget forgot something: %d containers left", len(cs))
	}
	if err := c.Forget(ctx, "pod:uid-2/web"); err != nil {
		t.Fatal(err)
	}
	cs, _ := c.Containers(ctx)
	if len(cs) != 1 || cs[0].PodUID != "uid-1" {
		t.Fatalf("after forgetting pod:uid-2/web: %+v", cs)
	}
	if err := c.Forget(ctx, "/kubepods/pod1/web"); err != nil {
		t.Fatal(err)
	}
	var se *api.StatusError
	if err := c.Forget(ctx, "web"); !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("forget web with none left = %v", err)
	}
	// A name that is a prefix or part of a key is no match.
	if err := c.Forget(ctx, "pod:uid-1"); !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("forget by a key's prefix = %v", err)
	}
}
