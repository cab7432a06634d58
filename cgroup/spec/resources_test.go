package spec

import (
	"math"
	"testing"
)

// TestPageAlignPageCounterMax: memory.max at or above the page counter's
// maximum (LONG_MAX/PAGE_SIZE pages) reads back as "max", and a write of
// such a value must verify.
func TestPageAlignPageCounterMax(t *testing.T) {
	const page = 4096
	top := int64(math.MaxInt64/page) * page // PAGE_COUNTER_MAX pages, in bytes
	for _, tc := range []struct{ in, want int64 }{
		{Unlimited, Unlimited},
		{4097, 4096},
		{top - 1, top - page},
		{top, Unlimited},
		{top + page - 1, Unlimited},
		{math.MaxInt64, Unlimited},
	} {
		if got := PageAlign(tc.in, page); got != tc.want {
			t.Errorf("PageAlign(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
	huge := int64(math.MaxInt64)
	st := State{MemoryMax: Unlimited}
	if !st.Matches(Resources{MemoryMax: &huge}, page) {
		t.Errorf("memory.max %d reads back as max, but Matches refuses it", huge)
	}
}
