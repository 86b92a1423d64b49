package main

import (
	"testing"
	"time"

	"github.com/omnicache/omnicache"
)

// BenchmarkCAPIStep is the Go side of make bench-python: the same steps
// python/omnicache/_bench.py drives through the Python package, called from
// Go on the Go API (Begin + Save of a non-owned host tensor + Discard of the
// step before), so the difference is what the ABI and Python add.
//
//	shape=decode16, decode64   16/64 requests decoding one token each
//	shape=prefill2048          one new request of 2048 tokens a step
//
// Rows are 64 bytes (the per-call costs dominate, not the copy); block size
// 16; decode positions advance by one a step and wrap to the middle of a
// 128-block table row. Between steps a "forward" spins (untimed; 50 µs
// for decode, 1 ms for prefill): the committer writes the step meanwhile, as it does while an
// engine's forward runs, so neither side measures waits for staging pages
// that only an engine without a forward meets. The figure is step-ns: the
// time inside Begin, Save and Discard per step, clocked around them as the
// Python side clocks its calls; stall-ns is the part of it Save waited
// for a staging page (Stats.StallNanos).
func BenchmarkCAPIStep(b *testing.B) {
	for _, s := range BenchShapes {
		b.Run("shape="+s.Name, func(b *testing.B) { benchCAPIStep(b, s) })
	}
}

// BenchShape is one benchmarked step shape (mirrored by _bench.py).
type BenchShape struct {
	Name    string
	Reqs    int
	Tokens  int           // per request
	Forward time.Duration // the untimed spin between steps
}

// BenchShapes are the shapes of make bench-python: a prefill's forward is
// longer, long enough for the committer to write its rows.
var BenchShapes = []BenchShape{
	{"decode16", 16, 1, 50 * time.Microsecond},
	{"decode64", 64, 1, 50 * time.Microsecond},
	{"prefill2048", 1, 2048, time.Millisecond},
}

const (
	benchBS     = 16
	benchRow    = 64
	benchStride = 128
)

func benchCAPIStep(b *testing.B, s BenchShape) {
	ntok := s.Reqs * s.Tokens
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: s.Reqs * benchStride, BlockSize: benchBS,
		Keys:                  []omnicache.Key{{Name: "hidden", RowBytes: benchRow}},
		StagingCapacityTokens: max(1024, ntok),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var p omnicache.Plan
	p.Stride = benchStride
	p.Table = make([]int32, s.Reqs*benchStride)
	for i := range p.Table {
		p.Table[i] = int32(i)
	}
	next := int64(0)
	for i := 0; i < s.Reqs; i++ {
		next++
		p.IDs = append(p.IDs, next)
		p.Rows = append(p.Rows, int32(i))
		p.Start = append(p.Start, 0)
		p.Count = append(p.Count, int32(s.Tokens))
		p.Arrivals = append(p.Arrivals, next)
		p.HitTokens = append(p.HitTokens, 0)
	}
	out := omnicache.Outputs{Tokens: ntok, Padded: ntok, Tensors: []omnicache.Tensor{{Host: make([]byte, ntok*benchRow), Rows: ntok}}}
	limit := int32(benchStride * benchBS)
	prefill := s.Tokens > 1
	advance := func() {
		if prefill {
			// a new request every step: the previous one finishes
			p.Finished = append(p.Finished[:0], p.IDs[0])
			next++
			p.IDs[0] = next
			p.Arrivals = append(p.Arrivals[:0], next)
			p.HitTokens = append(p.HitTokens[:0], 0)
			return
		}
		p.Arrivals, p.HitTokens = p.Arrivals[:0], p.HitTokens[:0]
		for r := range p.Start {
			p.Start[r]++
			if p.Start[r] >= limit {
				p.Start[r] = limit / 2
			}
		}
	}
	var prev omnicache.StepID
	step := func() {
		if err := c.Begin(&p); err != nil {
			b.Fatal(err)
		}
		id, err := c.Save(&out)
		if err != nil {
			b.Fatal(err)
		}
		if prev != 0 {
			if err := c.Discard(prev); err != nil {
				b.Fatal(err)
			}
		}
		prev = id
	}
	step()
	for i := 0; i < 2*int(limit); i++ {
		advance()
		step()
	}
	b.ReportAllocs()
	b.ResetTimer()
	var in time.Duration
	stall0 := c.Stats().StallNanos
	for i := 0; i < b.N; i++ {
		advance()
		for t := time.Now(); time.Since(t) < s.Forward; {
		}
		t0 := time.Now()
		step()
		in += time.Since(t0)
	}
	b.ReportMetric(float64(in.Nanoseconds())/float64(b.N), "step-ns")
	b.ReportMetric(float64(c.Stats().StallNanos-stall0)/float64(b.N), "stall-ns")
}
