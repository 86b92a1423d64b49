package omnicache_test

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/metrics"
)

// stepEngine drives the cache like an engine: a fixed set of requests, each
// with its own block-table row.
type stepEngine struct {
	c      *omnicache.Cache
	plan   omnicache.Plan
	outs   omnicache.Outputs
	bufs   [][]byte
	res    omnicache.Result
	stride int
	bs     int
	nextID int64
	prev   omnicache.StepID
	prevM  []int64
	has    bool
}

const benchBS = 16

func newStepEngine(b *testing.B, reqs, stride, tokens, rb int, buffer bool, cap int, histograms ...bool) *stepEngine {
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: reqs*stride + 1, BlockSize: benchBS,
		Keys:                  []omnicache.Key{{Name: "hidden", RowBytes: rb}},
		StagingCapacityTokens: cap,
		DisableDecodeBuffer:   !buffer,
		Histograms:            len(histograms) > 0 && histograms[0],
	})
	if err != nil {
		b.Fatal(err)
	}
	e := &stepEngine{c: c, stride: stride, bs: benchBS}
	e.plan.Table = make([]int32, reqs*stride)
	for i := range e.plan.Table {
		e.plan.Table[i] = int32(i)
	}
	e.plan.Stride = stride
	for i := 0; i < reqs; i++ {
		e.nextID++
		e.plan.IDs = append(e.plan.IDs, e.nextID)
		e.plan.Rows = append(e.plan.Rows, int32(i))
		e.plan.Start = append(e.plan.Start, 0)
		e.plan.Count = append(e.plan.Count, int32(tokens/reqs))
	}
	e.outs.Tensors = make([]omnicache.Tensor, 1)
	for i := 0; i < 4; i++ {
		e.bufs = append(e.bufs, make([]byte, tokens*rb))
	}
	e.outs.Tokens = tokens
	return e
}

// step runs Begin + Save + consume-previous on the engine goroutine.
func (e *stepEngine) step(b *testing.B, i int, owned bool, materialize []int64) {
	if err := e.c.Begin(&e.plan); err != nil {
		b.Fatal(err)
	}
	e.outs.Tensors[0] = omnicache.Tensor{Host: e.bufs[i%len(e.bufs)], Rows: e.outs.Tokens, Owned: owned}
	id, err := e.c.Save(&e.outs)
	if err != nil {
		b.Fatal(err)
	}
	if e.has {
		if len(e.prevM) > 0 {
			err = e.c.Materialize(e.prev, e.prevM, &e.res)
		} else {
			err = e.c.Discard(e.prev)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	e.prev, e.has = id, true
	e.prevM = e.prevM[:0]
	if materialize != nil {
		e.prevM = append(e.prevM, materialize...)
	}
}

// BenchmarkStep is the engine goroutine's cost of a step. collector=off
// runs the cache bare; collector=hist with Config.Histograms (the
// recording alone); collector=on with Config.Histograms and a
// metrics.Collector over the cache registered and gathered (text-encoded)
// by another goroutine every scrapeEvery, as a Prometheus server scraping
// promhttp would (on a machine of few cores the scraping goroutine and
// its garbage compete with the engine and the committer for them).
func BenchmarkStep(b *testing.B) {
	for _, shape := range []string{"decode64", "prefill8192"} {
		for _, rb := range []int{64, 4096} {
			for _, hit := range []int{0, 50} {
				for _, buffer := range []bool{true, false} {
					for _, col := range []string{"off", "hist", "on"} {
						name := fmt.Sprintf("shape=%s/row=%d/hit=%d/buffer=%s/collector=%s", shape, rb, hit, onOff[buffer], col)
						b.Run(name, func(b *testing.B) { benchStep(b, shape, rb, hit, buffer, col) })
					}
				}
			}
		}
	}
}

var onOff = map[bool]string{true: "on", false: "off"}

// scrapeEvery is far more often than a Prometheus server scrapes (15 s is
// usual), so that a cost would show.
const scrapeEvery = 2 * time.Millisecond

// scrapeLoop gathers reg into io.Discard every scrapeEvery until the
// returned stop is called.
func scrapeLoop(b *testing.B, c *omnicache.Cache) (stop func()) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(c, metrics.Options{}))
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(scrapeEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			fams, err := reg.Gather()
			if err != nil {
				panic(err)
			}
			enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, f := range fams {
				if err := enc.Encode(f); err != nil {
					panic(err)
				}
			}
		}
	}()
	return func() { close(quit); <-done }
}

