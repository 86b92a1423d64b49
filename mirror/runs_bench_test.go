package mirror

import (
	"fmt"
	"testing"
)

// BenchmarkRuns is Write of a step's rows at two slot patterns, in a
// mirror whose chunks all exist: pattern=decode64 is 64 rows to 64 scattered
// slots (a decode step, a row per request), pattern=run8192 8192 rows to
// consecutive slots (a prefill, one run: one copy, see runEnd). Each op
// moves the slots by one (or a run's length), so that it writes other rows
// than the op before.
func BenchmarkRuns(b *testing.B) {
	const numSlots = 64 * 64 * 16
	for _, rb := range []int{64, 128, 512, 4096} {
		for _, pat := range []string{"decode64", "run8192"} {
			b.Run(fmt.Sprintf("row=%d/pattern=%s", rb, pat), func(b *testing.B) {
				m, err := New(numSlots, rb)
				if err != nil {
					b.Fatal(err)
				}
				defer m.Free()
				all := make([]int32, numSlots)
				for i := range all {
					all[i] = int32(i)
				}
				m.Write(all, make([]byte, numSlots*rb))
				var slots []int32
				step := int32(1)
				if pat == "decode64" {
					for r := 0; r < 64; r++ {
						slots = append(slots, int32(r*1024+300))
					}
				} else {
					for i := 0; i < 8192; i++ {
						slots = append(slots, int32(4096+i))
					}
					step = 8192
				}
				buf := make([]byte, len(slots)*rb)
				b.SetBytes(int64(len(buf)))
				for i := 0; b.Loop(); i++ {
					d := step
					if i%2 == 1 {
						d = -d
					}
					for j := range slots {
						slots[j] += d
					}
					m.Write(slots, buf)
				}
			})
		}
	}
}
