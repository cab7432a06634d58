package journal

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resizer/resize-agent/agent/intent"
)

// TestAppendRecordMatchesMarshal fills records at random, every exported
// field of every type reachable from Record (empty now and then, for
// omitempty), and holds appendRecord to json.Marshal's bytes.
func TestAppendRecordMatchesMarshal(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var hand []byte
	for i := range 20000 {
		var r Record
		fill(reflect.ValueOf(&r).Elem(), rnd, 0)
		want, werr := json.Marshal(r)
		var err error
		hand, err = appendRecord(hand[:0], &r)
		if (err != nil) != (werr != nil) {
			t.Fatalf("record %d: appendRecord error %v, json.Marshal %v", i, err, werr)
		}
		if werr == nil && !bytes.Equal(hand, want) {
			t.Fatalf("record %d:\nappendRecord %s\njson.Marshal %s", i, hand, want)
		}
	}
}

// TestEncodeDecodes: a line encode makes is read back as the record.
func TestEncodeDecodes(t *testing.T) {
	now := time.Date(2026, 12, 7, 18, 0, 0, 123456789, time.FixedZone("x", 3600))
	r := Record{Seq: 7, Container: "cgroup:/a/b", Intent: intent.Intent{ID: "i1", Origin: intent.OriginAPI,
		Spec:   intent.Spec{ID: "i1", Target: intent.Target{Name: "web <1>", CgroupPath: "/a/b"}},
		Status: intent.Status{State: intent.Completed, Message: "ok & done\n", AcceptedAt: now, UpdatedAt: now, CompletedAt: &now}}}
	r.Intent.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	line, err := encode(r)
	if err != nil {
		t.Fatal(err)
	}
	var got Record
	if why, err := decode(line, &got); err != nil || why != "" {
		t.Fatalf("decode: %s %v", why, err)
	}
	want, _ := json.Marshal(r)
	back, _ := json.Marshal(got)
	if !bytes.Equal(want, back) {
		t.Errorf("read back as\n%s\nwant\n%s", back, want)
	}
}

var (
	quantityType = reflect.TypeFor[resource.Quantity]()
	timeType     = reflect.TypeFor[time.Time]()
	quantities   = []string{"0", "1", "100m", "1500m", "2", "128Mi", "1Gi", "1.5Gi", "500M", "12345678", "1e3", "0.1"}
	runes        = []string{"a", "Z", "0", "/", "-", ".", ":", " ", "<", ">", "&", `"`, `\`, "\n", "\t", "\x01", "\x7f", "é", "\u2028", "\xff", "日"}
)

// fill sets every exported field of v at random.
func fill(v reflect.Value, rnd *rand.Rand, depth int) {
	empty := rnd.IntN(4) == 0 // zero values now and then, for omitempty
	switch v.Type() {
	case quantityType:
		v.Set(reflect.ValueOf(resource.MustParse(quantities[rnd.IntN(len(quantities))])))
		return
	case timeType:
		zones := []*time.Location{time.UTC, time.Local, time.FixedZone("", -5*3600-1800)}
		t := time.Unix(rnd.Int64N(4e9), rnd.Int64N(1e9)).In(zones[rnd.IntN(len(zones))])
		if rnd.IntN(200) == 0 {
			t = time.Date(10000+rnd.IntN(5), 1, 1, 0, 0, 0, 0, time.UTC) // json.Marshal refuses it
		}
		if !empty {
			v.Set(reflect.ValueOf(t))
		}
		return
	}
	if empty && depth > 0 {
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), rnd, depth+1)
			}
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), rnd, depth+1)
		v.Set(p)
	case reflect.Slice:
		n := 1 + rnd.IntN(3)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			fill(s.Index(i), rnd, depth+1)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 1 + rnd.IntN(3) {
			k := reflect.New(v.Type().Key()).Elem()
			fill(k, rnd, depth+1)
			e := reflect.New(v.Type().Elem()).Elem()
			fill(e, rnd, depth+1)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.String:
		var b []byte
		for range rnd.IntN(12) {
			b = append(b, runes[rnd.IntN(len(runes))]...)
		}
		if len(b) == 0 {
			b = []byte("x")
		}
		v.SetString(string(b))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(rnd.Uint64()) >> (64 - v.Type().Bits()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(rnd.Uint64() >> (64 - v.Type().Bits()))
	default:
		panic("fill: no case for " + v.Type().String())
	}
}

func BenchmarkEncode(b *testing.B) {
	now := time.Now()
	s := intent.Spec{ID: "20261207-184201-54c11c341db8bb3b", Target: intent.Target{Name: "c1", CgroupPath: "/b/c1"}}
	s.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(100, resource.DecimalSI)}
	s.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(200, resource.DecimalSI)}
	r := Record{Seq: 5, Container: "cgroup:/b/c1", Intent: intent.Intent{ID: s.ID, Origin: intent.OriginAPI, Spec: s,
		Status: intent.Status{State: intent.Proposed, AcceptedAt: now, UpdatedAt: now}}}
	b.Run("appendRecord", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encode(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
