package omnicache_test

// FuzzCache drives the property test's engine (cache_property_test.go) from
// the fuzzer's bytes instead of a PRNG and checks the cache against the
// harness's model (cache_helpers_test.go): every materialized row, the
// whole mirror after Sync, the documented errors of misuse, and the budget
// and staging pages once everything is consumed.
//
// Run it with
//
//	go test -run '^$' -fuzz '^FuzzCache$' -fuzztime 30s .
//
// and replay one input, printing the steps it decodes to, with
//
//	FUZZ_TRACE=1 go test -run 'FuzzCache/<name>' -v .
//
// Input layout (every input is valid: a byte past the end reads as 0, and
// the run ends when the input is used up or after fuzzMaxSteps steps):
//
//	config  c0 flags: 0x01 decode buffer off, 0x02 tiny device budget,
//	           0x04 a deferred key, 0x08 staging pages of one step's tokens,
//	           0x10 no optional key, 0x20 tiny deferred chunk, 0x40 the tiny
//	           budget also holds the deferred clones of unconsumed steps,
//	           0x80 a lagging committer (every device Wait takes longer)
//	        c1 block size 1 + c1%8; 0x08 sparse steps (an omission byte
//	           follows each step's cons byte), 0x10 the deferred key is
//	           optional     c2 staging depth 2 + c2%3
//	        c3 blocks 4 + c3%13        c4 prefill chunk 1 + c4%8
//	        c5 initial tensor modes (bit 2k: key k on the device, 2k+1: owned)
//	step    ev  events: 0x01 arrival, 0x02 arrival hitting cached blocks,
//	            0x04 abort, 0x08 preempt, 0x10 resume (a byte follows: a hit
//	            on b%3 cached blocks), 0x20 streamed
//	            continuation, 0x40 tweak byte follows, 0x80 misuse byte follows
//	        [tweak] bits 0-5 toggle tensor modes (as c5), 0x40 hand a cached
//	            block to the next new tenant, 0x80 arrival hitting
//	            never-written blocks
//	        [misuse] bits 0-2 a bad call around Begin (misuse* constants),
//	            0x08 Materialize a request outside the step, 0x10 consume
//	            twice, 0x20 Sync and compare the mirror with the model,
//	            0x40 failing-call byte follows, 0x80 device byte follows
//	        [failing] (right after the misuse byte) bits 0-1 the step's
//	            plan made wrong first (badPlan*), bits 2-3 its outputs made
//	            wrong first (badSave*), 0x10 its forward fails after Begin
//	            (Abort, then Begin it again), 0x20 nil arguments first
//	            (Begin(nil), Save(nil), and for a step consumed now
//	            Materialize into a nil Result), 0x40 a running request's
//	            prompt is replaced from a position it computed (a byte
//	            follows: which request, which position), 0x80 decoding
//	            requests schedule drafts (a byte follows: how many, how many
//	            accepted)
//	        [device] 0x80: Close while every unconsumed step is being read
//	            (the run ends); else the device fails method (b&7)%7
//	            (gputest.Op) after (b>>3)&7 more calls, from this step on
//	        cons bits 0-1 consumption (now, late, discard, async), bits 2-3
//	            delay 1-4 steps (at most depth-1), bits 4-7 request subset
//	        [omit] (sparse steps only) bit k: the step omits key k when it
//	            is optional (a zero Tensor{}); 0x80: Save first with the
//	            required hidden key omitted (ErrOutputs, changes nothing)
//	        then one parameter byte per choice the events need, in order.

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/gputest"
)

const (
	fuzzMaxSteps    = 48
	fuzzTokenBudget = 16 // tokens per step
	fuzzMaxRunning  = 4
)

// fuzzIn reads the fuzzer's bytes; past the end every byte is 0.
type fuzzIn struct{ b []byte }

func (in *fuzzIn) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	x := in.b[0]
	in.b = in.b[1:]
	return x
}

