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

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func cpuLimit(id, q string) intent.Spec {
	s := intent.Spec{ID: id, Target: intent.Target{Name: "web", CgroupPath: "/pod/web"}}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(q)}
	return s
}

// serveHandler serves h on a new unix socket with the given read timeout.
func serveHandler(t *testing.T, h http.Handler, readTimeout time.Duration) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "wait.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadTimeout: readTimeout, ConnContext: apiserver.PeerConnContext}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestSubmitWaitAnswersSettled: with ?wait= the submission's answer is the
// intent once settled, its files already written; an intent that can never
// fit comes back Infeasible the same way.
func TestSubmitWaitAnswersSettled(t *testing.T) {
	sock, _, root := serve(t)
	c := api.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it, created, err := c.SubmitWait(ctx, cpuLimit("w1", "500m"), 5*time.Second)
	if err != nil || !created || it.Status.State != intent.Completed || it.Status.CompletedAt == nil {
		t.Fatalf("SubmitWait = %+v created=%v %v", it.Status, created, err)
	}
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "cpu.max"); got != "50000 100000" {
		t.Errorf("cpu.max %q when the answer came", got)
	}
	// A repeat is answered 200 with the settled intent, not a second one.
	if it, created, err := c.SubmitWait(ctx, cpuLimit("w1", "500m"), 5*time.Second); err != nil || created || it.Status.State != intent.Completed {
		t.Errorf("repeat: %+v created=%v %v", it.Status, created, err)
	}
	s := cpuLimit("w2", "8")
	s.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}
	if it, _, err := c.SubmitWait(ctx, s, 5*time.Second); err != nil || it.Status.State != intent.Infeasible {
		t.Errorf("8 CPUs on a 2-CPU node: %+v %v", it.Status, err)
	}
}

// TestSubmitWaitBadValues: a wait that is not a duration in (0, 5m] is a
// 400 before anything is accepted.
func TestSubmitWaitBadValues(t *testing.T) {
	sock, a, root := serve(t)
	body := `{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1"}}}`
	for _, v := range []string{"abc", "0s", "-1s", "6m", "1", "1e9h"} {
		code, msg := postTo(t, sock, "/v1/intents?wait="+v, body, nil)
		if code != http.StatusBadRequest || !strings.Contains(msg, "InvalidQuery") {
			t.Errorf("wait=%s: %d %s", v, code, msg)
		}
	}
	if n := len(a.List(agent.Filter{}, "")); n != 0 {
		t.Errorf("%d intents stored from a bad wait", n)
	}
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "cpu.max"); got != "max 100000" {
		t.Errorf("cpu.max %q after bad waits", got)
	}
}

// slowAwait settles only after delay, or blocks until the request ends
// when delay is 0.
type slowAwait struct {
	apiserver.Service
	delay          time.Duration
	started, ended chan struct{}
}

func (s slowAwait) Await(ctx context.Context, id string) (intent.Intent, error) {
	if s.started != nil {
		close(s.started)
	}
	var after <-chan time.Time
	if s.delay > 0 {
		after = time.After(s.delay)
	}
	select {
	case <-after:
		return s.Service.Await(ctx, id)
	case <-ctx.Done():
		if s.ended != nil {
			close(s.ended)
		}
		return intent.Intent{}, ctx.Err()
	}
}

// TestSubmitWaitOutlastsReadTimeout: a wait longer than the server's read
// timeout still answers with the settled intent: were the read deadline
// left in place, it would end the request's context once it passed.
func TestSubmitWaitOutlastsReadTimeout(t *testing.T) {
	_, a, _ := serve(t)
	sock := serveHandler(t, apiserver.NewHandler(slowAwait{Service: a, delay: 1500 * time.Millisecond}), time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it, _, err := api.NewClient(sock).SubmitWait(ctx, cpuLimit("slow", "300m"), 5*time.Second)
	if err != nil || it.Status.State != intent.Completed {
		t.Fatalf("settled after 1.5 s under a 1 s read timeout: %+v %v", it.Status, err)
	}
}

// TestSubmitWaitCountsAsAWatch: a waiting submission holds a watch
// stream's place while it waits and frees it when its client leaves; at
// the cap the submission is answered at once, unsettled, and accepted.
func TestSubmitWaitCountsAsAWatch(t *testing.T) {
	_, a, _ := serve(t)
	started, ended := make(chan struct{}), make(chan struct{})
	sock := serveHandler(t, apiserver.NewHandler(slowAwait{Service: a, started: started, ended: ended}, apiserver.WithWatchLimits(1, 1)), 0)
	c := api.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	wctx, leave := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, _, err := c.SubmitWait(wctx, cpuLimit("held", "300m"), time.Minute)
		waited <- err
	}()
	// While it waits, the one watch place is taken.
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the submission did not wait")
	}
	resp, err := unixGet(sock, "/v1/watch?intent=held")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a waiting submission did not take the watch place: %d", resp.StatusCode)
	}
	// At the cap, another submission is accepted and answered at once.
	t0 := time.Now()
	it, created, err := c.SubmitWait(ctx, cpuLimit("capped", "400m"), time.Minute)
	if err != nil || !created || it.Status.State != intent.Proposed || time.Since(t0) > 5*time.Second {
		t.Errorf("at the cap: %+v created=%v %v after %v", it.Status, created, err, time.Since(t0))
	}
	for {
		it, err := c.Get(ctx, "capped")
		if err != nil {
			t.Fatal(err)
		}
		if it.Status.State == intent.Completed {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the capped submission: %+v", it.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	leave()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Errorf("the client that left: %v", err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end with its client")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := unixGet(sock, "/v1/watch?intent=held")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the place of a submission whose client left was not freed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
