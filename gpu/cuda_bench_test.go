//go:build cuda

package gpu_test

// BenchmarkStaging: the H200 staging target (docs/performance.md; the cache's
// device→host staging at ≥ 90% of a plain pinned copy measured in the same
// run). Every op moves 64 MiB: one prefill step of 8192 tokens × 8192 bytes
// (one required immediate key), StagingCapacityTokens 8192, no decode
// buffer.
//
//	op=plain-pinned     the baseline: one cuMemcpyDtoHAsync of 64 MiB from
//	                    device memory into pinned memory + cuStreamSynchronize
//	                    (the driver directly, its own stream: gpu.RawStream)
//	op=cache            Begin + Save + Discard + Sync of a step whose output
//	                    is an engine device tensor (not owned: the cache
//	                    clones it DtoD, then copies DtoH into its pinned
//	                    page); Sync waits until the rows are scattered into
//	                    the mirror, so the op is clone + copy + scatter, one
//	                    after the other
//	op=cache-owned      the same with an owned tensor (DtoH straight from it;
//	                    the tensor is allocated with the timer stopped)
//	op=plain-pinned-gap op=plain-pinned with, before each op and with the
//	                    timer stopped, a 64 MiB host memcpy (what the
//	                    committer's scatter does between two cache-staging
//	                    ops): the baseline for the cache-staging variants
//	op=device-pinned    the baseline through the Device interface:
//	                    CopyDtoH into AllocHost memory + Record + Wait
//	op=cache-staging    the staging path alone: Begin + Save + wait for the
//	                    event the committer records after issuing the step's
//	                    device→host copies, and for the copies (its rows are
//	                    host-ready in the staging page) + Discard; before each op, with the
//	                    timer stopped, Sync lets the committer finish the
//	                    previous step's scatter, so the op measures clone +
//	                    device→host copy with an idle committer
//	op=cache-staging-owned  the same with owned tensors (one DtoH, no clone)
//	op=cache-staging-memalloc  op=cache-staging with cuMemAlloc/cuMemFree
//	                    clones (CUDAOptions.SyncAlloc) instead of the pool
//	op=cache-pipelined  Begin + Save + Discard, steps over 8 distinct slot
//	                    ranges, Sync once at the end: the sustained rate with
//	                    staging and scatter overlapping (bounded by the
//	                    slower of the two)
//	op=cache-pipelined-hostalloc  the same with staging pages from
//	                    cuMemHostAlloc (CUDAOptions.HostAlloc)
//	op=cache-pipelined-allcores  the same with CopyWorkers = GOMAXPROCS
//	op=cache-direct     op=cache with Config.MirrorDirect: the rows go from
//	                    the clone straight into the mirror (registered
//	                    chunks), no staging copy and no host scatter
//	op=cache-pipelined-direct  op=cache-pipelined with Config.MirrorDirect
//	op=cache-pipelined-direct-owned  the same with owned tensors
//	op=cache-pipelined-materialize  op=cache-pipelined consuming each step
//	                    with Materialize (its 64 MiB of rows into a Result,
//	                    as an engine does) instead of Discard
//	op=cache-pipelined-direct-materialize  the same with MirrorDirect (the
//	                    step's rows read back from the device)

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

const (
	stTokens = 8192
	stRow    = 8192
	stBytes  = stTokens * stRow // 64 MiB
	stBlock  = 16
	stRanges = 8
)

// tapDevice remembers the last event recorded (the benchmark's step event:
// nothing else records in these runs).
type tapDevice struct {
	gpu.Device
	copied atomic.Bool   // a device→host copy was issued since the last Record
	staged atomic.Uint64 // the last event recorded after device→host copies
}

func (d *tapDevice) CopyDtoH(dst []byte, src gpu.Buffer, off int) error {
	d.copied.Store(true)
	return d.Device.CopyDtoH(dst, src, off)
}

func (d *tapDevice) CopyDtoHBatch(dst [][]byte, src []gpu.Buffer) error {
	d.copied.Store(true)
	return gpu.CopyDtoHAll(d.Device, dst, src)
}

// The mirror's chunks are registered with the CUDA device under it
// (Config.MirrorDirect); copies into them count as copies.
func (d *tapDevice) RegisterHost(p []byte) error {
	return d.Device.(gpu.HostRegistrar).RegisterHost(p)
}

func (d *tapDevice) UnregisterHost(p []byte) error {
	return d.Device.(gpu.HostRegistrar).UnregisterHost(p)
}

