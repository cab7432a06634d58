package bpf

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"testing"
	"time"
)

func TestHistogramBounds(t *testing.T) {
	var h Histogram
	b := h.UpperBounds()
	if len(b) != HistogramBuckets || HistogramBuckets != 26 {
		t.Fatalf("%d bounds, HistogramBuckets %d", len(b), HistogramBuckets)
	}
	if b[0] != 1e-6 || b[1] != 2e-6 || b[10] != 1024e-6 || !math.IsInf(b[len(b)-1], 1) {
		t.Errorf("bounds %v", b)
	}
	if got, want := b[len(b)-2], math.Ldexp(1e-6, 24); got != want {
		t.Errorf("last finite bound %v, want %v (2^24 µs)", got, want)
	}
}

// hist builds a histogram as the kernel would from latencies.
func hist(lat ...time.Duration) Histogram {
	h := Histogram{Buckets: make([]uint64, HistogramBuckets)}
	for _, d := range lat {
		us := uint64(d / time.Microsecond)
		slot := 0
		if us > 0 {
			slot = bits.Len64(us) // floor(log2)+1
		}
		if slot > HistogramBuckets-1 {
			slot = HistogramBuckets - 1
		}
		h.Buckets[slot]++
		h.Count++
		h.Sum += d
	}
	return h
}

func TestHistogramQuantileMeanCumulative(t *testing.T) {
	var empty Histogram
	if empty.Mean() != 0 || empty.Quantile(0.5) != 0 {
		t.Error("empty histogram: non-zero mean or quantile")
	}

	// 90 samples of 3 µs (bucket [2,4) µs), 10 of 100 ms.
	var lat []time.Duration
	for i := 0; i < 90; i++ {
		lat = append(lat, 3*time.Microsecond)
	}
	for i := 0; i < 10; i++ {
		lat = append(lat, 100*time.Millisecond)
	}
	h := hist(lat...)
	if p50 := h.Quantile(0.5); p50 < 2*time.Microsecond || p50 > 4*time.Microsecond {
		t.Errorf("p50 %v, want in [2µs, 4µs]", p50)
	}
	// 100 ms = 100000 µs is in [65536, 131072) µs.
	if p99 := h.Quantile(0.99); p99 < 65536*time.Microsecond || p99 > 131072*time.Microsecond {
		t.Errorf("p99 %v, want in [65.5ms, 131ms]", p99)
	}
	if want := (90*3*time.Microsecond + time.Second) / 100; h.Mean() != want {
		t.Errorf("mean %v, want %v", h.Mean(), want)
	}

	c := h.Cumulative()
	if len(c) != HistogramBuckets-1 {
		t.Fatalf("%d cumulative buckets", len(c))
	}
	if c[2e-6] != 0 || c[4e-6] != 90 || c[0.065536] != 90 || c[0.131072] != 100 {
		t.Errorf("cumulative %v", c)
	}
	var prev uint64
	for _, ub := range h.UpperBounds()[:HistogramBuckets-1] {
		if c[ub] < prev {
			t.Errorf("cumulative count falls at %v", ub)
		}
		prev = c[ub]
	}

	// The open last bucket: its lower bound.
	big := hist(time.Minute)
	if q := big.Quantile(0.5); q != time.Duration(math.Ldexp(1e-6, 24)*float64(time.Second)) {
		t.Errorf("quantile in the open bucket %v", q)
	}
}

func TestDecodeOOM(t *testing.T) {
	var buf bytes.Buffer
	r := oomRecord{BootNs: 1, CgroupID: 4242, Pid: 17, Tid: 18}
	copy(r.Comm[:], "stress")
	if err := binary.Write(&buf, binary.NativeEndian, &r); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != oomRecordSize {
		t.Fatalf("record is %d bytes, struct oom_event is %d", buf.Len(), oomRecordSize)
	}
	ev, ok := decodeOOM(buf.Bytes())
	if !ok || ev.PID != 17 || ev.TID != 18 || ev.CgroupID != 4242 || ev.Comm != "stress" {
		t.Errorf("decoded %+v, %v", ev, ok)
	}
	if _, ok := decodeOOM(buf.Bytes()[:10]); ok {
		t.Error("short record decoded")
	}
}
