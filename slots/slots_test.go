package slots_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/internal/slotstest"
	"github.com/omnicache/omnicache/slots"
)

// canary fills the memory after a destination; no implementation may touch it.
const canary = int32(-0x5a5a5a5b)

// tooBig is a block size past math.MaxInt32 (a variable, so that the tests
// compile where int has 32 bits; there it wraps to a negative size).
var tooBig int64 = math.MaxInt32 + 1

// canaries is how many canary values follow a destination.
const canaries = 33

// oracle computes Map's result from the definition, independently of the
// package: the slots, or the sentinel error Map must return.
func oracle(b slots.Batch, bs, dstLen int) ([]int32, error) {
	n := len(b.Rows)
	switch {
	case len(b.Start) != n || len(b.Count) != n:
		return nil, slots.ErrLength
	case bs <= 0 || bs > math.MaxInt32:
		return nil, slots.ErrBlockSize
	case n == 0:
		return []int32{}, nil
	case b.Stride <= 0:
		return nil, slots.ErrStride
	}
	tokens := int64(0)
	for i, row := range b.Rows {
		start, count := int64(b.Start[i]), int64(b.Count[i])
		switch {
		case row < 0 || (int64(row)+1)*int64(b.Stride) > int64(len(b.Table)):
			return nil, slots.ErrRow
		case start < 0 || count < 0:
			return nil, slots.ErrNegative
		case count > 0 && ((start+count-1)/int64(bs) >= int64(b.Stride) || start+count > math.MaxInt32):
			return nil, slots.ErrColumn
		}
		tokens += count
	}
	if tokens > int64(dstLen) {
		return nil, slots.ErrShortDst
	}
	out := []int32{}
	for i, row := range b.Rows {
		start, count := int64(b.Start[i]), int64(b.Count[i])
		for pos := start; pos < start+count; pos++ {
			block := b.Table[int64(row)*int64(b.Stride)+pos/int64(bs)]
			out = append(out, int32(int64(block)*int64(bs)+pos%int64(bs)))
		}
	}
	return out, nil
}

// withCanaries returns a destination of length n followed (within its
// capacity) by canary values, and the whole buffer.
func withCanaries(n int) (dst, buf []int32) {
	buf = make([]int32, n+canaries)
	for i := range buf {
		buf[i] = canary
	}
	return buf[:n], buf
}

func cloneBatch(b slots.Batch) slots.Batch {
	return slots.Batch{Rows: slices.Clone(b.Rows), Start: slices.Clone(b.Start), Count: slices.Clone(b.Count),
		Table: slices.Clone(b.Table), Stride: b.Stride}
}

// checkMap runs Map with the selected implementation and compares it with
// the oracle: result, error, untouched canaries, untouched input.
func checkMap(t *testing.T, b slots.Batch, bs, dstLen int) {
	t.Helper()
	want, wantErr := oracle(b, bs, dstLen)
	before := cloneBatch(b)
	dst, buf := withCanaries(dstLen)
	n, err := slots.Map(dst, b, bs)
	require.True(t, slices.Equal(before.Rows, b.Rows) && slices.Equal(before.Start, b.Start) &&
		slices.Equal(before.Count, b.Count) && slices.Equal(before.Table, b.Table), "Map modified its input")
	if wantErr != nil {
		require.ErrorIs(t, err, wantErr)
		require.Zero(t, n)
		for i, v := range buf {
			require.Equal(t, canary, v, "Map wrote dst[%d] and failed", i)
		}
		return
	}
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.Equal(t, want, dst[:n])
	for i := n; i < len(buf); i++ {
		require.Equal(t, canary, buf[i], "Map wrote past its %d slots at %d (len(dst) %d)", n, i, dstLen)
	}
	total, err := slots.Total(b, bs)
	require.NoError(t, err)
	require.Equal(t, n, total)
}

// gen builds batches from a seeded generator.
type gen struct{ rng *rand.Rand }

func newGen(seed uint64) *gen { return &gen{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} }

// table returns a block table of rows×stride random block ids; wide ids
// (any int32) exercise the int32 wrap-around of the slot arithmetic.
func (g *gen) table(rows, stride int, wide bool) []int32 {
	t := make([]int32, rows*stride)
	for i := range t {
		if wide {
			t[i] = int32(g.rng.Uint32())
		} else {
			t[i] = g.rng.Int32N(1 << 20)
		}
	}
	return t
}

