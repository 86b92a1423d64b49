package omnicache_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/omnicache/omnicache"
)

// BenchmarkMaterialize measures the gather of hit rows: every op is one step
// in which 64 requests arrive, each hitting 512 tokens (32 blocks of 16) of
// 12 KiB rows written earlier, and computing one token; Materialize returns
// all 64 (384 MiB of prefix rows, into a warm Result). The previous op's
// requests finish in the next op's Begin. workers is Config.CopyWorkers (1:
// the gather runs on the Materialize caller alone; workers=8 only on
// machines of 8 CPUs or more).
func BenchmarkMaterialize(b *testing.B) {
	const reqs, hit, rb, bs = 64, 512, 12288, 16
	const hitBlk = hit / bs
	const stride = hitBlk + 1 // the hit blocks, then the block of position 512
	ws := []int{1, 2}
	if runtime.NumCPU() >= 8 {
		ws = append(ws, 8)
	}
	for _, workers := range ws {
		b.Run(fmt.Sprintf("hit=%dx%d/row=%d/workers=%d", reqs, hit, rb, workers), func(b *testing.B) {
			c, err := omnicache.New(omnicache.Config{
				NumBlocks: reqs * stride, BlockSize: bs,
				Keys:                  []omnicache.Key{{Name: "hidden", RowBytes: rb}},
				StagingCapacityTokens: 8 * hit, StagingDepth: 2,
				DisableDecodeBuffer: true,
				CopyWorkers:         workers,
			})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			table := make([]int32, reqs*stride)
			for i := range table {
				table[i] = int32(i)
			}
			var id int64
			// Write the 64 prefixes, 8 requests a step.
			src := make([]byte, 8*hit*rb)
			for i := range src {
				src[i] = byte(i * 7)
			}
			for r0 := 0; r0 < reqs; r0 += 8 {
				p := omnicache.Plan{Table: table, Stride: stride}
				for r := r0; r < r0+8; r++ {
					id++
					p.IDs = append(p.IDs, id)
					p.Rows = append(p.Rows, int32(r))
					p.Start = append(p.Start, 0)
					p.Count = append(p.Count, hit)
					p.Arrivals = append(p.Arrivals, id)
					p.HitTokens = append(p.HitTokens, 0)
					p.Finished = append(p.Finished, id-8)
				}
				if r0 == 0 {
					p.Finished = p.Finished[:0]
				}
				must(b, c.Begin(&p))
				sid, err := c.Save(&omnicache.Outputs{Tokens: 8 * hit, Tensors: []omnicache.Tensor{{Host: src, Rows: 8 * hit}}})
				must(b, err)
				must(b, c.Discard(sid))
			}
			must(b, c.Sync())
			// Every op: 64 arrivals hitting their row's 512 tokens.
			p := omnicache.Plan{Table: table, Stride: stride}
			for r := 0; r < reqs; r++ {
				p.IDs = append(p.IDs, 0)
				p.Rows = append(p.Rows, int32(r))
				p.Start = append(p.Start, hit)
				p.Count = append(p.Count, 1)
				p.Arrivals = append(p.Arrivals, 0)
				p.HitTokens = append(p.HitTokens, hit)
				p.Finished = append(p.Finished, id-int64(reqs-1-r)) // the writers (then the last op's)
				for blk := 0; blk < hitBlk; blk++ {
					p.HitBlocks = append(p.HitBlocks, int32(r*stride+blk))
				}
			}
			one := make([]byte, reqs*rb)
			outs := omnicache.Outputs{Tokens: reqs, Tensors: []omnicache.Tensor{{Host: one, Rows: reqs}}}
			var res omnicache.Result
			step := func() {
				for r := range p.IDs {
					id++
					p.IDs[r], p.Arrivals[r] = id, id
				}
				must(b, c.Begin(&p))
				sid, err := c.Save(&outs)
				must(b, err)
				must(b, c.Materialize(sid, nil, &res))
				for r := range p.Finished {
					p.Finished[r] = p.IDs[r]
				}
			}
			step() // warm the Result
			if res.Prefix(0) != hit || res.Rows(reqs-1, 0)[0] != src[0] {
				b.Fatalf("prefix %d rows, first byte %d: want %d, %d", res.Prefix(0), res.Rows(reqs-1, 0)[0], hit, src[0])
			}
			b.SetBytes(reqs * hit * rb)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
		})
	}
}

// The machine's ceiling for the same bytes, in the same run: one 384 MiB
// memcpy between flat buffers, in pieces of 64 rows split evenly over 1, 2
// (and 8) goroutines. On a VM whose memory bandwidth one core saturates,
// workers=2 cannot beat workers=1 by more than this does.
func BenchmarkMaterializeCeiling(b *testing.B) {
	const n, piece = 64 * 512 * 12288, 64 * 12288
	ws := []int{1, 2}
	if runtime.NumCPU() >= 8 {
		ws = append(ws, 8)
	}
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	for _, g := range ws {
		b.Run(fmt.Sprintf("op=memcpy/bytes=384MiB/goroutines=%d", g), func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				var wg sync.WaitGroup
				per := n / g
				for i := range g {
					wg.Go(func() {
						for off := i * per; off < (i+1)*per; off += piece {
							e := min(off+piece, (i+1)*per)
							copy(dst[off:e], src[off:e])
						}
					})
				}
				wg.Wait()
			}
		})
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
