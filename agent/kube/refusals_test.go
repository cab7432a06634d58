package kube

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/agenttest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHugeAnnotationLogsOneLine: an annotation of about 256 KB naming 8,000
// containers the pod does not have made 8,002 warning lines (2.4 MB of log,
// issue 15). It now makes one line of at most a few KB, a handful of
// Events, and a second bad annotation within the interval logs nothing more.
func TestHugeAnnotationLogsOneLine(t *testing.T) {
	var logs lockedBuffer
	f := &fixture{t: t, client: fake.NewClientset(), ra: agenttest.NewRuntimeAgent(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}), rec: &recorder{}}
	f.installPolicy()
	in, err := New(f.client, f.ra.Agent, Options{NodeName: "node-a", Recorder: f.rec,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	defer func() { cancel(); <-done }()

	huge := func(prefix string) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range 8000 {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"%s-%04d-\u001b[31m":{"limits":{"cpu":"1"}}`, prefix, i)
		}
		b.WriteString("}")
		return b.String()
	}
	ann := huge("ghost")
	t.Logf("annotation: %d bytes", len(ann))
	f.pod("p1", burstable, ann, true)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "resize request refused") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.annotate("p1", huge("spook"))
	time.Sleep(500 * time.Millisecond) // the update is handled
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "resize request refused") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || len(lines[0]) > 2048 {
		t.Errorf("%d refusal lines, the first %d bytes", len(lines), len(lines[0]))
	}
	for _, e := range f.rec.all() {
		if strings.Contains(e, "\x1b") {
			t.Errorf("a raw escape in an Event: %q", e)
		}
	}
	if strings.Contains(logs.String(), "\x1b") {
		t.Error("a raw escape in the log")
	}
	if n := len(f.rec.all()); n == 0 || n > 2*(maxUnknownRefusals+1) {
		t.Errorf("%d Events for two bad annotations", n)
	}
	if e := f.rec.find("names 7995 more containers"); e == "" {
		t.Errorf("the rest not counted: %v", f.rec.all())
	}
	t.Logf("log: %d bytes; line: %s", len(logs.String()), lines[0])
}

func TestRefusalEventsQuoteNames(t *testing.T) {
	if got := printable("web\x1b[31m"); strings.Contains(got, "\x1b") || !strings.Contains(got, `\x1b`) {
		t.Errorf("printable = %q", got)
	}
	if got := printable(strings.Repeat("a", 10000)); len(got) > maxNameInMessage {
		t.Errorf("printable kept %d bytes", len(got))
	}
}