// intn picks one of n choices (0 when n ≤ 1, without reading).
func (in *fuzzIn) intn(n int) int {
	if n <= 1 {
		return 0
	}
	return int(in.byte()) % n
}

func (in *fuzzIn) empty() bool { return len(in.b) == 0 }

// pick takes k distinct entries of from (in an order the input chooses).
func (in *fuzzIn) pick(from []int32, k int) []int32 {
	rest := append([]int32(nil), from...)
	var out []int32
	for ; k > 0 && len(rest) > 0; k-- {
		j := in.intn(len(rest))
		out = append(out, rest[j])
		rest = append(rest[:j], rest[j+1:]...)
	}
	return out
}

// tensorModes are the output tensors' modes per key, toggled by the input;
// with sparse, every step reads which optional keys it omits.
type tensorModes struct {
	dev, own, optional []bool
	sparse             bool
}

// omit decodes a step's omission byte: the optional keys it omits.
func (m *tensorModes) omit(b byte) []bool {
	om := make([]bool, len(m.optional))
	for k := range om {
		om[k] = k < 7 && m.optional[k] && b>>k&1 == 1
	}
	return om
}

func (m *tensorModes) toggle(bits byte) {
	for k := range m.dev {
		if k >= 3 {
			break
		}
		m.dev[k] = m.dev[k] != (bits>>(2*k)&1 == 1)
		m.own[k] = m.own[k] != (bits>>(2*k+1)&1 == 1)
	}
}

type fuzzSetup struct {
	cfg   omnicache.Config
	lim   engineLimits
	modes tensorModes
}

// fuzzReadAhead is a read-ahead budget that holds some hit steps'
// prefetch buffers and not others.
const fuzzReadAhead = 1024

func fuzzConfig(in *fuzzIn) fuzzSetup {
	c0 := in.byte()
	c1 := in.byte()
	bs := 1 + int(c1)%8
	depth := 2 + int(in.byte())%3
	blocks := 4 + int(in.byte())%13
	cb := in.byte()
	chunk := 1 + int(cb)%8

	keys := []omnicache.Key{keyHidden}
	if c0&0x10 == 0 {
		keys = append(keys, keyAux)
	}
	if c0&0x04 != 0 {
		codes := keyCodes
		if c1&0x10 != 0 {
			codes = keyCodesOpt
		}
		keys = append(keys, codes)
	}
	dev := gputest.NewFaulty(gpu.NewHost())
	if c0&0x80 != 0 {
		dev.DelayWaits(50 * time.Microsecond) // the committer lags behind the engine
	}
	cfg := omnicache.Config{
		Device:              dev,
		NumBlocks:           blocks,
		BlockSize:           bs,
		Keys:                keys,
		StagingDepth:        depth,
		StagingClaimTimeout: 5 * time.Second, // a leaked page fails before the deadlock detector
		DisableDecodeBuffer: c0&0x01 != 0,
	}
	if c0&0x08 != 0 {
		cfg.StagingCapacityTokens = fuzzTokenBudget
	}
	if c0&0x02 != 0 {
		// Room for the largest step's reservations (immediate clones and
		// deferred clones) and no more: every further charge forces a
		// pending write out. With 0x40, also room for the deferred clones
		// of the depth-1 steps that may stay unconsumed (a Save that finds
		// the budget pinned by unconsumed steps fails, and the run stops).
		def, imm := rowBytes(cfg)
		cfg.DeviceBudgetBytes = fuzzTokenBudget * (def + imm)
		if c0&0x40 != 0 {
			cfg.DeviceBudgetBytes += int64(depth-1) * fuzzTokenBudget * def
		}
	}
	if c0&0x20 != 0 {
		cfg.DeferredChunkBytes = 2 * int64(keyCodes.RowBytes)
	}
	switch cb >> 3 % 3 {
	case 1:
		cfg.DisablePrefetch = true // hits read at Materialize
	case 2:
		cfg.ReadAheadBytes = fuzzReadAhead // some hit steps do not fit: read at Materialize
	}
	s := fuzzSetup{
		cfg: cfg,
		lim: engineLimits{
			blocks:      blocks,
			bs:          bs,
			stride:      testStride,
			tokenBudget: fuzzTokenBudget,
			chunk:       chunk,
			maxRunning:  fuzzMaxRunning,
		},
		modes: tensorModes{dev: make([]bool, len(keys)), own: make([]bool, len(keys)), sparse: c1&0x08 != 0},
	}
	for _, k := range keys {
		s.modes.optional = append(s.modes.optional, k.Optional)
	}
	s.modes.toggle(in.byte())
	return s
}