func (d *tapDevice) CopyDtoHRegistered(dst [][]byte, src []gpu.Buffer) error {
	d.copied.Store(true)
	return d.Device.(gpu.HostRegistrar).CopyDtoHRegistered(dst, src)
}

func (d *tapDevice) Record() (gpu.Event, error) {
	ev, err := d.Device.Record()
	if err == nil && d.copied.Swap(false) {
		d.staged.Store(uint64(ev))
	}
	return ev, err
}

func BenchmarkStaging(b *testing.B) {
	name := func(op string) string { return fmt.Sprintf("op=%s/bytes=64MiB", op) }

	for _, gap := range []bool{false, true} {
		op := "plain-pinned"
		if gap {
			op = "plain-pinned-gap"
		}
		b.Run(name(op), func(b *testing.B) {
			// One cuMemHostAlloc page: a plain pinned copy is one call
			// into one registration.
			d := newCUDA(b, gpu.CUDAOptions{HostAlloc: true})
			src, err := d.Alloc(stBytes)
			must(b, err)
			defer d.Free(src)
			pin, err := d.AllocHost(stBytes)
			must(b, err)
			defer d.FreeHost(pin)
			must(b, d.CopyHtoD(src, 0, pattern(stBytes, 1)))
			sync0(b, d)
			var gapSrc, gapDst []byte
			if gap {
				gapSrc, gapDst = pattern(stBytes, 3), make([]byte, stBytes)
			}

			s, err := gpu.NewRawStream(0)
			must(b, err)
			defer s.Close()
			b.SetBytes(stBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if gap {
					b.StopTimer()
					copy(gapDst, gapSrc)
					b.StartTimer()
				}
				if err := s.CopyDtoH(pin, src.Ptr); err != nil {
					b.Fatal(err)
				}
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}

	b.Run(name("device-pinned"), func(b *testing.B) {
		d := newCUDA(b, gpu.CUDAOptions{})
		src, err := d.Alloc(stBytes)
		must(b, err)
		defer d.Free(src)
		pin, err := d.AllocHost(stBytes)
		must(b, err)
		defer d.FreeHost(pin)
		must(b, d.CopyHtoD(src, 0, pattern(stBytes, 1)))
		sync0(b, d)
		b.SetBytes(stBytes)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := d.CopyDtoH(pin, src, 0); err != nil {
				b.Fatal(err)
			}
			sync0(b, d)
		}
	})

	type variant struct {
		op       string
		owned    bool
		staging  bool // wait for the step's event only
		pipeline bool // Sync once, rotating slot ranges
		opt      gpu.CUDAOptions
		workers  int  // Config.CopyWorkers (0: the default)
		direct   bool // Config.MirrorDirect
		// materialize consumes each step with Materialize (its rows into
		// a Result) instead of Discard
		materialize bool
	}
	for _, v := range []variant{
		{op: "cache"},
		{op: "cache-owned", owned: true},
		{op: "cache-staging", staging: true},
		{op: "cache-staging-owned", owned: true, staging: true},
		{op: "cache-staging-owned-w4", owned: true, staging: true, workers: 4},
		{op: "cache-staging-memalloc", staging: true, opt: gpu.CUDAOptions{SyncAlloc: true}},
		{op: "cache-pipelined", pipeline: true},
		{op: "cache-pipelined-hostalloc", pipeline: true, opt: gpu.CUDAOptions{HostAlloc: true}},
		{op: "cache-pipelined-allcores", pipeline: true, workers: runtime.GOMAXPROCS(0)},
		{op: "cache-direct", direct: true},
		{op: "cache-pipelined-direct", pipeline: true, direct: true},
		{op: "cache-pipelined-direct-owned", pipeline: true, owned: true, direct: true},
		{op: "cache-pipelined-materialize", pipeline: true, materialize: true},
		{op: "cache-pipelined-direct-materialize", pipeline: true, direct: true, materialize: true},
	} {
		b.Run(name(v.op), func(b *testing.B) {
			cd := newCUDA(b, v.opt)
			d := &tapDevice{Device: cd}
			nblk := stTokens / stBlock
			c, err := omnicache.New(omnicache.Config{
				NumBlocks:             stRanges * nblk,
				BlockSize:             stBlock,
				Keys:                  []omnicache.Key{{Name: "hidden", RowBytes: stRow}},
				StagingCapacityTokens: stTokens,
				DisableDecodeBuffer:   true,
				Device:                d,
				CopyWorkers:           v.workers,
				MirrorDirect:          v.direct,
			})
			must(b, err)
			defer c.Close()
			table := make([]int32, stRanges*nblk)
			for i := range table {
				table[i] = int32(i)
			}
			src, err := cd.Alloc(stBytes)
			must(b, err)
			defer cd.Free(src)
			must(b, cd.CopyHtoD(src, 0, pattern(stBytes, 2)))
			sync0(b, cd)

			var req int64
			var saveNs, waitNs time.Duration
			var res omnicache.Result
			step := func(tensor gpu.Buffer) {
				t0 := time.Now()
				req++
				r := int32(0)
				if v.pipeline {
					r = int32(req % stRanges)
				}
				p := omnicache.Plan{
					IDs: []int64{req}, Rows: []int32{r}, Start: []int32{0}, Count: []int32{stTokens},
					Table: table, Stride: nblk,
					Arrivals: []int64{req}, HitTokens: []int32{0},
				}
				if req > 1 {
					p.Finished = []int64{req - 1}
				}
				if err := c.Begin(&p); err != nil {
					b.Fatal(err)
				}
				staged0 := d.staged.Load()
				id, err := c.Save(&omnicache.Outputs{Tokens: stTokens, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: stTokens, Owned: v.owned}}})
				if err != nil {
					b.Fatal(err)
				}
				if v.staging {
					// The committer issues the step's device→host copies
					// and records the event after them: wait for that
					// event, then for the copies.
					t1 := time.Now()
					for d.staged.Load() == staged0 {
						runtime.Gosched()
					}
					if err := d.Wait(gpu.Event(d.staged.Load())); err != nil {
						b.Fatal(err)
					}
					saveNs += t1.Sub(t0)
					waitNs += time.Since(t1)
				}
				if v.materialize {
					if err := c.Materialize(id, nil, &res); err != nil {
						b.Fatal(err)
					}
				} else if err := c.Discard(id); err != nil {
					b.Fatal(err)
				}
				if !v.staging && !v.pipeline {
					if err := c.Sync(); err != nil {
						b.Fatal(err)
					}
				}
			}
			tensor := func() gpu.Buffer {
				if !v.owned {
					return src
				}
				t, err := cd.Alloc(stBytes)
				must(b, err)
				return t
			}
			// Warm up: staging pages pinned, mirror rows resident, pool grown.
			for i := 0; i < 2*stRanges; i++ {
				step(tensor())
			}
			must(b, c.Sync())
			saveNs, waitNs = 0, 0
			b.SetBytes(stBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t := src
				if v.owned || v.staging {
					b.StopTimer()
					if v.owned {
						t = tensor()
					}
					if v.staging {
						if err := c.Sync(); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
				}
				step(t)
			}
			must(b, c.Sync())
			b.StopTimer()
			st := c.Stats()
			b.ReportMetric(float64(st.RowsSkipped)/float64(st.RowsWritten+st.RowsSkipped), "skipped/row")
			if v.staging {
				// Begin+Save (engine goroutine) and the wait for the copies.
				b.ReportMetric(float64(saveNs.Microseconds())/float64(b.N), "save-µs/op")
				b.ReportMetric(float64(waitNs.Microseconds())/float64(b.N), "wait-µs/op")
			}
			b.Logf("alloc=%s steps=%d rows written=%d skipped=%d committer=%.2fms/step mirror=%d MiB",
				cd.AllocMode(), st.Steps, st.RowsWritten, st.RowsSkipped,
				float64(st.CommitterNanos)/float64(st.Steps)/1e6, st.MirrorResidentBytes>>20)
		})
	}
}

// BenchmarkAllocHost: what pinning one staging page costs (AllocHost +
// FreeHost of a Qwen3-Omni prefill page: 8192 tokens × 12 KiB = 96 MiB),
// registered huge pages (the default) against cuMemHostAlloc, and what it
// costs the engine meanwhile: a second goroutine issues small device→host
// copies (4 KiB + Record + Wait, as a decode step's Save does) throughout,
// and stall-max-ms is the longest of those calls during the allocations
// (a driver call queued behind the allocation's driver lock).
func BenchmarkAllocHost(b *testing.B) {
	const size = 96 << 20
	for _, mode := range []string{"register", "hostalloc"} {
		b.Run(fmt.Sprintf("mode=%s/size=96MiB", mode), func(b *testing.B) {
			d := newCUDA(b, gpu.CUDAOptions{HostAlloc: mode == "hostalloc"})
			src, err := d.Alloc(4096)
			must(b, err)
			defer d.Free(src)
			small, err := d.AllocHost(4096)
			must(b, err)
			defer d.FreeHost(small)
			var stop atomic.Bool
			var worst atomic.Int64
			var calls atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				for !stop.Load() {
					t := time.Now()
					if d.CopyDtoH(small, src, 0) != nil {
						return
					}
					ev, err := d.Record()
					if err != nil || d.Wait(ev) != nil {
						return
					}
					if ns := time.Since(t).Nanoseconds(); ns > worst.Load() {
						worst.Store(ns)
					}
					calls.Add(1)
					time.Sleep(50 * time.Microsecond)
				}
			}()
			time.Sleep(20 * time.Millisecond) // the copy loop's own first calls
			worst.Store(0)
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				p, err := d.AllocHost(size)
				must(b, err)
				d.FreeHost(p)
			}
			b.StopTimer()
			stop.Store(true)
			<-done
			b.ReportMetric(float64(worst.Load())/1e6, "stall-max-ms")
			b.ReportMetric(float64(calls.Load())/float64(b.N), "copies/op")
		})
	}
}

