package omnicache_test

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

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
	ws := []int{1, 2}
	if runtime.NumCPU() >= 8 {
		ws = append(ws, 8)
	}
	for _, workers := range ws {
		b.Run(fmt.Sprintf("hit=%dx%d/row=%d/workers=%d", hbReqs, hbHit, hbRow, workers), func(b *testing.B) {
			hb := newHitBench(b, omnicache.Config{CopyWorkers: workers, DisablePrefetch: true}, true)
			b.SetBytes(hbReqs * hbHit * hbRow)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				hb.step(b, true, nil)
			}
		})
	}
}

// The shape of BenchmarkMaterialize and BenchmarkHitStep: 64 requests, each
// hitting 512 tokens (32 blocks of 16) of 12 KiB rows written earlier and
// computing one token.
const (
	hbReqs   = 64
	hbHit    = 512
	hbRow    = 12288
	hbBS     = 16
	hbHitBlk = hbHit / hbBS
	hbStride = hbHitBlk + 1 // the hit blocks, then the block of position 512
)

// hitBench is a cache whose 64 block-table rows hold written 512-token
// prefixes, and the plan of a step of 64 arrivals hitting them.
type hitBench struct {
	c     *omnicache.Cache
	p     omnicache.Plan // the hit step
	miss  omnicache.Plan // the same step without hits
	outs  omnicache.Outputs
	res   omnicache.Result
	id    int64
	first byte
}

// newHitBench fills a cache made from cfg (shape fields set here) with the
// prefixes and, when warm, runs warm-up hit steps, checking their rows.
func newHitBench(b *testing.B, cfg omnicache.Config, warm bool) *hitBench {
	cfg.NumBlocks, cfg.BlockSize = hbReqs*hbStride, hbBS
	cfg.Keys = []omnicache.Key{{Name: "hidden", RowBytes: hbRow}}
	cfg.StagingCapacityTokens, cfg.StagingDepth = 8*hbHit, 2
	cfg.DisableDecodeBuffer = true
	c, err := omnicache.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	hb := &hitBench{c: c}
	table := make([]int32, hbReqs*hbStride)
	for i := range table {
		table[i] = int32(i)
	}
	// Write the 64 prefixes, 8 requests a step.
	src := make([]byte, 8*hbHit*hbRow)
	for i := range src {
		src[i] = byte(i * 7)
	}
	hb.first = src[0]
	for r0 := 0; r0 < hbReqs; r0 += 8 {
		p := omnicache.Plan{Table: table, Stride: hbStride}
		for r := r0; r < r0+8; r++ {
			hb.id++
			p.IDs = append(p.IDs, hb.id)
			p.Rows = append(p.Rows, int32(r))
			p.Start = append(p.Start, 0)
			p.Count = append(p.Count, hbHit)
			p.Arrivals = append(p.Arrivals, hb.id)
			p.HitTokens = append(p.HitTokens, 0)
			p.Finished = append(p.Finished, hb.id-8)
		}
		if r0 == 0 {
			p.Finished = p.Finished[:0]
		}
		must(b, c.Begin(&p))
		sid, err := c.Save(&omnicache.Outputs{Tokens: 8 * hbHit, Tensors: []omnicache.Tensor{{Host: src, Rows: 8 * hbHit}}})
		must(b, err)
		must(b, c.Discard(sid))
	}
	must(b, c.Sync())
	// Every op: 64 arrivals hitting their row's 512 tokens (or, for a miss
	// step, nothing: the same 64 tokens at the same positions).
	hb.p = omnicache.Plan{Table: table, Stride: hbStride}
	hb.miss = omnicache.Plan{Table: table, Stride: hbStride}
	for r := 0; r < hbReqs; r++ {
		for _, p := range []*omnicache.Plan{&hb.p, &hb.miss} {
			p.IDs = append(p.IDs, 0)
			p.Rows = append(p.Rows, int32(r))
			p.Count = append(p.Count, 1)
			p.Arrivals = append(p.Arrivals, 0)
			p.Finished = append(p.Finished, hb.id-int64(hbReqs-1-r)) // the writers (then the last op's)
		}
		hb.p.Start = append(hb.p.Start, hbHit)
		hb.p.HitTokens = append(hb.p.HitTokens, hbHit)
		for blk := 0; blk < hbHitBlk; blk++ {
			hb.p.HitBlocks = append(hb.p.HitBlocks, int32(r*hbStride+blk))
		}
		hb.miss.Start = append(hb.miss.Start, 0)
		hb.miss.HitTokens = append(hb.miss.HitTokens, 0)
	}
	one := make([]byte, hbReqs*hbRow)
	hb.outs = omnicache.Outputs{Tokens: hbReqs, Tensors: []omnicache.Tensor{{Host: one, Rows: hbReqs}}}
	if !warm {
		return hb
	}
	hb.step(b, true, nil) // warm the Result
	hb.check(b)
	hb.step(b, true, nil) // and the prefetch buffers (the adopted Result's old ones)
	return hb
}

