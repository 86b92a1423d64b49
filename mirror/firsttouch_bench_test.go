package mirror

import (
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkFirstTouch measures writes into never-touched mirror memory:
// every op writes 1024 rows of 4 KiB (4 MiB) to consecutive slots no
// earlier op wrote, so the op pays the first-touch faults of two 2 MiB
// chunks. Every 64 ops the 256 MiB mirror is freed and made again, timer
// stopped. pages=huge is the mirror's chunk memory (huge-page aligned and
// advised on Linux), pages=4k plain anonymous memory; workers is the split
// (1: Write; 8 only on machines of 8 CPUs or more). op=warm rewrites the
// same slots (the copy alone) and op=memcpy copies the 4 MiB into a 256 MiB
// region in rotation (DRAM, not cache, bound), in the same run.
func BenchmarkFirstTouch(b *testing.B) {
	const rows, rb, steps = 1024, 4096, 64
	src := make([]byte, rows*rb)
	for i := range src {
		src[i] = byte(i)
	}
	slots := make([]int32, rows)
	run := func(b *testing.B, huge bool, n int, warm bool) {
		defer func(h bool) { hugeChunks = h }(hugeChunks)
		hugeChunks = huge
		w := NewWorkers(n, 0)
		defer w.Stop()
		mk := func() *Mirror {
			m, err := New(rows*steps, rb)
			if err != nil {
				b.Fatal(err)
			}
			return m
		}
		m := mk()
		defer func() { m.Free() }()
		if warm {
			for i := range slots {
				slots[i] = int32(i)
			}
			m.WriteSplit(w, slots, src)
		}
		b.SetBytes(rows * rb)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if !warm {
				r := i % steps
				if r == 0 && i > 0 {
					b.StopTimer()
					m.Free()
					m = mk()
					b.StartTimer()
				}
				for j := range slots {
					slots[j] = int32(r*rows + j)
				}
			}
			m.WriteSplit(w, slots, src)
		}
	}
	ns := []int{1, 2}
	if runtime.NumCPU() >= 8 {
		ns = append(ns, 8)
	}
	for _, n := range ns {
		for _, pages := range []string{"4k", "huge"} {
			b.Run(fmt.Sprintf("op=fresh/pages=%s/workers=%d", pages, n), func(b *testing.B) { run(b, pages == "huge", n, false) })
		}
		b.Run(fmt.Sprintf("op=warm/workers=%d", n), func(b *testing.B) { run(b, true, n, true) })
	}
	b.Run("op=memcpy", func(b *testing.B) {
		dst := make([]byte, steps*rows*rb)
		for i := range dst {
			dst[i] = 1
		}
		b.SetBytes(rows * rb)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r := i % steps
			copy(dst[r*rows*rb:(r+1)*rows*rb], src)
		}
	})
}
