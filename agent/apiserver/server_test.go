package apiserver_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

func serve(t *testing.T) (string, *agent.Agent, string) {
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 2000, Memory: 4 << 30}, "/pod/web")
	return s.Socket, s.Agent, s.Root
}

func post(t *testing.T, sock, body string, header map[string]string) (int, string) {
	t.Helper()
	return postTo(t, sock, "/v1/intents", body, header)
}

// postTo posts body as JSON to path on the unix socket sock.
func postTo(t *testing.T, sock, path, body string, header map[string]string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", sock)
	}}}
	req, _ := http.NewRequest(http.MethodPost, "http://x"+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	sock, a, root := serve(t)
	for name, tc := range map[string]struct {
		body string
		code int
		msg  string
	}{
		"not json":          {`{"target":`, 400, "decoding intent"},
		"unknown field":     {`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1"}},"force":true}`, 400, `force`},
		"unknown nested":    {`{"target":{"name":"web","cgroupPath":"/pod/web","uid":"x"},"resources":{"limits":{"cpu":"1"}}}`, 400, `uid`},
		"malformed qty":     {`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"one"}}}`, 400, "quantities must match"},
		"negative":          {`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"memory":"-1Gi"}}}`, 422, "negative"},
		"escape":            {`{"target":{"name":"web","cgroupPath":"/pod/../../../etc"},"resources":{"limits":{"cpu":"1"}}}`, 422, "cgroupPath"},
		"trailing":          {`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1"}}} {}`, 400, "trailing data"},
		"missing cgroup":    {`{"target":{"name":"x","cgroupPath":"/nope"},"resources":{"limits":{"cpu":"1"}}}`, 404, "does not exist"},
		"oversized":         {`{"target":{"name":"` + strings.Repeat("a", apiserver.MaxBodyBytes) + `"}}`, 413, "over"},
		"nothing to resize": {`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{}}`, 422, "nothing to resize"},
	} {
		code, body := post(t, sock, tc.body, nil)
		if code != tc.code || !strings.Contains(body, tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", name, code, body, tc.code, tc.msg)
		}
	}
	if code, _ := post(t, sock, `{}`, map[string]string{"Content-Type": "text/plain"}); code != 415 {
		t.Errorf("text/plain: %d", code)
	}
	if n := len(a.List(agent.Filter{}, "")); n != 0 {
		t.Errorf("%d intents stored from bad input", n)
	}
	if len(a.Containers()) != 0 {
		t.Error("bad input registered a container")
	}
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "cpu.max"); got != "max 100000" {
		t.Errorf("cpu.max changed to %s", got)
	}
}

func TestClientRoundTrip(t *testing.T) {
	sock, _, root := serve(t)
	c := api.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := intent.Spec{ID: "r1", Target: intent.Target{Name: "web", CgroupPath: "pod/web"}}
	s.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	it, created, err := c.Submit(ctx, s)
	if err != nil || !created || it.ID != "r1" || it.Spec.Target.CgroupPath != "/pod/web" {
		t.Fatalf("%+v %v %v", it, created, err)
	}
	it, err = c.WaitSettled(ctx, "r1")
	if err != nil || it.Status.State != intent.Completed {
		t.Fatalf("%+v %v", it.Status, err)
	}
	if _, created, err := c.Submit(ctx, s); err != nil || created {
		t.Errorf("idempotent resubmit: created=%v %v", created, err)
	}
	if got := cgrouptest.ReadFile(t, root, "/pod/web", "memory.max"); got != "67108864" {
		t.Errorf("memory.max %s", got)
	}
	list, err := c.List(ctx, "web", intent.Completed)
	if err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v", list, err)
	}
	cs, err := c.Containers(ctx)
	if err != nil || len(cs) != 1 || cs[0].Cgroup == nil || cs[0].Cgroup.CPUMax != "50000 100000" || cs[0].Cgroup.CPUWeight != 35 {
		t.Errorf("Containers = %+v, %v", cs, err)
	}
	n, err := c.Node(ctx)
	if err != nil || n.Allocated.MilliCPU != 250 || n.Free.MilliCPU != 1750 {
		t.Errorf("Node = %+v, %v", n, err)
	}
	_, err = c.Get(ctx, "nope")
	var se *api.StatusError
	if !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("Get(nope) = %v", err)
	}
	if _, err := c.List(ctx, "", "Bogus"); err == nil {
		t.Error("bogus state accepted")
	}
	if err := c.Forget(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Node(ctx); n.Allocated.MilliCPU != 0 {
		t.Errorf("forget did not release: %+v", n)
	}
}