// Arrival kinds.
const (
	arriveMiss = iota
	arriveHit
	arriveBogus // hits blocks of which at least one was never written
)

// fuzzArrive admits a new request shaped by the input and schedules its
// first chunk; it returns the token budget left.
func (e *propEngine) fuzzArrive(act *propAction, in *fuzzIn, kind, budget int) int {
	if len(e.running) >= e.lim.maxRunning || budget <= 0 {
		return budget
	}
	p1, p2 := in.byte(), in.byte()
	maxTotal := min(e.lim.stride, e.lim.blocks) * e.bs
	prompt := 1 + int(p1&0x7f)%min(20, maxTotal-1)
	total := prompt + 1 + int(p2)%min(12, maxTotal-prompt)
	maxK := (prompt - 1) / e.bs // a hit leaves at least one token to compute
	var hit []int32
	switch kind {
	case arriveHit:
		hb := e.hittable()
		if k := min(len(hb), maxK); k > 0 {
			hit = in.pick(hb, 1+in.intn(k))
		}
	case arriveBogus:
		never := e.neverWritten()
		if len(never) == 0 || maxK == 0 {
			break
		}
		cand := append(e.hittable(), never...)
		hit = in.pick(cand, 1+in.intn(min(len(cand), maxK)))
		bogus := false
		for _, b := range hit {
			bogus = bogus || !e.written[b]
		}
		if !bogus {
			hit[in.intn(len(hit))] = never[in.intn(len(never))]
		}
		e.bogus++
	}
	r := e.admit(act, prompt, total, hit)
	if r == nil {
		return budget
	}
	listed := len(hit) > 0 || p1&0x80 == 0
	return e.start(act, r, len(hit), listed, budget)
}

// reuseCached moves a cached free block to the front of the free list: the
// next allocation hands it to a new tenant.
func (e *propEngine) reuseCached(in *fuzzIn) {
	var cached []int
	for i, b := range e.free {
		if e.filled[b] == e.bs {
			cached = append(cached, i)
		}
	}
	if len(cached) == 0 {
		return
	}
	i := cached[in.intn(len(cached))]
	b := e.free[i]
	e.free = append(e.free[:i], e.free[i+1:]...)
	e.free = append([]int32{b}, e.free...)
	e.reuses++
}

