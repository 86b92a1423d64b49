// runOn: one cache-on replay, step by step, driving the real cache.

package replay

import (
	"context"
	"fmt"
	"runtime/trace"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

func (r *runner) runOn() error {
	o, spec, s, rep := r.o, r.spec, r.s, r.rep
	r.clock = clockOverhead()
	cfg := omnicache.Config{
		NumBlocks:             s.KV().Len(),
		BlockSize:             o.BlockSize,
		Keys:                  spec.Keys,
		StagingDepth:          o.StagingDepth,
		StagingCapacityTokens: o.MaxBatchedTokens,
		DisableDecodeBuffer:   o.DisableDecodeBuffer,
		AllocStagingAtNew:     o.AllocStagingAtNew,
		AllocStagingAhead:     o.AllocStagingAhead,
	}
	depth := o.StagingDepth
	if depth <= 0 {
		depth = omnicache.DefaultStagingDepth
	}
	rowBytes := keyRowBytes(spec.Keys)
	if o.MirrorDirect {
		var immRow int64
		for _, k := range spec.Keys {
			if !k.Deferred {
				immRow += int64(k.RowBytes)
			}
		}
		cfg.MirrorDirect, cfg.MirrorDirectMinBytes = true, 1
		cfg.DeviceBudgetBytes = max(omnicache.DefaultDeviceBudgetBytes, int64(depth+2)*int64(o.MaxBatchedTokens)*immRow)
	}
	dev := o.Device
	if dev == nil {
		dev = gpu.NewHost()
	}
	meter := &meteredDevice{Device: dev}
	cfg.Device = meter
	rep.Device, rep.Outputs = deviceName(dev), "host"
	rep.ForwardHoldMax = o.HoldMax.Nanoseconds()
	var pool *bufPool
	var douts *deviceOutputs
	if o.DeviceOutputs {
		// The engine's output buffers exist before the cache does: not
		// start-up of the cache. Enough for every staging page, a full
		// decode buffer and the steps not consumed yet.
		var err error
		douts, err = newDeviceOutputs(dev, rowBytes, o.MaxBatchedTokens, !o.NotOwned, depth+o.BlockSize+4)
		if err != nil {
			return fmt.Errorf("output buffers: %w", err)
		}
		defer douts.close() // after the cache's Close (deferred below)
		meter.outs = douts
		rep.Outputs = "device"
	} else {
		pool = newBufPool(rowBytes, o.MaxBatchedTokens, !o.NotOwned)
		if !o.NotOwned {
			cfg.ReleaseHost = pool.release
		}
	}
	var ver *verifier
	if o.Verify {
		ver = newVerifier(spec.Keys, s.KV().Len()*o.BlockSize, o.BlockSize)
	}
	out := omnicache.Outputs{Tensors: make([]omnicache.Tensor, len(spec.Keys))}
	// Step records: the step being run, the previous one (consumed after
	// this step's Save) and the one the output goroutine may still read.
	var ring [3]stepRecord
	var prevID omnicache.StepID
	var prev *stepRecord
	saved := 0
	if o.MaterializeOnEngine {
		rep.MaterializeOn = "engine"
	} else {
		rep.MaterializeOn = "output"
	}

	t0 := time.Now()
	c, err := o.NewCache(cfg)
	newNs := time.Since(t0).Nanoseconds()
	rep.NewNs = newNs
	if err != nil {
		return fmt.Errorf("new cache: %w", err)
	}
	closed := false
	out2 := newOutputGoroutine(c, r)
	defer func() {
		out2.stop()
		if !closed {
			c.Close()
		}
	}()

	// consume hands step rec (id) to Materialize when one of its requests
	// hit (or always with --verify), else discards it on the engine
	// goroutine (timed). Materialize runs on the output goroutine, where an
	// engine hands stage 0's outputs to the next stage, overlapping the next
	// forward; with MaterializeOnEngine it runs here, timed.
	consume := func(rec *stepRecord, id omnicache.StepID) (int64, error) {
		if !o.Verify && len(rec.hits) == 0 {
			rg := region("discard")
			t := time.Now()
			err := c.Discard(id)
			ns := r.since(t)
			endRegion(rg)
			rep.Discarded++
			rep.ConsumeNsTotal += ns
			if err != nil {
				return ns, fmt.Errorf("step %d: discard: %w", rec.index, err)
			}
			return ns, nil
		}
		asked := rec.hits
		if o.Verify {
			asked = rec.ids
		}
		out2.hand(rec, id, asked)
		if !o.MaterializeOnEngine {
			return 0, nil
		}
		_, ns, err := out2.wait(ver)
		rep.ConsumeNsTotal += ns
		return ns, err
	}

	for {
		before := s.Finished
		st, err := s.Next()
		if err != nil {
			return err
		}
		if st == nil {
			break
		}
		if o.OnStep != nil {
			o.OnStep(st)
		}
		if ver != nil && len(st.Plan.Replaced) > 0 {
			// Check what was delivered before the replacement first: a
			// Materialize in flight may or may not see it.
			if _, _, err := out2.wait(ver); err != nil {
				return err
			}
			ver.replaced(st)
		}
		rg := region("begin")
		tb := time.Now()
		err = c.Begin(&st.Plan)
		beginNs := r.since(tb)
		endRegion(rg)
		if err != nil {
			return fmt.Errorf("step %d: begin: %w", st.Index, err)
		}
		s.Release()

		// The forward: its outputs, produced on the device or in host
		// memory (verification work is not cache time either), then the
		// held model time.
		if douts != nil {
			if err := douts.take(out.Tensors, st.Tokens); err != nil {
				return fmt.Errorf("step %d: %w", st.Index, err)
			}
			var produce func([][]byte)
			if ver != nil {
				produce = func(bufs [][]byte) { ver.produce(s, st, bufs) }
			}
			if err := douts.fill(out.Tensors, st.Tokens, st.Index, produce); err != nil {
				return fmt.Errorf("step %d: %w", st.Index, err)
			}
		} else {
			bufs := pool.get(st.Tokens).slices(st.Tokens, rowBytes)
			if ver != nil {
				ver.produce(s, st, bufs)
			}
			for k := range out.Tensors {
				out.Tensors[k] = omnicache.Tensor{Host: bufs[k], Rows: st.Tokens, Owned: !o.NotOwned}
			}
		}
		var holdNs int64
		if o.Hold {
			holdNs = holdFor(r.holdTime(st), o.HoldSpin)
		}
		out.Tokens, out.Padded = st.Tokens, st.Tokens
		out.Accepted = nil
		if st.RowH != nil {
			out.Accepted = st.Accepted // speculative decoding
		}
		cur := &ring[st.Index%len(ring)]
		cur.set(st)

		// The output goroutine's Materialize of the step before the
		// previous one overlaps this forward: wait for it here.
		outputNs, _, err := out2.wait(ver)
		if err != nil {
			return err
		}
		stallNs := outputNs
		if o.Pace {
			if !st.PureDecode && saved > 0 {
				tw := time.Now()
				if err := c.Sync(); err != nil {
					return fmt.Errorf("step %d: pacing sync: %w", st.Index, err)
				}
				stallNs += time.Since(tw).Nanoseconds()
			}
			stallNs += r.pace(c, depth)
		}
		rg = region("save")
		ts := time.Now()
		id, err := c.Save(&out)
		saveNs := r.since(ts)
		endRegion(rg)
		if err != nil {
			return fmt.Errorf("step %d: save: %w", st.Index, err)
		}
		if saved == 0 {
			// What the cache adds before the first request is served: New,
			// then the first step's Begin and Save (the simulator's own
			// work and the forward are not the cache's).
			rep.FirstRequestNs = newNs + beginNs + saveNs
		}
		saved++
		s.Advance()

		var consumeNs int64
		if prev != nil {
			if consumeNs, err = consume(prev, prevID); err != nil {
				return err
			}
		}
		prev, prevID = cur, id

		rep.BeginNsTotal += beginNs
		rep.SaveNsTotal += saveNs
		rep.StallNs += stallNs
		if stallNs > 0 {
			rep.StallSteps++
		}
		r.account(st, StepSample{BeginNs: beginNs, SaveNs: saveNs, ConsumeNs: consumeNs, StallNs: stallNs, OutputWaitNs: outputNs, HoldNs: holdNs})
		r.progress(before)
	}
	// The tail: no forward is left to hide the output goroutine's work, so
	// its waits are backlog; the last step's Discard is engine time.
	tail := func() error {
		ns, _, err := out2.wait(ver)
		rep.StallNs += ns
		rep.BacklogNs += ns
		rep.OutputBacklogNs += ns
		return err
	}
	if err := tail(); err != nil {
		return err
	}
	if prev != nil {
		ns, err := consume(prev, prevID)
		if err != nil {
			return err
		}
		if n := len(r.engine); n > 0 {
			r.engine[n-1] += ns
			if o.KeepSamples {
				rep.Samples[n-1].EngineNs += ns
				rep.Samples[n-1].ConsumeNs += ns
			}
		}
		if err := tail(); err != nil {
			return err
		}
	}
	ts := time.Now()
	if err := c.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	rep.SyncNs = time.Since(ts).Nanoseconds()
	if ver != nil {
		if err := ver.checkMirror(c, s.Steps); err != nil {
			return err
		}
		rep.VerifiedRows = ver.rows
		rep.VerifyFailures = ver.failures
		rep.VerifyRepeated, rep.VerifyMissing = ver.repeated, ver.missing
		rep.Failures = ver.kept
	}
	st := c.Stats()
	rep.Stats = &st
	rep.ProcessRSSBytes, rep.ProcessPeakRSSBytes = processRSS()
	closed = true
	out2.stop()
	if err := c.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	rep.DtoHBytes = meter.dtoh.Load()
	rep.StagingWaitNs = meter.waitNs.Load()
	rep.StagingWaits = meter.waits.Load()
	rep.PinnedBytes = meter.pinned.Load()
	if douts != nil {
		rep.OutputBuffers = douts.Allocated
		if n := douts.outstanding(); n > 0 {
			return fmt.Errorf("%w: %d of %d", errOutputsHeld, n, douts.Allocated)
		}
	}
	return nil
}

// region starts a trace region of the engine goroutine's calls when an
// execution trace is being taken (replay --exec-trace); nil otherwise.
func region(name string) *trace.Region {
	if !trace.IsEnabled() {
		return nil
	}
	return trace.StartRegion(context.Background(), name)
}

func endRegion(r *trace.Region) {
	if r != nil {
		r.End()
	}
}
