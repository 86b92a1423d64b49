//go:build cuda

package gpu_test

// BenchmarkStaging: DESIGN §7's H200 staging target (the cache's
// device→host staging at ≥ 90% of a plain pinned copy measured in the same
// run). Every op moves 64 MiB: one prefill step of 8192 tokens × 8192 bytes
// (one required immediate key), StagingCapacityTokens 8192, no decode
// buffer.
//
//	op=plain-pinned     the baseline: one cuMemcpyDtoHAsync of 64 MiB from
//	                    device memory into pinned memory + cuStreamSynchronize
//	                    (gorgonia.org/cu directly, its own stream)
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
//	                    step's device event (its rows are host-ready in the
//	                    staging page) + Discard; before each op, with the
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

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"gorgonia.org/cu"

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
	last atomic.Uint64
}

func (d *tapDevice) Record() (gpu.Event, error) {
	ev, err := d.Device.Record()
	d.last.Store(uint64(ev))
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
			d := newCUDA(b, gpu.CUDAOptions{})
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

			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			dev, err := cu.GetDevice(0)
			must(b, err)
			ctx, err := dev.RetainPrimaryCtx()
			must(b, err)
			defer dev.ReleasePrimaryCtx()
			must(b, cu.SetCurrentContext(ctx))
			s, err := cu.MakeStream(cu.NonBlocking)
			must(b, err)
			defer s.Destroy()
			b.SetBytes(stBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if gap {
					b.StopTimer()
					copy(gapDst, gapSrc)
					b.StartTimer()
				}
				if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&pin[0]), cu.DevicePtr(src.Ptr), stBytes, s); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
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
	}
	for _, v := range []variant{
		{op: "cache"},
		{op: "cache-owned", owned: true},
		{op: "cache-staging", staging: true},
		{op: "cache-staging-owned", owned: true, staging: true},
		{op: "cache-staging-memalloc", staging: true, opt: gpu.CUDAOptions{SyncAlloc: true}},
		{op: "cache-pipelined", pipeline: true},
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
				id, err := c.Save(&omnicache.Outputs{Tokens: stTokens, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: stTokens, Owned: v.owned}}})
				if err != nil {
					b.Fatal(err)
				}
				if v.staging {
					t1 := time.Now()
					if err := d.Wait(gpu.Event(d.last.Load())); err != nil {
						b.Fatal(err)
					}
					saveNs += t1.Sub(t0)
					waitNs += time.Since(t1)
				}
				if err := c.Discard(id); err != nil {
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