// fuzzNext generates one step from the input.
func (e *propEngine) fuzzNext(in *fuzzIn, modes *tensorModes) propAction {
	var act propAction
	ev := in.byte()
	var tweak, misuse byte
	if ev&0x40 != 0 {
		tweak = in.byte()
	}
	var failing byte
	if ev&0x80 != 0 {
		misuse = in.byte()
		if misuse&0x40 != 0 {
			failing = in.byte()
		}
	}
	cons := in.byte()
	var omit byte
	if modes.sparse {
		omit = in.byte()
	}

	e.finishComplete(&act)
	if ev&0x04 != 0 {
		if live := e.live(); len(live) > 0 {
			e.abort(&act, live[in.intn(len(live))])
		}
	}
	if ev&0x08 != 0 && len(e.running) > 0 {
		e.preempt(&act, e.running[in.intn(len(e.running))])
	}
	if tweak&0x40 != 0 {
		e.reuseCached(in)
	}
	if ev&0x10 != 0 && len(e.preempted) > 0 && len(e.running) < e.lim.maxRunning {
		e.resume(&act, int(in.byte()%3)) // a hit on 0, 1 or 2 cached blocks
	}
	if failing&0x40 != 0 && len(e.running) > 0 {
		b := int(in.byte())
		e.replace(&act, e.running[b%len(e.running)], b>>2)
	}
	if failing&0x80 != 0 {
		b := int(in.byte())
		for j, id := range e.running {
			e.spec[id] = [2]int{1 + (b+j)%3, (b>>2 + j) % 4}
		}
	}
	budget := e.scheduleRunning(&act)
	clear(e.spec)
	if ev&0x20 != 0 && len(act.st.Sched) > 0 {
		e.continuation(&act, in.intn(len(act.st.Sched)))
	}
	if ev&0x01 != 0 || len(e.running) == 0 {
		budget = e.fuzzArrive(&act, in, arriveMiss, budget)
	}
	if ev&0x02 != 0 {
		budget = e.fuzzArrive(&act, in, arriveHit, budget)
	}
	if tweak&0x80 != 0 {
		e.fuzzArrive(&act, in, arriveBogus, budget)
	}
	e.endStep(&act)

	modes.toggle(tweak)
	act.devKeys = append([]bool(nil), modes.dev...)
	act.ownKeys = append([]bool(nil), modes.own...)
	act.omitKeys = modes.omit(omit)
	act.mode = int(cons & 3)
	act.delay = 1 + int(cons>>2&3)
	if mask := cons >> 4; mask != 0 && len(act.st.Sched) > 1 {
		// A subset, in reverse batch order.
		for j := len(act.st.Sched) - 1; j >= 0; j-- {
			if mask>>(j%4)&1 == 1 {
				act.reqs = append(act.reqs, act.st.Sched[j].ID)
			}
		}
	}
	act.misuse = int(misuse&7) % numMisuse
	act.outside = misuse&0x08 != 0
	act.twice = misuse&0x10 != 0
	act.check = misuse&0x20 != 0
	if misuse&0x40 != 0 {
		b := failing
		act.badPlan, act.badSave = int(b&3), int(b>>2&3)
		act.abortRetry = b&0x10 != 0
		act.nilArgs = b&0x20 != 0
	}
	if omit&0x80 != 0 && act.badSave == badSaveNone {
		act.badSave = badSaveOmitRequired
	}
	if misuse&0x80 != 0 {
		b := in.byte()
		if b&0x80 != 0 {
			act.closeNow = true
		} else {
			act.fault, act.faultN = 1+int(b&7)%int(gputest.NumOps), int(b>>3&7)
		}
	}
	return act
}