// batch returns n requests over a rows×stride table, each with a count
// drawn by count(i), a random row and a random start that fits.
func (g *gen) batch(n, rows, stride, bs int, wide bool, count func(i int) int) slots.Batch {
	b := slots.Batch{Rows: make([]int32, n), Start: make([]int32, n), Count: make([]int32, n),
		Table: g.table(rows, stride, wide), Stride: stride}
	positions := min(int64(stride)*int64(bs), math.MaxInt32)
	for i := range n {
		c := int64(count(i))
		b.Rows[i] = g.rng.Int32N(int32(rows))
		b.Count[i] = int32(c)
		b.Start[i] = int32(g.rng.Int64N(positions - c + 1))
	}
	return b
}

func total(b slots.Batch) int {
	n := 0
	for _, c := range b.Count {
		n += int(c)
	}
	return n
}

// Lane widths of the kernels (AVX2 8, AVX-512 16) and lengths around them.
var laneEdges = []int{0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65}

var blockSizes = []int{1, 2, 3, 5, 7, 8, 16, 32, 48, 100, 128, 256, 544, 1 << 12}

func TestMapShapes(t *testing.T) {
	slotstest.Run(t, func(t *testing.T) {
		g := newGen(1)
		for _, bs := range blockSizes {
			t.Run(fmt.Sprintf("bs=%d", bs), func(t *testing.T) {
				for _, wide := range []bool{false, true} {
					// Decodes: one token per request, n around the lane widths.
					for _, n := range laneEdges {
						b := g.batch(n, 64, 37, bs, wide, func(int) int { return 1 })
						checkMap(t, b, bs, total(b))
						checkMap(t, b, bs, total(b)+5)
					}
					// Counts 0 and 1 mixed, and decodes with one longer request
					// at every lane position.
					for _, n := range []int{1, 8, 16, 17, 40} {
						b := g.batch(n, 16, 64, bs, wide, func(i int) int { return i % 2 })
						checkMap(t, b, bs, total(b))
						for at := range n {
							b := g.batch(n, 16, 64, bs, wide, func(i int) int {
								if i == at {
									return 2 + at%20
								}
								return 1
							})
							checkMap(t, b, bs, total(b))
						}
					}
					// Runs: tail lengths around the lanes and the unrolled loops,
					// from every kind of start offset.
					for _, c := range []int{0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025} {
						stride := (c+bs)/bs + 2
						for _, start := range []int{0, 1, bs - 1, bs, bs + 1, 2*bs - 1} {
							if start < 0 || int64(start+c) > int64(stride)*int64(bs) {
								continue
							}
							b := slots.Batch{Rows: []int32{1}, Start: []int32{int32(start)}, Count: []int32{int32(c)},
								Table: g.table(3, stride, wide), Stride: stride}
							checkMap(t, b, bs, c)
						}
					}
					// Mixed: prefill chunks among decodes, in random order.
					b := g.batch(64, 64, (2048+bs-1)/bs+1, bs, wide, func(i int) int {
						if i%9 == 4 {
							return 1 + g.rng.IntN(1100)
						}
						return g.rng.IntN(2)
					})
					checkMap(t, b, bs, total(b))
				}
			})
		}
	})
}