// BenchmarkFlushCopies: a decode-buffer flush's device→host copies (16
// parked steps × 3 keys of 32 rows × 4 KiB, Qwen3-Omni at concurrency 32)
// issued one CopyDtoH each (mode=loop) or as one CopyDtoHBatch
// (mode=batch), then Record. With hold=0 each op also waits for its copies
// (ns/op includes them); with hold=5ms the ops are 5 ms apart (sleep, then
// spin the last 100 µs, as the replay holds a forward) and each waits for
// the event of the op before the previous one, as Save's join does.
// call-µs/op is the copies' issue, record-µs/op the Record, join-µs/op the
// wait (the engine goroutine's share).
func BenchmarkFlushCopies(b *testing.B) {
	const copies, size = 48, 32 * 4096
	for _, hold := range []time.Duration{0, 5 * time.Millisecond} {
		for _, mode := range []string{"loop", "batch"} {
			b.Run(fmt.Sprintf("copies=%d/mode=%s/hold=%v", copies, mode, hold), func(b *testing.B) {
				d := newCUDA(b, gpu.CUDAOptions{})
				page, err := d.AllocHost(copies * size)
				must(b, err)
				defer d.FreeHost(page)
				dst := make([][]byte, copies)
				src := make([]gpu.Buffer, copies)
				for i := range copies {
					buf, err := d.Alloc(size)
					must(b, err)
					defer d.Free(buf)
					dst[i], src[i] = page[i*size:(i+1)*size], buf
				}
				sync0(b, d)
				var call, rec, join time.Duration
				var last [2]gpu.Event
				b.SetBytes(copies * size)
				b.ResetTimer()
				for range b.N {
					if hold > 0 {
						ht := time.Now()
						time.Sleep(hold - 100*time.Microsecond)
						for time.Since(ht) < hold {
						}
					}
					t := time.Now()
					if mode == "batch" {
						must(b, d.CopyDtoHBatch(dst, src))
					} else {
						for i := range dst {
							must(b, d.CopyDtoH(dst[i], src[i], 0))
						}
					}
					t1 := time.Now()
					ev, err := d.Record()
					must(b, err)
					t2 := time.Now()
					if hold == 0 {
						must(b, d.Wait(ev))
					} else {
						must(b, d.WaitFor(last[0], time.Minute))
						last[0], last[1] = last[1], ev
					}
					call += t1.Sub(t)
					rec += t2.Sub(t1)
					join += time.Since(t2)
				}
				b.ReportMetric(float64(call.Nanoseconds())/1e3/float64(b.N), "call-µs/op")
				b.ReportMetric(float64(rec.Nanoseconds())/1e3/float64(b.N), "record-µs/op")
				if hold > 0 {
					b.ReportMetric(float64(join.Nanoseconds())/1e3/float64(b.N), "join-µs/op")
				}
				b.ReportMetric(float64(d.BatchedCopies())/float64(b.N), "batched/op")
			})
		}
	}
}

