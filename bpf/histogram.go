package bpf

import (
	"math"
	"time"
)

// HistogramBuckets is the number of buckets of a run-queue latency
// histogram.
const HistogramBuckets = len(pressureRunqHist{}.Slots)

// Histogram is a log2 histogram of latencies in microseconds.
//
// Buckets[0] counts samples below 1 µs; Buckets[i], for 0 < i <
// HistogramBuckets-1, counts samples in [2^(i-1) µs, 2^i µs); the last
// bucket counts everything from 2^(HistogramBuckets-2) µs (about 16.8 s) up.
// Buckets are not cumulative. Sum is exact (nanoseconds).
type Histogram struct {
	Buckets []uint64
	Count   uint64
	Sum     time.Duration
}

// bucketUpperBound is the upper bound of bucket i in seconds; +Inf for the
// last bucket.
func bucketUpperBound(i int) float64 {
	if i >= HistogramBuckets-1 {
		return math.Inf(1)
	}
	return math.Ldexp(1e-6, i) // 2^i µs
}

// UpperBounds returns the (exclusive) upper bound of each bucket in seconds,
// HistogramBuckets values: 1e-6, 2e-6, 4e-6, ..., and +Inf for the last
// bucket. Prometheus' "le" buckets are inclusive; at microsecond
// resolution the difference does not matter.
func (h Histogram) UpperBounds() []float64 {
	b := make([]float64, HistogramBuckets)
	for i := range b {
		b[i] = bucketUpperBound(i)
	}
	return b
}

// Cumulative returns the cumulative count per finite upper bound (seconds),
// the shape prometheus.NewConstHistogram takes together with Count and
// Sum.Seconds(); the +Inf bucket is implied by Count.
func (h Histogram) Cumulative() map[float64]uint64 {
	m := make(map[float64]uint64, HistogramBuckets-1)
	var acc uint64
	for i := 0; i < HistogramBuckets-1; i++ {
		if i < len(h.Buckets) {
			acc += h.Buckets[i]
		}
		m[bucketUpperBound(i)] = acc
	}
	return m
}

// Mean is Sum/Count, 0 without samples.
func (h Histogram) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / time.Duration(h.Count)
}

// Quantile estimates the q-quantile (0 <= q <= 1) by linear interpolation
// inside the bucket that holds it, like Prometheus' histogram_quantile. For
// the last (open) bucket it returns that bucket's lower bound. 0 without
// samples.
func (h Histogram) Quantile(q float64) time.Duration {
	var total uint64
	for _, c := range h.Buckets {
		total += c
	}
	if total == 0 {
		return 0
	}
	q = math.Max(0, math.Min(1, q))
	rank := q * float64(total)
	var acc uint64
	for i, c := range h.Buckets {
		if c == 0 || float64(acc+c) < rank {
			acc += c
			continue
		}
		lower := 0.0
		if i > 0 {
			lower = bucketUpperBound(i - 1)
		}
		upper := bucketUpperBound(i)
		if math.IsInf(upper, 1) {
			return secondsToDuration(lower)
		}
		frac := (rank - float64(acc)) / float64(c)
		return secondsToDuration(lower + (upper-lower)*frac)
	}
	return secondsToDuration(bucketUpperBound(HistogramBuckets - 2))
}

func secondsToDuration(s float64) time.Duration {
	return time.Duration(s * float64(time.Second))
}

// add adds one CPU's raw histogram.
func (h *Histogram) add(v *pressureRunqHist) {
	if h.Buckets == nil {
		h.Buckets = make([]uint64, HistogramBuckets)
	}
	for i, c := range v.Slots {
		h.Buckets[i] += c
	}
	h.Count += v.Count
	h.Sum += time.Duration(v.SumNs)
}