func benchStep(b *testing.B, shape string, rb, hit int, buffer bool, collector string) {
	var e *stepEngine
	hists := collector != "off"
	switch shape {
	case "decode64":
		e = newStepEngine(b, 64, 64, 64, rb, buffer, 1024, hists)
		for i := range e.plan.Count {
			e.plan.Count[i] = 1
			e.plan.Start[i] = -1 // the first advance schedules position 0
		}
	case "prefill8192":
		e = newStepEngine(b, 1, 1024, 8192, rb, buffer, 8192, hists)
	}
	defer e.c.Close()
	if collector == "on" {
		defer scrapeLoop(b, e.c)()
	}
	limit := int32(e.stride * e.bs)
	var hitIDs []int64
	hitBuf := make([]int64, 1)
	advance := func(i int) {
		e.plan.Arrivals, e.plan.HitTokens, e.plan.HitBlocks, e.plan.Finished = e.plan.Arrivals[:0], e.plan.HitTokens[:0], e.plan.HitBlocks[:0], e.plan.Finished[:0]
		hitIDs = nil
		if shape == "prefill8192" {
			// a new request every step; with hit=50 it hits the previous
			// request's first 8192 tokens and computes the next 8192.
			e.plan.Finished = append(e.plan.Finished, e.plan.IDs[0])
			e.nextID++
			e.plan.IDs[0] = e.nextID
			e.plan.Arrivals = append(e.plan.Arrivals, e.nextID)
			if hit > 0 && i > 0 {
				e.plan.HitTokens = append(e.plan.HitTokens, 8192)
				for blk := 0; blk < 8192/e.bs; blk++ {
					e.plan.HitBlocks = append(e.plan.HitBlocks, int32(blk))
				}
				e.plan.Start[0] = 8192
				hitBuf[0] = e.nextID
				hitIDs = hitBuf
			} else {
				e.plan.HitTokens = append(e.plan.HitTokens, 0)
				e.plan.Start[0] = 0
			}
			return
		}
		for r := range e.plan.Start {
			e.plan.Start[r]++
			if e.plan.Start[r] >= limit {
				e.plan.Start[r] = limit / 2
			}
		}
		if hit > 0 && i >= 2*e.bs {
			// one request per step finishes and comes back as a new id that
			// hits its first half.
			r := i % len(e.plan.IDs)
			e.plan.Finished = append(e.plan.Finished, e.plan.IDs[r])
			e.nextID++
			e.plan.IDs[r] = e.nextID
			e.plan.Arrivals = append(e.plan.Arrivals, e.nextID)
			e.plan.HitTokens = append(e.plan.HitTokens, int32(2*e.bs))
			for blk := 0; blk < 2; blk++ {
				e.plan.HitBlocks = append(e.plan.HitBlocks, int32(r*e.stride+blk))
			}
			e.plan.Start[r] = int32(2 * e.bs)
			hitBuf[0] = e.nextID
			hitIDs = hitBuf
		}
	}
	// warm up: write every position once so hits find committed rows
	for i := 0; i < 2*int(limit); i++ {
		advance(i)
		e.step(b, i, true, nil)
	}
	if err := e.c.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(e.outs.Tokens * rb))
	b.ResetTimer()
	// advance (building the next plan, the engine's own work) is inside the
	// timed loop: stopping the timer per step costs far more than it does.
	warm := 2 * int(limit)
	st0 := e.c.Stats()
	stall0 := st0.StallNanos
	for i := 0; i < b.N; i++ {
		advance(warm + i)
		e.step(b, i, true, hitIDs)
	}
	b.StopTimer()
	// ns/op is wall time and includes back-pressure: with no forward
	// between steps, the engine outruns the committer and waits for a free
	// staging page. engine-ns/op leaves those waits out (Stats.StallNanos),
	// as the replay reports stalls apart.
	st := e.c.Stats()
	stall := st.StallNanos - stall0
	b.ReportMetric(float64(b.Elapsed().Nanoseconds()-stall)/float64(b.N), "engine-ns/op")
	b.ReportMetric(float64(stall)/float64(b.N), "stall-ns/op")
	// Who did the work: the committer's busy time a step, and with hits
	// the share of steps whose queued hit read the engine took itself
	// (Stats.HitReadsOnCaller) rather than the committer.
	b.ReportMetric(float64(st.CommitterNanos-st0.CommitterNanos)/float64(b.N), "committer-ns/op")
	if hit > 0 {
		b.ReportMetric(float64(st.HitReadsOnCaller-st0.HitReadsOnCaller)/float64(b.N), "caller-reads/op")
	}
}

// BenchmarkCommit measures the bytes/s of whole steps until their rows are
// committed in the mirror, next to a plain memcpy of the same bytes in the
// same run. A step is one request of 1024 tokens × 4 KiB (4 MiB) with an
// owned host tensor, so the op is Begin + Save + Sync: the committer's
// scatter from the engine's buffer into the mirror (split across the
// default CopyWorkers), and nothing else of size.
//
//	op=step/mirror=warm   every step rewrites the same 1024 slots
//	op=step/mirror=fresh  every step writes 1024 slots never written
//	                      before: its rows land in never-touched mirror
//	                      memory (first-touch faults included); every 64
//	                      steps the cache is replaced, timer stopped
//	op=memcpy             one copy() of the 4 MiB between two warm buffers,
//	                      on one goroutine
func BenchmarkCommit(b *testing.B) {
	const rb, tokens, fresh = 4096, 1024, 64
	for _, mirror := range []string{"fresh", "warm"} {
		b.Run("op=step/mirror="+mirror+"/row=4096", func(b *testing.B) {
			ranges := 1
			if mirror == "fresh" {
				ranges = fresh
			}
			mk := func() *stepEngine {
				e := newStepEngine(b, ranges, 64, tokens, rb, false, tokens)
				e.plan.Table, e.plan.Stride = e.plan.Table[:64], 64 // one request
				e.plan.IDs, e.plan.Rows, e.plan.Start, e.plan.Count = e.plan.IDs[:1], e.plan.Rows[:1], e.plan.Start[:1], []int32{tokens}
				return e
			}
			e := mk()
			defer func() { e.c.Close() }()
			b.SetBytes(tokens * rb)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if mirror == "fresh" {
					r := i % fresh
					if r == 0 && i > 0 {
						b.StopTimer()
						e.c.Close()
						e = mk()
						b.StartTimer()
					}
					for blk := range e.plan.Table {
						e.plan.Table[blk] = int32(r*64 + blk)
					}
				}
				e.step(b, i, true, nil)
				if err := e.c.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("op=memcpy/row=4096", func(b *testing.B) {
		src := make([]byte, tokens*rb)
		dst := make([]byte, tokens*rb)
		b.SetBytes(tokens * rb)
		for i := 0; i < b.N; i++ {
			copy(dst, src)
		}
	})
}
