package admission_test

import (
	"strconv"
	"testing"

	"github.com/resizer/resize-agent/agent/admission"
)

var sinkDecision admission.Decision

// ledgerWith returns a ledger holding n containers of 10m CPU and 1 MiB,
// on a node big enough for all of them and the benchmark's requests.
func ledgerWith(n int) (*admission.Ledger, []string) {
	l := admission.NewLedger(admission.Capacity{MilliCPU: 1 << 40, Memory: 1 << 50})
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "/kubepods/burstable/pod" + strconv.Itoa(i) + "/ctr"
		l.Set(keys[i], admission.Capacity{MilliCPU: 10, Memory: 1 << 20})
	}
	return l, keys
}

var ledgerSizes = []int{10, 100, 1000, 10000}

// BenchmarkReserve grows and shrinks containers in turn, so that every
// other Reserve is a growth that needs the free capacity.
func BenchmarkReserve(b *testing.B) {
	for _, n := range ledgerSizes {
		b.Run("entries="+strconv.Itoa(n), func(b *testing.B) {
			l, keys := ledgerWith(n)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				req := admission.Capacity{MilliCPU: 10 + int64(i%2)*10, Memory: 1 << 20}
				sinkDecision = l.Reserve(keys[i%len(keys)], req)
			}
		})
	}
}

// BenchmarkCheckDeferred is a growth that does not fit now: the path that
// also formats the message.
func BenchmarkCheckDeferred(b *testing.B) {
	for _, n := range ledgerSizes {
		b.Run("entries="+strconv.Itoa(n), func(b *testing.B) {
			l := admission.NewLedger(admission.Capacity{MilliCPU: int64(n) * 10, Memory: int64(n) << 20})
			for i := range n {
				l.Set("c"+strconv.Itoa(i), admission.Capacity{MilliCPU: 10, Memory: 1 << 20})
			}
			b.ReportAllocs()
			for b.Loop() {
				sinkDecision = l.Check("c0", admission.Capacity{MilliCPU: 20, Memory: 1 << 20})
				if sinkDecision.Verdict != admission.Deferred {
					b.Fatal(sinkDecision)
				}
			}
		})
	}
}
