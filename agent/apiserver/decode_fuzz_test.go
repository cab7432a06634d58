package apiserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/api"
	"github.com/resizer/resize-agent/agent/apiserver"
	"github.com/resizer/resize-agent/agent/intent"
	"github.com/resizer/resize-agent/cgroup"
	"github.com/resizer/resize-agent/cgroup/cgrouptest"
)

// FuzzDecode drives the real handler, over a real agent on a fake cgroup
// tree, with random bodies for POST /v1/intents (and the same bytes as the
// intent ID, container name and query of the other endpoints). No input may
// panic or get a 5xx; a refusal is a 4xx with {"error","reason"}; an
// accepted intent holds the spec as Validate makes it canonical, reads back
// the same through GET, and the same spec submitted again is the same
// intent (200).
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"500m","memory":"64Mi"}}}`,
		`{"id":"i-1","target":{"name":"db","cgroupPath":"pod/db","podCgroupPath":"/pod"},"resources":{"requests":{"cpu":"100m"},"limits":{"cpu":"1"}},"resizePolicy":[{"resourceName":"memory","restartPolicy":"RestartContainer"}]}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":1.5}}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"one"}}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/../../etc"},"resources":{"limits":{"cpu":"1"}}}`,
		`{"target":{"name":"web","podUID":"abc"},"resources":{"limits":{"cpu":"1"}}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1"}},"force":true}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1"}}} {}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1e-9999999"}}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"memory":"1e100"}}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1","cpu":"2"}}}`,
		`{"Target":{"NAME":"web","cgroupPath":"/pod/web"},"RESOURCES":{"Limits":{"cpu":"1"}}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"claims":[{"name":"x"}]}}`,
		`{"target":{"name":"web","cgroupPath":"/pod/web"},"resources":{"limits":{"cpu":"1"}},"priority":2147483648}`,
		`null`, `[]`, `{}`, `"x"`, ``, `{"target":`, "\xff\xfe", `{"target":{"name":"\u0000"}}`,
	} {
		f.Add([]byte(s))
	}
	root := cgrouptest.FakeTree(f, "/pod/web", "/pod/db")
	a := agent.New(cgroup.New(cgroup.WithMountpoint(root), cgroup.WithoutFilesystemCheck()),
		admission.NewLedger(admission.Capacity{MilliCPU: 4000, Memory: 8 << 30}),
		agent.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	f.Cleanup(func() { a.Close(context.Background()) })
	h := apiserver.NewHandler(a)
	do := func(t *testing.T, method, target string, body []byte) (int, []byte) {
		req := httptest.NewRequest(method, "http://agent"+target, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code, out := rec.Code, rec.Body.Bytes()
		if code >= 500 {
			t.Fatalf("%s %s %q: %d %s", method, target, body, code, out)
		}
		if code >= 400 {
			var e api.Error
			if err := json.Unmarshal(out, &e); err != nil || e.Error == "" || e.Reason == "" {
				t.Fatalf("%s %s %q: %d with body %s, not {error, reason}", method, target, body, code, out)
			}
		}
		return code, out
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		code, out := do(t, http.MethodPost, "/v1/intents", body)
		word := url.PathEscape(string(body))
		do(t, http.MethodGet, "/v1/intents/"+word, nil)
		do(t, http.MethodGet, "/v1/intents?state="+url.QueryEscape(string(body))+"&container="+url.QueryEscape(string(body)), nil)
		if len(word) > 0 && !strings.HasPrefix(word, "web") && !strings.HasPrefix(word, "db") {
			do(t, http.MethodDelete, "/v1/containers/"+word, nil)
		}
		if code != http.StatusAccepted && code != http.StatusOK {
			return
		}
		var it intent.Intent
		if err := json.Unmarshal(out, &it); err != nil || it.ID == "" {
			t.Fatalf("accepted %q: %s, %v", body, out, err)
		}
		var sent intent.Spec
		if err := json.Unmarshal(body, &sent); err != nil {
			t.Fatalf("accepted %q, which does not decode: %v", body, err)
		}
		want, _, err := intent.Validate(sent)
		if err != nil {
			t.Fatalf("accepted %q, which does not validate: %v", body, err)
		}
		if want.ID == "" {
			want.ID = it.ID
		}
		if code == http.StatusAccepted && !sameJSON(t, want, it.Spec) {
			t.Fatalf("accepted %q as %+v, want %+v", body, it.Spec, want)
		}
		_, got := do(t, http.MethodGet, "/v1/intents/"+it.ID, nil)
		var back intent.Intent
		if err := json.Unmarshal(got, &back); err != nil || !sameJSON(t, back.Spec, it.Spec) {
			t.Fatalf("GET %s = %s, %v; want the spec of %s", it.ID, got, err, out)
		}
		again, _ := json.Marshal(it.Spec)
		if code, out := do(t, http.MethodPost, "/v1/intents", again); code != http.StatusOK {
			t.Fatalf("resubmitting %s: %d %s, want 200", again, code, out)
		}
	})
}

func sameJSON(t *testing.T, a, b any) bool {
	x, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}