// check checks the last hit step's result: every request's prefix rows.
func (hb *hitBench) check(b *testing.B) {
	if hb.res.Prefix(0) != hbHit || hb.res.Rows(hbReqs-1, 0)[0] != hb.first {
		b.Fatalf("prefix %d rows, first byte %d: want %d, %d", hb.res.Prefix(0), hb.res.Rows(hbReqs-1, 0)[0], hbHit, hb.first)
	}
}

// step runs one step: Begin (the hit step, or the miss step), forward
// (called between Begin and Save, when set), Save, Materialize. The next
// step finishes its requests. It returns the engine goroutine's time in
// Save and Materialize.
func (hb *hitBench) step(b *testing.B, hit bool, forward func()) time.Duration {
	p := &hb.miss
	if hit {
		p = &hb.p
	}
	for r := range p.IDs {
		hb.id++
		p.IDs[r], p.Arrivals[r] = hb.id, hb.id
	}
	must(b, hb.c.Begin(p))
	if forward != nil {
		forward()
	}
	t0 := time.Now()
	sid, err := hb.c.Save(&hb.outs)
	must(b, err)
	must(b, hb.c.Materialize(sid, nil, &hb.res))
	d := time.Since(t0)
	for r := range p.IDs {
		hb.p.Finished[r], hb.miss.Finished[r] = p.IDs[r], p.IDs[r]
	}
	return d
}

// BenchmarkHitStep measures what a hit costs the engine goroutine: every op
// is one step of 64 arrivals, each hitting 512 committed tokens of 12 KiB
// rows (384 MiB of prefix rows) and computing one token: Begin, a modelled
// forward of 20 ms (a sleep), Save, Materialize of the whole step. The
// metric engine-ns/op is the engine goroutine's Save + Materialize time.
// With prefetch on, the hit rows move during the forward (on the committer
// and the copy workers) and Materialize adopts them; off, Materialize
// gathers them on the engine goroutine. hit=0 is the miss step of the same
// shape (the same 64 tokens, no hit), for comparison.
//
// first/ is a fresh cache's first hit step, each op on a new cache and a
// new Result (both made, and the prefixes written, outside the timer):
// what an engine's first long hit after start costs. With prefetch, no
// buffer of the size is idle yet: the committer makes them during the
// forward and Materialize adopts them, where without prefetch Materialize
// sizes the Result itself. Run it with -benchtime 1x (every op is a first
// step anyway; more ops only repeat it) and -count 6 or more.
func BenchmarkHitStep(b *testing.B) {
	const forward = 20 * time.Millisecond
	sleep := func() { time.Sleep(forward) }
	onOff := map[bool]string{true: "on", false: "off"}
	for _, prefetch := range []bool{true, false} {
		b.Run(fmt.Sprintf("first/hit=%dx%d/row=%d/prefetch=%s", hbReqs, hbHit, hbRow, onOff[prefetch]), func(b *testing.B) {
			b.ReportAllocs()
			var engine time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				hb := newHitBench(b, omnicache.Config{DisablePrefetch: !prefetch}, false)
				runtime.GC() // the caches of the ops before are garbage
				b.StartTimer()
				engine += hb.step(b, true, sleep)
				b.StopTimer()
				hb.check(b)
				must(b, hb.c.Close())
				b.StartTimer()
			}
			b.ReportMetric(float64(engine.Nanoseconds())/float64(b.N), "engine-ns/op")
		})
	}
	run := func(b *testing.B, cfg omnicache.Config, hit bool) {
		hb := newHitBench(b, cfg, true)
		b.ReportAllocs()
		// The caches of the sub-benchmarks run before are garbage (GiBs of
		// buffers): collect them now, not during the timed steps.
		runtime.GC()
		b.ResetTimer()
		var engine time.Duration
		for i := 0; i < b.N; i++ {
			engine += hb.step(b, hit, sleep)
		}
		b.ReportMetric(float64(engine.Nanoseconds())/float64(b.N), "engine-ns/op")
	}
	for _, prefetch := range []bool{true, false} {
		b.Run(fmt.Sprintf("hit=%dx%d/row=%d/prefetch=%s", hbReqs, hbHit, hbRow, onOff[prefetch]), func(b *testing.B) {
			run(b, omnicache.Config{DisablePrefetch: !prefetch}, true)
		})
	}
	b.Run(fmt.Sprintf("hit=0/row=%d", hbRow), func(b *testing.B) {
		run(b, omnicache.Config{}, false)
	})
}

