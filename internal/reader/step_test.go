package reader

import (
	"slices"
	"testing"
)

// hitSlots expands a request's planned block ids into the slots of its
// first pre hit rows, for any block size and a prefix that ends inside a
// block, and works each request out afresh.
func TestHitSlots(t *testing.T) {
	for _, bs := range []int{1, 3, 16} {
		s := &Step{}
		blocks := [][]int32{{7, 2, 9}, {4}, {0, 5}}
		for _, bl := range blocks {
			s.immOff = append(s.immOff, int32(len(s.immBlk)))
			s.immBlk = append(s.immBlk, bl...)
		}
		s.immOff = append(s.immOff, -1) // a request without a hit
		for _, i := range []int{0, 2, 1, 0, 0} {
			for _, pre := range []int{len(blocks[i]) * bs, len(blocks[i])*bs - 1, 1} {
				if pre == 0 {
					continue
				}
				var want []int32
				for _, b := range blocks[i] {
					for t := 0; t < bs; t++ {
						want = append(want, b*int32(bs)+int32(t))
					}
				}
				want = want[:pre]
				if got := s.hitSlots(i, pre, bs); !slices.Equal(got, want) {
					t.Fatalf("bs %d request %d pre %d: %v, want %v", bs, i, pre, got, want)
				}
			}
		}
	}
}
