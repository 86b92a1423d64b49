package omnicache

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestOutsideAllOne checks Begin's branch-free plan checks against plain
// ones, on every length up to 9 (the four-wide body and its tail) and on
// the int32 extremes.
func TestOutsideAllOne(t *testing.T) {
	edge := []int32{math.MinInt32, math.MinInt32 + 1, -2, -1, 0, 1, 2, 3, 1 << 20, math.MaxInt32 - 1, math.MaxInt32}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, last := range []int32{0, 1, 1<<20 - 1, math.MaxInt32} {
		for n := 0; n <= 9; n++ {
			for trial := 0; trial < 200; trial++ {
				xs := make([]int32, n)
				for i := range xs {
					switch rng.IntN(3) {
					case 0:
						xs[i] = edge[rng.IntN(len(edge))]
					case 1:
						xs[i] = int32(rng.Int64N(int64(last) + 1)) // inside [0, last]
					default:
						xs[i] = 1
					}
				}
				wantOut, wantOne := false, true
				for _, x := range xs {
					wantOut = wantOut || x < 0 || x > last
					wantOne = wantOne && x == 1
				}
				if got := outside(xs, last); got != wantOut {
					t.Fatalf("outside(%v, %d) = %v, want %v", xs, last, got, wantOut)
				}
				if got := allOne(xs); got != wantOne {
					t.Fatalf("allOne(%v) = %v, want %v", xs, got, wantOne)
				}
			}
		}
	}
}