func TestMapEdges(t *testing.T) {
	slotstest.Run(t, func(t *testing.T) {
		g := newGen(2)
		// No requests: nothing written, whatever the table.
		checkMap(t, slots.Batch{}, 16, 0)
		checkMap(t, slots.Batch{Rows: []int32{}, Start: []int32{}, Count: []int32{}}, 16, 4)
		// Rows in any order, repeated, the last row of the table.
		tab := g.table(8, 4, false)
		checkMap(t, slots.Batch{Rows: []int32{7, 0, 7, 3, 3, 1}, Start: []int32{63, 0, 17, 16, 15, 5},
			Count: []int32{1, 64, 2, 16, 1, 0}, Table: tab, Stride: 4}, 16, 100)
		// A table whose length is not a multiple of Stride: the partial row
		// does not exist.
		checkMap(t, slots.Batch{Rows: []int32{1}, Start: []int32{0}, Count: []int32{2}, Table: tab[:10], Stride: 4}, 16, 2)
		// The last position of a row, and one past it with count 0.
		checkMap(t, slots.Batch{Rows: []int32{2, 2}, Start: []int32{63, 64}, Count: []int32{1, 0}, Table: tab, Stride: 4}, 16, 1)
		// Wide strides.
		for _, stride := range []int{1, 4096, 65537} {
			b := g.batch(33, 3, stride, 16, true, func(i int) int { return i % 3 })
			checkMap(t, b, 16, total(b))
		}
		// Positions at the int32 limit, power-of-two and other block sizes.
		for _, bs := range []int{1 << 20, 1<<20 + 1, 1_000_003, math.MaxInt32} {
			stride := math.MaxInt32/bs + 1
			tab := g.table(1, stride, true)
			for _, start := range []int32{math.MaxInt32 - 1, math.MaxInt32 - 17, math.MaxInt32 - 1000, int32(bs - 1), int32(bs)} {
				if start < 0 {
					continue
				}
				c := int32(math.MaxInt32 - start)
				c = min(c, 1000)
				for _, n := range []int{1, 17} {
					b := slots.Batch{Rows: make([]int32, n), Start: make([]int32, n), Count: make([]int32, n), Table: tab, Stride: stride}
					for i := range n {
						b.Start[i] = start
						b.Count[i] = 1
					}
					b.Count[n-1] = c
					checkMap(t, b, bs, total(b))
					b.Count[n-1] = c + 1 // one position past the int32 limit
					checkMap(t, b, bs, total(b))
				}
			}
		}
		// Garbage after the request slices and the table, within capacity:
		// no implementation may read it as requests or blocks.
		for _, n := range laneEdges {
			b := g.batch(n, 5, 3, 16, false, func(i int) int { return i % 3 })
			pad := func(s []int32, v int32) []int32 {
				p := append(slices.Clone(s), v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v)
				return p[:len(s)]
			}
			b.Rows, b.Start, b.Count, b.Table = pad(b.Rows, -1), pad(b.Start, -1), pad(b.Count, 1<<30), pad(b.Table, 1<<30)
			checkMap(t, b, 16, total(b))
		}
	})
}