// The machine's ceiling for the same bytes, in the same run: one 384 MiB
// memcpy between flat buffers, in pieces of 64 rows split evenly over 1, 2
// (and 8) goroutines. On a VM whose memory bandwidth one core saturates,
// workers=2 cannot beat workers=1 by more than this does.
func BenchmarkMaterializeCeiling(b *testing.B) {
	const n, piece = 64 * 512 * 12288, 64 * 12288
	ws := []int{1, 2}
	for _, g := range []int{8, 16} {
		if runtime.NumCPU() >= g {
			ws = append(ws, g)
		}
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

// BenchmarkMaterializeInto measures Materialize of one 2,048-token prefill
// step without a hit (8 KiB rows, 16 MiB: what make bench-python's
// prefill2048 reads through the C ABI) into the caller's buffer
// (Result.Into, the ABI's way), into the Result's own warm buffers, and,
// for the same bytes, one copy out of a buffer written by a copy just
// before, as Save writes the staging page (op=memcpy). Only the
// Materialize (the copy) is timed; Begin and Save run with the timer
// stopped, a 2 ms pause after them lets the committer write the step.
func BenchmarkMaterializeInto(b *testing.B) {
	const rb, ntok, bs = 8192, 2048, 16
	src := make([]byte, ntok*rb)
	for i := range src {
		src[i] = byte(i * 13)
	}
	dst := make([]byte, ntok*rb)
	for _, into := range []bool{true, false} {
		b.Run(fmt.Sprintf("op=materialize/into=%v/rows=%d/row=%d", into, ntok, rb), func(b *testing.B) {
			c, err := omnicache.New(omnicache.Config{NumBlocks: 2 * ntok / bs, BlockSize: bs,
				Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, StagingCapacityTokens: ntok})
			must(b, err)
			defer c.Close()
			p := omnicache.Plan{Stride: ntok / bs, Table: make([]int32, ntok/bs), IDs: []int64{0}, Rows: []int32{0},
				Start: []int32{0}, Count: []int32{ntok}, Arrivals: []int64{0}, HitTokens: []int32{0}}
			outs := omnicache.Outputs{Tokens: ntok, Tensors: []omnicache.Tensor{{Host: src, Rows: ntok}}}
			var res omnicache.Result
			if into {
				res.Into([][]byte{dst})
			}
			b.SetBytes(ntok * rb)
			for i := 0; i < b.N+1; i++ {
				if i == 1 {
					b.ResetTimer() // the first step warms the Result and the staging page
				}
				b.StopTimer()
				for j := range p.Table {
					p.Table[j] = int32(j + (i%2)*ntok/bs)
				}
				p.Finished = append(p.Finished[:0], p.IDs[0])
				p.IDs[0]++
				p.Arrivals[0] = p.IDs[0]
				if i == 0 {
					p.Finished = p.Finished[:0]
				}
				must(b, c.Begin(&p))
				sid, err := c.Save(&outs)
				must(b, err)
				time.Sleep(2 * time.Millisecond)
				b.StartTimer()
				must(b, c.Materialize(sid, nil, &res))
			}
			b.StopTimer()
			if got := res.Rows(0, 0); !bytes.Equal(got, src) || into && &got[0] != &dst[0] {
				b.Fatalf("rows differ from the saved ones, or not in the caller's buffer")
			}
		})
	}
	b.Run(fmt.Sprintf("op=memcpy/rows=%d/row=%d", ntok, rb), func(b *testing.B) {
		stage := make([]byte, ntok*rb)
		b.SetBytes(ntok * rb)
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			copy(stage, src)
			time.Sleep(2 * time.Millisecond)
			b.StartTimer()
			copy(dst, stage)
		}
	})
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
