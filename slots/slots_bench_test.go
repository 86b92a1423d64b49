package slots_test

import (
	"fmt"
	"testing"

	"github.com/omnicache/omnicache/internal/slotstest"
	"github.com/omnicache/omnicache/slots"
)

// Benchmark shapes, block size 16, over an engine-like block table: 256 rows
// (max_num_seqs) of 1024 blocks (16384 tokens per request).
const (
	benchBlockSize = 16
	benchRows      = 256
	benchStride    = 1024
)

type benchShape struct {
	name  string
	batch func(g *gen) slots.Batch
}

// decode returns n decode requests (one token each) on distinct random rows
// at random starts below 4096 tokens.
func decode(g *gen, n int) slots.Batch {
	b := slots.Batch{Rows: make([]int32, n), Start: make([]int32, n), Count: make([]int32, n),
		Table: g.table(benchRows, benchStride, false), Stride: benchStride}
	for i, row := range g.rng.Perm(benchRows)[:n] {
		b.Rows[i] = int32(row)
		b.Start[i] = g.rng.Int32N(4096)
		b.Count[i] = 1
	}
	return b
}

var benchShapes = []benchShape{
	{"decode16", func(g *gen) slots.Batch { return decode(g, 16) }},
	{"decode64", func(g *gen) slots.Batch { return decode(g, 64) }},
	{"decode256", func(g *gen) slots.Batch { return decode(g, 256) }},
	// 56 running decodes, then 8 chunked-prefill chunks of 512 tokens at
	// chunk boundaries of their prompts.
	{"mixed", func(g *gen) slots.Batch {
		b := decode(g, 64)
		for i := 56; i < 64; i++ {
			b.Start[i] = 512 * g.rng.Int32N(8)
			b.Count[i] = 512
		}
		return b
	}},
	{"prefill16384", func(g *gen) slots.Batch {
		return slots.Batch{Rows: []int32{3}, Start: []int32{0}, Count: []int32{16384},
			Table: g.table(benchRows, benchStride, false), Stride: benchStride}
	}},
}

func BenchmarkMap(b *testing.B) {
	slotstest.Bench(b, func(b *testing.B) {
		for _, shape := range benchShapes {
			b.Run("shape="+shape.name, func(b *testing.B) {
				batch := shape.batch(newGen(42))
				tokens, err := slots.Total(batch, benchBlockSize)
				if err != nil {
					b.Fatal(err)
				}
				dst := make([]int32, tokens)
				b.ReportAllocs()
				b.SetBytes(int64(4 * tokens))
				for b.Loop() {
					if _, err := slots.Map(dst, batch, benchBlockSize); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	})
}

func BenchmarkExpand(b *testing.B) {
	slotstest.Bench(b, func(b *testing.B) {
		for _, tokens := range []int{16, 1000, 16384} {
			b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
				blocks := newGen(7).table(1, (tokens+benchBlockSize-1)/benchBlockSize, false)
				dst := make([]int32, tokens)
				b.ReportAllocs()
				b.SetBytes(int64(4 * tokens))
				for b.Loop() {
					if _, err := slots.Expand(dst, blocks, benchBlockSize, tokens); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	})
}

// BenchmarkBlockSize runs Map on a decode step and a prefill at other block
// sizes: below the vector width (gathered per position), not a power of two
// (divided by reciprocal), and large.
func BenchmarkBlockSize(b *testing.B) {
	slotstest.Bench(b, func(b *testing.B) {
		for _, bs := range []int{1, 8, 48, 256} {
			const rows, tokens = 64, 16384
			stride := (tokens + bs - 1) / bs
			for _, shape := range []string{"decode64", "prefill16384"} {
				b.Run(fmt.Sprintf("bs=%d/shape=%s", bs, shape), func(b *testing.B) {
					g := newGen(43)
					batch := slots.Batch{Rows: []int32{3}, Start: []int32{0}, Count: []int32{tokens},
						Table: g.table(rows, stride, false), Stride: stride}
					if shape == "decode64" {
						batch = g.batch(64, rows, stride, bs, false, func(int) int { return 1 })
					}
					n, err := slots.Total(batch, bs)
					if err != nil {
						b.Fatal(err)
					}
					dst := make([]int32, n)
					b.ReportAllocs()
					for b.Loop() {
						if _, err := slots.Map(dst, batch, bs); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				})
			}
		}
	})
}
