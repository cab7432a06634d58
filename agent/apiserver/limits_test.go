package apiserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// TestListPages: a list comes a page at a time (limit, continue, as
// Kubernetes lists do); a client that gives no limit gets at most
// MaxListLimit; the client follows the pages to the end; a forged continue
// token is refused.
func TestListPages(t *testing.T) {
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 4000, Memory: 4 << 30}, "/pod/web", "/pod/db")
	c := api.NewClient(s.Socket)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = apiserver.MaxListLimit + 20
	for i := range n {
		name, path := "web", "/pod/web"
		if i%2 == 1 {
			name, path = "db", "/pod/db"
		}
		sp := intent.Spec{ID: fmt.Sprintf("i%04d", i), Target: intent.Target{Name: name, CgroupPath: path}}
		sp.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(100+i), resource.DecimalSI)}
		if _, _, err := c.Submit(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	// Raw: a bare GET gets one page, and the header to continue.
	resp, err := unixGet(s.Socket, "/v1/intents")
	if err != nil {
		t.Fatal(err)
	}
	var first []intent.Intent
	json.NewDecoder(resp.Body).Decode(&first)
	resp.Body.Close()
	if len(first) != apiserver.MaxListLimit || resp.Header.Get(api.HeaderContinue) == "" {
		t.Errorf("unlimited GET: %d items, continue %q", len(first), resp.Header.Get(api.HeaderContinue))
	}
	// Pages of 7 of one container, in order, with nothing twice.
	var got []string
	cont := ""
	for pages := 0; ; pages++ {
		page, next, err := c.ListPage(ctx, "db", "", 7, cont)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 7 || pages > n {
			t.Fatalf("page of %d", len(page))
		}
		for _, it := range page {
			got = append(got, it.ID)
		}
		if next == "" {
			break
		}
		cont = next
	}
	if len(got) != n/2 || got[0] != "i0001" || got[len(got)-1] != fmt.Sprintf("i%04d", n-1) {
		t.Errorf("paged db intents: %d, %v...", len(got), got[:min(3, len(got))])
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("out of order or repeated: %s after %s", got[i], got[i-1])
		}
	}
	all, err := c.List(ctx, "", "")
	if err != nil || len(all) != n {
		t.Errorf("List followed the pages to %d intents, %v", len(all), err)
	}
	for _, q := range []string{"limit=0", "limit=x", "continue=bogus", "continue=" + strings.Repeat("A", 100), "continue=djE6eA"} {
		resp, err := unixGet(s.Socket, "/v1/intents?"+q)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || (e.Reason != "InvalidQuery" && e.Reason != "InvalidContinue") {
			t.Errorf("%s: %d %+v", q, resp.StatusCode, e)
		}
	}
}

func unixGet(sock, path string) (*http.Response, error) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", sock)
	}}}
	return c.Get("http://agent" + path)
}

// TestWatchLimits: watch streams are capped per peer and in all, with 429
// and a reason; closing one frees its place.
func TestWatchLimits(t *testing.T) {
	s := agenttest.Serve(t, admission.Capacity{MilliCPU: 1000, Memory: 1 << 30})
	h := apiserver.NewHandler(s.Agent, apiserver.WithWatchLimits(3, 2))
	sock := filepath.Join(t.TempDir(), "w.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ConnContext: apiserver.PeerConnContext}
	go srv.Serve(l)
	defer srv.Close()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(tcp)

	open := func(network, addr string) (net.Conn, int, string) {
		t.Helper()
		c, err := net.Dial(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /v1/watch HTTP/1.1\r\nHost: agent\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		if resp.StatusCode != 200 {
			json.NewDecoder(resp.Body).Decode(&e)
		}
		return c, resp.StatusCode, e.Reason
	}
	a, codeA, _ := open("unix", sock)
	b, codeB, _ := open("unix", sock)
	c, codeC, reason := open("unix", sock) // a third from the same user
	if codeA != 200 || codeB != 200 || codeC != 429 || reason != "TooManyWatches" {
		t.Errorf("per peer: %d %d %d %s", codeA, codeB, codeC, reason)
	}
	c.Close()
	d, codeD, _ := open("tcp", tcp.Addr().String()) // another peer
	e, codeE, reason := open("tcp", tcp.Addr().String())
	if codeD != 200 || codeE != 429 || reason != "TooManyWatches" {
		t.Errorf("in all: %d %d %s", codeD, codeE, reason)
	}
	e.Close()
	a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, code, _ := open("tcp", tcp.Addr().String())
		f.Close()
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(errors.New("a closed watch did not free its place"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Close()
	d.Close()
}
