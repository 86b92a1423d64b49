package mirror

import (
	"fmt"
	"testing"
)

// BenchmarkSplit places DefaultSplitBytes: a warm scatter of the given size
// (rows of 4 KiB at consecutive slots; 64 rows of 64 bytes for 4KiB, a
// decode step) on one goroutine (split=off) and forced across two
// (split=on, split size 1) in the same run. Below the threshold the
// hand-off costs more than it saves.
func BenchmarkSplit(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20} {
		rb := 4096
		if size == 4<<10 {
			rb = 64
		}
		rows := size / rb
		m, err := New(rows, rb)
		if err != nil {
			b.Fatal(err)
		}
		slots := make([]int32, rows)
		for i := range slots {
			slots[i] = int32(i)
		}
		buf := make([]byte, size)
		m.Write(slots, buf)
		for _, split := range []bool{false, true} {
			name := fmt.Sprintf("bytes=%d/split=%s", size, map[bool]string{false: "off", true: "on"}[split])
			b.Run(name, func(b *testing.B) {
				n := 1
				if split {
					n = 2
				}
				w := NewWorkers(n, 1)
				defer w.Stop()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if rb < minSplitRow {
						m.ReadSplit(w, buf, slots) // writes of small rows never split
					} else {
						m.WriteSplit(w, slots, buf)
					}
				}
			})
		}
		m.Free()
	}
}
