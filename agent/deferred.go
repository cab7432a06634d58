package agent

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/resizer/resize-agent/agent/intent"
)

// retryDeferredLocked is called the moment capacity frees (a shrink, a
// failed write handing back its reservation, a container forgotten or
// exited). It admits the Deferred intents again one after the other, under
// the lock, so that the order is the kubelet's for pending resizes
// (pkg/kubelet/allocation: sortPendingResizes): resizes that do not
// increase requests first, then higher pod priority, then higher QoS class,
// then the longest Deferred. An intent that still does not fit does not
// block the ones after it, which may be smaller.
func (a *Agent) retryDeferredLocked() {
	type candidate struct {
		c          *container
		increasing bool
		priority   int32
		qos        int
	}
	var ready []candidate
	for c := range a.deferred {
		r := c.pending
		if r == nil || r.Status.State != intent.Deferred || a.containers[c.key] != c {
			delete(a.deferred, c)
			continue
		}
		freshCPU, freshMem := c.fresh()
		want, err := r.change.Apply(c.res, freshCPU, freshMem)
		if err != nil {
			want = c.res // admitLocked fails it with the reason
		}
		now, next := requests(c.res), requests(want)
		ready = append(ready, candidate{
			c:          c,
			increasing: next.MilliCPU > now.MilliCPU || next.Memory > now.Memory,
			priority:   r.Spec.Priority,
			qos:        qosRank(c.qos(c.res)),
		})
	}
	slices.SortFunc(ready, func(x, y candidate) int {
		if x.increasing != y.increasing {
			if !x.increasing {
				return -1
			}
			return 1
		}
		if d := cmp.Compare(y.priority, x.priority); d != 0 {
			return d
		}
		if d := cmp.Compare(y.qos, x.qos); d != 0 {
			return d
		}
		if d := x.c.pending.deferredAt.Compare(y.c.pending.deferredAt); d != 0 {
			return d
		}
		return cmp.Compare(x.c.pending.seq, y.c.pending.seq)
	})
	for _, cand := range ready {
		c := cand.c
		if c.running {
			// Its worker looks at it again when the apply in hand ends.
			c.pending.retry = true
			continue
		}
		r := c.pending
		if want, ok := a.admitLocked(c, r); ok {
			c.admitted = &admittedIntent{r: r, want: want}
			a.kickLocked(c)
		}
	}
}

func qosRank(q corev1.PodQOSClass) int {
	switch q {
	case corev1.PodQOSGuaranteed:
		return 2
	case corev1.PodQOSBurstable:
		return 1
	}
	return 0
}
