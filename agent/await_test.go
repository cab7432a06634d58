package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/resizer/resize-agent/agent"
	"github.com/resizer/resize-agent/agent/admission"
	"github.com/resizer/resize-agent/agent/intent"
)

// TestAwait: Await answers an unknown id with ErrNotFound, an unsettled
// intent as it stands when its context ends, and the settled intent once
// its writes are done, at once when it had already settled.
func TestAwait(t *testing.T) {
	f := newFixture(t, admission.Capacity{MilliCPU: 4000, Memory: 8 * gi}, "/pod/web")
	if _, err := f.a.Await(context.Background(), "nope"); !errors.Is(err, agent.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	f.cg.block = make(chan struct{})
	it, _, err := f.a.Submit(spec("web", "/pod/web", nil, map[string]string{"cpu": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	for f.cg.blocked.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	cur, err := f.a.Await(ctx, it.ID)
	cancel()
	if err != nil || cur.Status.State != intent.InProgress {
		t.Fatalf("while the write hangs: %s %v", cur.Status.State, err)
	}
	done := make(chan intent.Intent, 1)
	go func() {
		cur, _ := f.a.Await(context.Background(), it.ID)
		done <- cur
	}()
	close(f.cg.block)
	select {
	case cur = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Await did not return once the intent settled")
	}
	want(t, cur, intent.Completed, intent.ReasonApplied)
	ctx, cancel = context.WithCancel(context.Background())
	cancel() // already settled: answered whatever the context
	if cur, err := f.a.Await(ctx, it.ID); err != nil || cur.Status.State != intent.Completed {
		t.Errorf("settled: %s %v", cur.Status.State, err)
	}
}