func TestWatchStreamsStateChanges(t *testing.T) {
	sock, _, _ := serve(t)
	c := api.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan []intent.State, 1)
	started := make(chan struct{})
	go func() {
		var states []intent.State
		close(started)
		c.Watch(ctx, agent.Filter{Container: "web"}, func(e agent.Event) bool {
			states = append(states, e.Intent.Status.State)
			return !e.Intent.Status.State.Terminal()
		})
		got <- states
	}()
	<-started
	time.Sleep(100 * time.Millisecond) // let the watch connect
	s := intent.Spec{Target: intent.Target{Name: "web", CgroupPath: "/pod/web"}}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
	if _, _, err := c.Submit(ctx, s); err != nil {
		t.Fatal(err)
	}
	states := <-got
	if strings.Join(stateNames(states), ",") != "Proposed,InProgress,Completed" {
		t.Errorf("watched %v", states)
	}
}

func stateNames(s []intent.State) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = string(v)
	}
	return out
}

// TestSubmitRetriedOnClosedKeepAlive: a submission whose kept-alive
// connection the server closes as it goes out (an agent at
// --max-connections closes the longest idle one) is sent again on a new
// connection and accepted once. Without the Idempotency-Key the client
// sends, net/http gives the caller the EOF instead.
func TestSubmitRetriedOnClosedKeepAlive(t *testing.T) {
	sock, a, _ := serve(t)
	// A proxy that drops the first connection when its second request
	// comes, without passing it on.
	front := filepath.Join(t.TempDir(), "front.sock")
	l, err := net.Listen("unix", front)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			first := conns.Add(1) == 1
			go func() {
				defer c.Close()
				b, err := net.Dial("unix", sock)
				if err != nil {
					return
				}
				defer b.Close()
				go io.Copy(c, b)
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if first && n == 1 {
						return // closed as the reused connection's request arrives
					}
					if err := req.Write(b); err != nil {
						return
					}
				}
			}()
		}
	}()
	c := api.NewClient(front)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Node(ctx); err != nil { // the connection, kept alive
		t.Fatal(err)
	}
	s := intent.Spec{Target: intent.Target{Name: "web", CgroupPath: "pod/web"}}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}
	it, created, err := c.Submit(ctx, s)
	if err != nil || !created {
		t.Fatalf("submit over a connection closed as it was reused: %+v created=%v %v", it, created, err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections; want the reused one and the retry's", n)
	}
	if all := a.List(agent.Filter{}, ""); len(all) != 1 {
		t.Errorf("%d intents accepted, want 1", len(all))
	}
}

// slowContainers takes longer to list the containers than the server's
// write timeout.
type slowContainers struct {
	apiserver.Service
	took time.Duration
}

func (s slowContainers) Containers() []api.ContainerInfo {
	time.Sleep(s.took)
	return []api.ContainerInfo{{Name: "web"}}
}

// TestSlowAnswerNotCutOff: an answer that took longer to make than the
// server's write timeout is still written (the timeout bounds a slow
// reader); it was cut off unwritten, an EOF for the client, as the bench
// saw for GET /v1/containers with 1,000 containers on a loaded host.
func TestSlowAnswerNotCutOff(t *testing.T) {
	_, a, _ := serve(t)
	sock := filepath.Join(t.TempDir(), "slow.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: apiserver.NewHandler(slowContainers{Service: a, took: 1500 * time.Millisecond}), WriteTimeout: time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := api.NewClient(sock).Containers(ctx)
	if err != nil || len(cs) != 1 {
		t.Fatalf("containers, made in 1.5 s under a 1 s write timeout: %v %v", cs, err)
	}
}