// TestMapErrors asserts every sentinel of Map, at several places in the
// batch (first request, in a full vector, in the tail).
func TestMapErrors(t *testing.T) {
	slotstest.Run(t, func(t *testing.T) {
		g := newGen(3)
		ok := func(n int) slots.Batch {
			return g.batch(n, 8, 4, 16, false, func(int) int { return 1 })
		}
		is := func(b slots.Batch, bs, dstLen int, want error) {
			t.Helper()
			got, err := oracle(b, bs, dstLen)
			require.ErrorIs(t, err, want, "the oracle disagrees with the test (got %v)", got)
			checkMap(t, b, bs, dstLen)
			if !errors.Is(want, slots.ErrShortDst) {
				_, err = slots.Total(b, bs)
				assert.ErrorIs(t, err, want)
			}
		}
		b := ok(3)
		b.Start = b.Start[:2]
		is(b, 16, 3, slots.ErrLength)
		b = ok(3)
		b.Count = append(b.Count, 1)
		is(b, 16, 4, slots.ErrLength)
		for _, bs := range []int{0, -1, math.MinInt, int(tooBig)} {
			is(ok(3), bs, 3, slots.ErrBlockSize)
			is(slots.Batch{}, bs, 3, slots.ErrBlockSize)
		}
		for _, stride := range []int{0, -4} {
			b := ok(3)
			b.Stride = stride
			is(b, 16, 3, slots.ErrStride)
			checkMap(t, slots.Batch{Table: b.Table, Stride: stride}, 16, 0) // no requests: fine
		}
		for _, n := range []int{1, 5, 16, 17, 40} {
			for _, at := range []int{0, n / 2, n - 1} {
				bad := func(set func(b *slots.Batch), want error) {
					t.Helper()
					b := ok(n)
					set(&b)
					is(b, 16, n+8, want)
				}
				bad(func(b *slots.Batch) { b.Rows[at] = -1 }, slots.ErrRow)
				bad(func(b *slots.Batch) { b.Rows[at] = math.MinInt32 }, slots.ErrRow)
				bad(func(b *slots.Batch) { b.Rows[at] = 8 }, slots.ErrRow)
				bad(func(b *slots.Batch) { b.Rows[at] = 7; b.Table = b.Table[:31] }, slots.ErrRow)
				bad(func(b *slots.Batch) { b.Start[at] = -1 }, slots.ErrNegative)
				bad(func(b *slots.Batch) { b.Start[at] = math.MinInt32; b.Count[at] = math.MaxInt32 }, slots.ErrNegative)
				bad(func(b *slots.Batch) { b.Count[at] = -1 }, slots.ErrNegative)
				bad(func(b *slots.Batch) { b.Start[at] = 0; b.Count[at] = -1 }, slots.ErrNegative)
				bad(func(b *slots.Batch) { b.Start[at] = 64; b.Count[at] = 1 }, slots.ErrColumn)
				bad(func(b *slots.Batch) { b.Start[at] = 60; b.Count[at] = 5 }, slots.ErrColumn)
				bad(func(b *slots.Batch) { b.Start[at] = math.MaxInt32; b.Count[at] = math.MaxInt32 }, slots.ErrColumn)
				// A bad row with count 0 is still a bad row; a start past
				// the row with count 0 maps nothing and is fine.
				bad(func(b *slots.Batch) { b.Rows[at] = 9; b.Count[at] = 0 }, slots.ErrRow)
				b := ok(n)
				b.Start[at], b.Count[at] = 1000, 0
				checkMap(t, b, 16, n)
				// dst too short: by one, and empty.
				b = ok(n)
				is(b, 16, n-1, slots.ErrShortDst)
				is(b, 16, 0, slots.ErrShortDst)
			}
		}
		// The token total does not wrap: 64 requests of 2^31-1 tokens.
		big := slots.Batch{Rows: make([]int32, 64), Start: make([]int32, 64), Count: make([]int32, 64),
			Table: g.table(1, 1<<15, false), Stride: 1 << 15}
		for i := range big.Count {
			big.Count[i] = math.MaxInt32
		}
		is(big, 1<<16, 1000, slots.ErrShortDst)
		n, err := slots.Total(big, 1<<16)
		if math.MaxInt == math.MaxInt32 { // the total does not fit in an int
			require.ErrorIs(t, err, slots.ErrShortDst)
		} else {
			require.NoError(t, err)
			require.Equal(t, int64(64*math.MaxInt32), int64(n))
		}
	})
}

func checkExpand(t *testing.T, blocks []int32, bs, tokens, dstLen int) {
	t.Helper()
	want := []int32{}
	var wantErr error
	switch {
	case bs <= 0 || bs > math.MaxInt32:
		wantErr = slots.ErrBlockSize
	case tokens < 0 || int64(tokens) > int64(len(blocks))*int64(bs):
		wantErr = slots.ErrTokens
	case tokens > dstLen:
		wantErr = slots.ErrShortDst
	default:
		for pos := range tokens {
			want = append(want, int32(int64(blocks[pos/bs])*int64(bs)+int64(pos%bs)))
		}
	}
	dst, buf := withCanaries(dstLen)
	n, err := slots.Expand(dst, blocks, bs, tokens)
	if wantErr != nil {
		require.ErrorIs(t, err, wantErr)
		require.Zero(t, n)
		for i, v := range buf {
			require.Equal(t, canary, v, "Expand wrote dst[%d] and failed", i)
		}
		return
	}
	require.NoError(t, err)
	require.Equal(t, tokens, n)
	require.Equal(t, want, dst[:n:n])
	for i := n; i < len(buf); i++ {
		require.Equal(t, canary, buf[i], "Expand wrote past its %d slots at %d", n, i)
	}
}