func FuzzCache(f *testing.F) {
	// A few shapes to start from; testdata/fuzz/FuzzCache holds more.
	f.Add([]byte{})
	f.Add([]byte{0x04, 3, 0, 11, 7, 0x15, 0x03, 0x01, 12, 5, 9, 3, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 18, 4, 0})
	f.Add([]byte{0x07, 0, 1, 6, 1, 0x3f, 0x01, 0x01, 30, 30, 0x01, 0x03, 40, 40, 0, 0x02, 0x02, 40, 0, 0, 0})
	// Forwards failing after Begin (failing byte 0x10): a step with a hit
	// arrival and a decode step are aborted and begun again.
	f.Add([]byte{0x07, 0, 1, 6, 1, 0x3f, 0x83, 0x40, 0x01, 0x00, 0x03, 0x10, 0x1e, 0x10, 0x00, 0x01, 0x80, 0x40, 0x03, 0x10, 0x28, 0x02, 0x00, 0x10, 0x40, 0x83})
	// Sparse steps with an optional deferred key: omissions of aux and
	// codes on prefill, decode and hit steps, and a required key omitted.
	f.Add([]byte{0x04, 0x1b, 0, 11, 7, 0x15, 0x01, 0x01, 0x02, 12, 5, 0x00, 0x00, 0x04, 0x00, 0x00, 0x06, 0x00, 0x00, 0x82,
		0x02, 0x00, 0x02, 18, 4, 0, 0x00, 0x00, 0x80, 0x00, 0x00, 0x06, 0x40, 0x40, 0x00, 0x01, 0x02, 30, 30, 0, 0x00, 0x00, 0x04})
	// Replaced prompts and drafts (failing byte 0x40 and 0x80, after the
	// misuse byte 0x40), among arrivals and decode steps.
	f.Add([]byte{0x04, 3, 0, 11, 7, 0x15, 0x01, 0x01, 12, 5, 0x01, 0x00, 0x80, 0x40, 0xc0, 0x07, 0x1d, 0x00, 0x80, 0x40, 0x80, 0x33, 0x00,
		0x80, 0x40, 0x40, 0x05, 0x00, 0x80, 0x40, 0xc0, 0x0b, 0x2e, 0x00, 0x00, 0x00, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzIn{b: data}
		s := fuzzConfig(in)
		e := newEngine(s.lim, len(s.cfg.Keys))
		h := newHarness(t, s.cfg)
		h.stride = s.lim.stride
		run := &propRun{h: h, maxDelay: s.cfg.StagingDepth - 1, pinnedBudget: true}
		for i := 0; i < fuzzMaxSteps && !in.empty() && run.broken == nil; i++ {
			act := e.fuzzNext(in, &s.modes)
			if os.Getenv("FUZZ_TRACE") != "" {
				t.Logf("step %d: %+v mode %d delay %d reqs %v omit %v misuse %d outside %v twice %v check %v badSave %d abort %v", i, act.st, act.mode, act.delay, act.reqs, act.omitKeys, act.misuse, act.outside, act.twice, act.check, act.badSave, act.abortRetry)
			}
			run.apply(act)
		}
		if run.dead {
			t.Logf("run ended early: %v", run.broken) // its checks ran
			return
		}
		if last := e.drainAll(); len(last.st.Finished) > 0 {
			run.apply(last)
		}
		run.finish()

		st := h.stats()
		t.Logf("config: %d blocks of %d, depth %d, keys %d, buffer off %v, budget %d; schedule: %d steps, %d requests, %d hits (%d bogus), %d pure decode steps, %d preemptions, %d resumes (%d with a hit), %d replaces, %d rejected drafts, %d aborts, %d continuations, %d reuses, %d step aborts; cache: %d buffered steps, %d flushes, %d budget flushes, %d deferred writes, %d rows skipped",
			s.cfg.NumBlocks, s.cfg.BlockSize, s.cfg.StagingDepth, len(s.cfg.Keys), s.cfg.DisableDecodeBuffer, st.BudgetLimit,
			e.steps, e.nextID-1, e.hits, e.bogus, e.pureSteps, e.preempts, e.resumes, e.resumeHits, e.replaces, e.drafts, e.aborts, e.continued, e.reuses, run.stepAborts,
			st.BufferedSteps, st.BufferFlushes, st.BudgetFlushes, st.DeferredWrites, st.RowsSkipped)
		assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
		assert.Zero(t, st.PagesInUse, "Stats.PagesInUse once every step is consumed")
		assert.Zero(t, st.LiveRequests, "Stats.LiveRequests once every request finished")
		assert.EqualValues(t, h.nsteps, st.Steps, "Stats.Steps")
		if run.broken != nil {
			t.Logf("run stopped early: %v", run.broken)
			return
		}
		assert.Equal(t, e.hits, st.HitRequests, "Stats.HitRequests")
		assert.Equal(t, e.hitTokens, st.HitTokens, "Stats.HitTokens")
	})
}