// BenchmarkDecodeStep: the engine goroutine's cost of one pure decode step
// on the CUDA device (Begin + Save + Discard of the previous step, timed
// call by call: engine-µs/op), 32 requests, 3 immediate keys of 4 KiB
// (Qwen3-Omni's widths), decode buffer on: 15 of 16 steps park, every 16th
// flushes the buffer (one batch of copies). tensors=owned: each step's
// outputs are fresh device buffers (allocated outside the timed calls)
// handed over and freed by the cache; tensors=cloned: one engine buffer
// per key, reused, cloned by the cache. Each forward sets its outputs on
// the device (cuMemsetD8Async) and, with hold=5ms, holds the engine
// goroutine as the replay does (sleep, then spin the last 100 µs).
func BenchmarkDecodeStep(b *testing.B) {
	const reqs, rb, nkeys, bs = 32, 4096, 3, 16
	for _, hold := range []time.Duration{0, 5 * time.Millisecond} {
		for _, mode := range []string{"owned", "cloned"} {
			b.Run(fmt.Sprintf("reqs=%d/keys=%d/row=%d/tensors=%s/hold=%v", reqs, nkeys, rb, mode, hold), func(b *testing.B) {
				cd := newCUDA(b, gpu.CUDAOptions{})
				keys := []omnicache.Key{{Name: "hidden", RowBytes: rb}, {Name: "a", RowBytes: rb, Optional: true}, {Name: "b", RowBytes: rb, Optional: true}}
				stride := 64
				c, err := omnicache.New(omnicache.Config{
					NumBlocks: reqs*stride + 1, BlockSize: bs, Keys: keys,
					StagingCapacityTokens: 8192, Device: cd,
				})
				must(b, err)
				defer c.Close()
				table := make([]int32, reqs*stride)
				for i := range table {
					table[i] = int32(i)
				}
				p := omnicache.Plan{Table: table, Stride: stride}
				for i := range reqs {
					p.IDs = append(p.IDs, int64(i+1))
					p.Rows = append(p.Rows, int32(i))
					p.Start = append(p.Start, 0)
					p.Count = append(p.Count, 1)
				}
				shared := make([]gpu.Buffer, nkeys) // cloned mode: the engine's reused buffers
				for k := range shared {
					shared[k], err = cd.Alloc(reqs * rb)
					must(b, err)
					defer cd.Free(shared[k])
				}
				outs := omnicache.Outputs{Tokens: reqs, Tensors: make([]omnicache.Tensor, nkeys)}
				pos := int32(0)
				var prev omnicache.StepID
				var engine time.Duration
				step := func() {
					p.Arrivals, p.HitTokens, p.Finished = nil, nil, nil
					if pos == int32(stride*bs) { // the rows are full: the next batch of requests
						p.Finished = append([]int64(nil), p.IDs...)
						for i := range p.IDs {
							p.IDs[i] += reqs
						}
						pos = 0
					}
					for i := range p.Start {
						p.Start[i] = pos
					}
					if pos == 0 {
						p.Arrivals = p.IDs
						p.HitTokens = make([]int32, reqs)
					}
					pos++
					t0 := time.Now()
					must(b, c.Begin(&p))
					engine += time.Since(t0)
					for k := range outs.Tensors { // the forward
						t := shared[k]
						if mode == "owned" {
							t, err = cd.Alloc(reqs * rb)
							must(b, err)
						}
						must(b, cd.Fill(t, 0, reqs*rb, byte(pos)))
						outs.Tensors[k] = omnicache.Tensor{Dev: t, Rows: reqs, Owned: mode == "owned"}
					}
					if hold > 0 {
						ht := time.Now()
						time.Sleep(hold - 100*time.Microsecond)
						for time.Since(ht) < hold {
						}
					}
					t1 := time.Now()
					id, err := c.Save(&outs)
					must(b, err)
					if prev != 0 {
						must(b, c.Discard(prev))
					}
					engine += time.Since(t1)
					prev = id
				}
				for range 2 * bs { // warm up: pages pinned, pool grown
					step()
				}
				engine = 0
				b.ResetTimer()
				for range b.N {
					step()
				}
				b.StopTimer()
				b.ReportMetric(float64(engine.Nanoseconds())/1e3/float64(b.N), "engine-µs/op")
			})
		}
	}
}

// BenchmarkCheck: Device.Check of an allocation the device made (the
// replay's and most engines' output tensors), as Save does per device
// tensor.
func BenchmarkCheck(b *testing.B) {
	d := newCUDA(b, gpu.CUDAOptions{})
	buf, err := d.Alloc(1 << 20)
	must(b, err)
	defer d.Free(buf)
	for range b.N {
		must(b, d.Check(buf))
	}
}
