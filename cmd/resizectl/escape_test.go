package main

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostileServerOutputEscaped: names and messages with ANSI escapes,
// C1 controls, DEL and newlines (issue 15: printed raw) come out escaped,
// in tables, in JSON and in errors.
func TestHostileServerOutputEscaped(t *testing.T) {
	const evil = `web\u001b[2J\u001b]0;pwned\u0007\u009b31m\u007f\nFAKE ROW\t`
	sock := filepath.Join(t.TempDir(), "evil.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/intents", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`[{"id":"x1","spec":{"target":{"name":"` + evil + `"}},"status":{"state":"Failed","reason":"R\u001b[0m","message":"` + evil + `"}}]`))
	})
	mux.HandleFunc("GET /v1/containers", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`[{"name":"` + evil + `","cgroupPath":"/p/` + evil + `","pendingIntent":"` + evil + `"}]`))
	})
	mux.HandleFunc("DELETE /v1/containers/{name...}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(409)
		w.Write([]byte(`{"error":"` + evil + `","reason":"Conflict"}`))
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	defer srv.Close()
	raw := func(s string) bool { return strings.ContainsAny(s, "\x1b\x07\x7f\u009b") }
	for _, args := range [][]string{{"list"}, {"list", "-o", "json"}, {"containers"}, {"containers", "-o", "json"}, {"forget", "web"}} {
		code, out, errs := ctl(t, sock, args...)
		if raw(out) || raw(errs) {
			t.Errorf("%v: raw control characters printed: %q %q", args, out, errs)
		}
		if strings.Contains(out, "\nFAKE ROW") || strings.Contains(errs, "\nFAKE ROW") {
			t.Errorf("%v: a newline in a name forged a row: %q", args, out)
		}
		if args[0] == "forget" {
			if code != exitError || !strings.Contains(errs, `\x1b[2J`) {
				t.Errorf("forget: %d %q", code, errs)
			}
		} else if !strings.Contains(out, `\x1b[2J`) && !strings.Contains(out, `\u001b[2J`) {
			t.Errorf("%v: the escaped name is not shown: %q", args, out)
		}
	}
}
