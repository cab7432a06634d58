package reclaim

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/resizer/resize-agent/agent/actuate"
	"github.com/resizer/resize-agent/cgroup"
)

const mi = 1 << 20

func pod(specLimit, statusLimit string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(specLimit)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			Resources: &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(statusLimit)}}}}},
	}
}

func TestPending(t *testing.T) {
	p := pod("48Mi", "160Mi")
	// The container's, then the pod cgroup's (the sum of its containers').
	if got := Pending(p); len(got) != 2 || got[0] != (Decrease{Container: "app", Desired: 48 * mi, Actuated: 160 * mi}) ||
		got[1] != (Decrease{Desired: 48 * mi, Actuated: 160 * mi}) {
		t.Errorf("decrease: %+v", got)
	}
	two := pod("48Mi", "160Mi")
	two.Spec.Containers = append(two.Spec.Containers, corev1.Container{Name: "side"})
	if got := Pending(two); len(got) != 1 || got[0].Container != "app" {
		t.Errorf("a container without a limit leaves the pod cgroup unlimited: %+v", got)
	}
	if got := Pending(pod("160Mi", "48Mi")); len(got) != 0 {
		t.Errorf("an increase is not the reclaimer's: %+v", got)
	}
	if got := Pending(pod("48Mi", "48Mi")); len(got) != 0 {
		t.Errorf("done: %+v", got)
	}
	p.Status.ContainerStatuses[0].Resources = nil
	if got := Pending(p); len(got) != 0 {
		t.Errorf("no status resources: %+v", got)
	}
	// A sidecar is resized in place too; the pod's limit counts it, and an
	// init container that ran before, the kubelet's way (the larger of the
	// init container and what runs after it).
	always := corev1.ContainerRestartPolicyAlways
	lim := func(v string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(v)}}
	}
	sc := pod("48Mi", "160Mi")
	sc.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: lim("300Mi")}, {Name: "side", RestartPolicy: &always, Resources: lim("32Mi")}}
	side := lim("64Mi")
	sc.Status.InitContainerStatuses = []corev1.ContainerStatus{
		{Name: "init", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}},
		{Name: "side", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, Resources: &side},
	}
	// Pod: max(init 300Mi, side 32Mi + app 48Mi) = 300Mi both ways: no
	// decrease of the pod's own.
	if got := Pending(sc); len(got) != 2 || got[0] != (Decrease{Container: "side", Desired: 32 * mi, Actuated: 64 * mi}) || got[1].Container != "app" {
		t.Errorf("sidecar decrease: %+v", got)
	}
	sc.Spec.InitContainers[0].Resources = lim("16Mi")
	if got := Pending(sc); len(got) != 3 || got[2] != (Decrease{Desired: 80 * mi, Actuated: 224 * mi}) {
		t.Errorf("sidecar and container decreases, the pod's sum: %+v", got)
	}
	sc.Spec.Overhead = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("10Mi")}
	if got := Pending(sc); len(got) != 3 || got[2] != (Decrease{Desired: 90 * mi, Actuated: 234 * mi}) {
		t.Errorf("with overhead: %+v", got)
	}
	sc.Status.InitContainerStatuses[1].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}
	if got := Pending(sc); len(got) != 1 || got[0].Container != "app" {
		t.Errorf("a sidecar not running: neither its nor the pod's judged: %+v", got)
	}
	pl := pod("48Mi", "48Mi")
	pl.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}
	pl.Status.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}}
	if got := Pending(pl); len(got) != 1 || got[0].Container != "" || got[0].Desired != 64*mi || got[0].Actuated != 128*mi {
		t.Errorf("pod-level decrease: %+v", got)
	}
}

// cg is one container cgroup: memory.reclaim frees what it is asked for
// unless anon, and memory.max is never to be written.
type cg struct {
	mu   sync.Mutex
	mem  cgroup.Memory
	anon bool
}

func (c *cg) ReadMemory(string) (cgroup.Memory, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mem, nil
}
func (c *cg) now() cgroup.Memory { m, _ := c.ReadMemory(""); return m }
func (c *cg) SetMemoryHigh(_ string, v int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mem.High = v
	return nil
}
func (c *cg) Reclaim(_ string, n int64) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.anon {
		c.mem.Current -= n
	}
	return n, nil
}
func (c *cg) SupportsReclaim(string) (bool, error) { return true, nil }
func (c *cg) PageSize() int64                      { return 4096 }

type host struct{ c *cg }

func (h host) ContainerCgroups(context.Context, string, string) (string, string, error) {
	return "/kubepods/pu1/c", "/kubepods/pu1", nil
}
func (h host) MemoryCgroups() (actuate.MemoryCgroups, bool) { return h.c, true }

func events(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestHoldUntilTheKubeletApplies: a decrease below usage is reclaimed for,
// memory.high held until the status reports the new limit, then put back;
// anonymous memory ends in a Warning with memory.high as it was, once.
func TestHoldUntilTheKubeletApplies(t *testing.T) {
	for _, anon := range []bool{false, true} {
		c := &cg{mem: cgroup.Memory{Current: 98 * mi, High: cgroup.Unlimited, Max: 160 * mi}, anon: anon}
		p := pod("48Mi", "160Mi")
		client := fake.NewClientset(p)
		rec := record.NewFakeRecorder(10)
		r, err := New(client, host{c}, Options{NodeName: "n", Recorder: rec, Timeout: 2 * time.Second, Poll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		deadline := time.Now().Add(10 * time.Second)
		var evs []string
		for len(evs) == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			evs = events(rec)
		}
		if anon {
			if len(evs) != 1 || !strings.Contains(evs[0], "Warning "+EventMemoryReclaimFailed) || c.now().High != cgroup.Unlimited {
				t.Fatalf("anon: events %q, memory.high %d", evs, c.now().High)
			}
			// An unrelated update does not try again.
			p2 := p.DeepCopy()
			p2.Labels = map[string]string{"x": "y"}
			client.CoreV1().Pods("ns").Update(ctx, p2, metav1.UpdateOptions{})
			time.Sleep(200 * time.Millisecond)
			if more := events(rec); len(more) != 0 {
				t.Errorf("tried again: %q", more)
			}
			cancel()
			<-done
			continue
		}
		m := c.now()
		// One cgroup stands for both the container's and the pod's here.
		if len(evs) == 0 || !strings.Contains(evs[0], "Normal "+EventMemoryReclaimed) || !strings.Contains(evs[0], "container app") || m.High >= 48*mi || m.Current >= 48*mi {
			t.Fatalf("events %q, memory %+v", evs, m)
		}
		// The kubelet applies it: memory.max, then the status.
		c.mu.Lock()
		c.mem.Max = 48 * mi
		c.mu.Unlock()
		p2 := pod("48Mi", "48Mi")
		p2.ResourceVersion = "2"
		if _, err := client.CoreV1().Pods("ns").UpdateStatus(ctx, p2, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for c.now().High != cgroup.Unlimited && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if h := c.now().High; h != cgroup.Unlimited {
			t.Errorf("memory.high %d after the kubelet applied the decrease, want max back", h)
		}
		cancel()
		<-done
	}
}
