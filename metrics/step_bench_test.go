package metrics

import (
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/omnicache/omnicache"
)

// BenchmarkStep is the root package's BenchmarkStep for
// shape=decode64/row=64/hit=0 (buffer on: the default): 64 requests decode
// one token each, Begin + Save + Discard of the previous step on the engine
// goroutine, host device. collector=off runs it bare; collector=on with a
// Collector registered and the registry gathered and encoded by another
// goroutine every scrapeEvery, as a Prometheus server scraping promhttp
// would; collector=on+latency also times Begin, Save and Discard into a
// histogram on the engine goroutine (time.Now, time.Since, Observe around
// each call: the per-call latency histogram an engine or the replay could
// add without a hook in the core).
func BenchmarkStep(b *testing.B) {
	for _, mode := range []string{"off", "on", "on+latency"} {
		b.Run("shape=decode64/row=64/hit=0/collector="+mode, func(b *testing.B) { benchDecode64(b, mode) })
	}
}

// scrapeEvery is far more often than any Prometheus server scrapes (15 s
// is usual), so that a cost would show.
const scrapeEvery = 2 * time.Millisecond

func benchDecode64(b *testing.B, mode string) {
	const reqs, stride, bs, rb = 64, 64, 16, 64
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: reqs*stride + 1, BlockSize: bs,
		Keys:                  []omnicache.Key{{Name: "hidden", RowBytes: rb}},
		StagingCapacityTokens: 1024,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var p omnicache.Plan
	p.Table = make([]int32, reqs*stride)
	for i := range p.Table {
		p.Table[i] = int32(i)
	}
	p.Stride = stride
	for i := range reqs {
		p.IDs = append(p.IDs, int64(i+1))
		p.Rows = append(p.Rows, int32(i))
		p.Start = append(p.Start, -1) // the first advance schedules position 0
		p.Count = append(p.Count, 1)
	}
	out := omnicache.Outputs{Tokens: reqs, Tensors: make([]omnicache.Tensor, 1)}
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, reqs*rb)
	}
	limit := int32(stride * bs)

	var begin, save, consume prometheus.Observer
	if mode != "off" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(New(c, Options{Queries: new(QueryCounter)}))
		if mode == "on+latency" {
			h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: Namespace, Name: "call_duration_seconds", Help: "Engine goroutine time per cache call.",
				Buckets: prometheus.ExponentialBuckets(250e-9, 2, 16),
			}, []string{"call"})
			reg.MustRegister(h)
			begin, save, consume = h.WithLabelValues("begin"), h.WithLabelValues("save"), h.WithLabelValues("discard")
		}
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(scrapeEvery)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				if err := gatherText(reg, io.Discard); err != nil {
					panic(err)
				}
			}
		}()
		defer func() { close(stop); <-done }()
	}

	var prev omnicache.StepID
	has := false
	step := func(i int) {
		for r := range p.Start {
			if p.Start[r]++; p.Start[r] >= limit {
				p.Start[r] = limit / 2
			}
		}
		var t time.Time
		if begin != nil {
			t = time.Now()
		}
		if err := c.Begin(&p); err != nil {
			b.Fatal(err)
		}
		if begin != nil {
			begin.Observe(time.Since(t).Seconds())
			t = time.Now()
		}
		out.Tensors[0] = omnicache.Tensor{Host: bufs[i%len(bufs)], Rows: reqs, Owned: true}
		id, err := c.Save(&out)
		if err != nil {
			b.Fatal(err)
		}
		if save != nil {
			save.Observe(time.Since(t).Seconds())
		}
		if has {
			if consume != nil {
				t = time.Now()
			}
			if err := c.Discard(prev); err != nil {
				b.Fatal(err)
			}
			if consume != nil {
				consume.Observe(time.Since(t).Seconds())
			}
		}
		prev, has = id, true
	}
	// warm up: write every position once, as the root benchmark does
	warm := 2 * int(limit)
	for i := range warm {
		step(i)
	}
	if err := c.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(reqs * rb))
	b.ResetTimer()
	stall0 := c.Stats().StallNanos
	for i := 0; i < b.N; i++ {
		step(warm + i)
	}
	b.StopTimer()
	// As in the root benchmark: engine-ns/op leaves out the waits for a
	// free staging page (Stats.StallNanos), which a forward would hide.
	stall := c.Stats().StallNanos - stall0
	b.ReportMetric(float64(b.Elapsed().Nanoseconds()-stall)/float64(b.N), "engine-ns/op")
	b.ReportMetric(float64(stall)/float64(b.N), "stall-ns/op")
}

// gatherText is one scrape's work without the network: gather and encode
// the text exposition, as promhttp does.
func gatherText(g prometheus.Gatherer, w io.Writer) error {
	fams, err := g.Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkScrape is the scraping goroutine's cost of one scrape of a
// cache's collector (Stats, gather, text encoding).
func BenchmarkScrape(b *testing.B) {
	c, err := omnicache.New(omnicache.Config{NumBlocks: 64, BlockSize: 16, Keys: []omnicache.Key{{Name: "hidden", RowBytes: 64}}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(c, Options{Queries: new(QueryCounter)}))
	b.ReportAllocs()
	for b.Loop() {
		if err := gatherText(reg, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