func TestExpand(t *testing.T) {
	slotstest.Run(t, func(t *testing.T) {
		g := newGen(4)
		for _, bs := range blockSizes {
			blocks := g.table(1, 1100/bs+2, true)
			for _, tokens := range []int{0, 1, 2, 7, 8, 9, 15, 16, 17, bs - 1, bs, bs + 1, 2*bs + 3, 1023, 1024, 1025} {
				if tokens < 0 || tokens > len(blocks)*bs {
					continue
				}
				checkExpand(t, blocks, bs, tokens, tokens)
				checkExpand(t, blocks, bs, tokens, tokens+3)
			}
			checkExpand(t, blocks, bs, len(blocks)*bs, len(blocks)*bs)
		}
		blocks := g.table(1, 4, false)
		checkExpand(t, blocks, 16, 65, 100)         // ErrTokens
		checkExpand(t, blocks, 16, -1, 100)         // ErrTokens
		checkExpand(t, nil, 16, 1, 100)             // ErrTokens
		checkExpand(t, nil, 16, 0, 0)               // nothing
		checkExpand(t, blocks, 16, 64, 63)          // ErrShortDst
		checkExpand(t, blocks, 0, 1, 1)             // ErrBlockSize
		checkExpand(t, blocks, -16, 1, 1)           // ErrBlockSize
		checkExpand(t, blocks, int(tooBig), 1, 1)   // ErrBlockSize
		checkExpand(t, blocks, math.MaxInt32, 5, 5) // huge blocks
		// Garbage after the blocks within capacity is not read.
		padded := append(slices.Clone(blocks), -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)[:4]
		checkExpand(t, padded, 3, 12, 12)
		_, err := slots.Expand(make([]int32, 100), blocks, 16, 65)
		assert.ErrorIs(t, err, slots.ErrTokens)
	})
}

// TestImplementations checks the registry: the reference and the portable
// version are always there, Select refuses unknown names, restore restores.
func TestImplementations(t *testing.T) {
	names := slots.Implementations()
	require.Contains(t, names, "generic")
	require.Contains(t, names, "go")
	_, ok := slots.Select("nonesuch")
	require.False(t, ok)
	// Every selection must be observable through the results' agreement;
	// here we only check that selecting and restoring nest.
	for _, name := range names {
		restore, ok := slots.Select(name)
		require.True(t, ok)
		inner, ok := slots.Select("generic")
		require.True(t, ok)
		inner()
		restore()
	}
	t.Logf("implementations: %v", names)
}

// TestMapDivision maps positions next to multiples of block sizes that are
// not powers of two, up to the int32 limit where the table allows, where a
// rounded reciprocal would be off by one: decodes (vector path), prefill
// chunks (scalar split) and Expand.
func TestMapDivision(t *testing.T) {
	type span struct{ bs, stride int }
	var spans []span
	for _, bs := range []int{3, 5, 7, 9, 15, 17, 48, 100, 544, 1000, 65537, 1_000_003, 1<<30 + 3} {
		spans = append(spans, span{bs, min(math.MaxInt32/bs+1, 1<<20)})
	}
	tables := map[int][]int32{}
	for _, sp := range spans {
		if tables[sp.stride] == nil {
			tab := make([]int32, sp.stride)
			for i := range tab {
				tab[i] = int32(i*7 + 1)
			}
			tables[sp.stride] = tab
		}
	}
	slotstest.Run(t, func(t *testing.T) {
		for _, sp := range spans {
			positions := min(int64(sp.stride)*int64(sp.bs), math.MaxInt32)
			var starts []int32
			for k := int64(1); k*int64(sp.bs) < positions; k = k*5/3 + 1 {
				for _, p := range []int64{k*int64(sp.bs) - 1, k * int64(sp.bs), k*int64(sp.bs) + 1} {
					if p < positions-40 {
						starts = append(starts, int32(p))
					}
				}
			}
			n := len(starts)
			b := slots.Batch{Rows: make([]int32, n), Start: starts, Count: make([]int32, n),
				Table: tables[sp.stride], Stride: sp.stride}
			for i := range b.Count {
				b.Count[i] = 1
			}
			checkMap(t, b, sp.bs, n)
			for i := range b.Count {
				b.Count[i] = int32(1 + i%40)
			}
			checkMap(t, b, sp.bs, total(b))
			checkExpand(t, tables[sp.stride][:min(sp.stride, 4096)], sp.bs, min(4096, int(positions)), 4096)
		}
	})
}
