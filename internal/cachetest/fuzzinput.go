package cachetest

// The fuzzer's driver of the model engine (FuzzCache): a config and a
// schedule decoded from bytes.

import (
	"fmt"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/gputest"
)

// FuzzMaxSteps bounds the steps one input decodes to.
const FuzzMaxSteps = 48

const (
	fuzzTokenBudget = 16 // tokens per step
	fuzzMaxRunning  = 4
)

// Input reads a fuzzer's bytes: a config (SetupFrom), then one step after
// another (Engine.NextFrom). Every input is valid: a byte past the end
// reads as 0, and a run ends when the input is used up (Empty) or after
// FuzzMaxSteps steps. The layout:
//
//	config  c0 flags: 0x01 decode buffer off, 0x02 tiny device budget,
//	           0x04 a deferred key, 0x08 staging pages of one step's tokens,
//	           0x10 no optional key, 0x20 tiny deferred chunk, 0x40 the tiny
//	           budget also holds the deferred clones of unconsumed steps,
//	           0x80 a lagging committer (every device Wait takes longer)
//	        c1 block size 1 + c1%8; 0x08 sparse steps (an omission byte
//	           follows each step's cons byte), 0x10 the deferred key is
//	           optional, 0x20 device rows copied straight into the
//	           mirror (MirrorDirect, every step)   c2 staging depth 2 + c2%3
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
//	            wrong first (badSave*), 0x10 a begun step fails (an abort
//	            byte follows: 0, the step's forward fails after Begin:
//	            Abort, then Begin it again; else another plan the engine
//	            could run now, drawn from a copy of it seeded with the
//	            byte, is begun first and abandoned: by Abort or by a Save
//	            that fails, failAbort..failSaveOmit by (b-1)%5), 0x20 nil
//	            arguments first
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
type Input struct{ b []byte }

// NewInput reads data.
func NewInput(data []byte) *Input { return &Input{b: data} }

// byte reads the next byte (0 past the end).
func (in *Input) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	x := in.b[0]
	in.b = in.b[1:]
	return x
}

// intn picks one of n choices (0 when n ≤ 1, without reading).
func (in *Input) intn(n int) int {
	if n <= 1 {
		return 0
	}
	return int(in.byte()) % n
}

// Empty reports whether the input is used up.
func (in *Input) Empty() bool { return len(in.b) == 0 }

// pick takes k distinct entries of from (in an order the input chooses).
func (in *Input) pick(from []int32, k int) []int32 {
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

// Setup is a decoded config: the cache's, the engine's limits, and the
// output tensors' modes the steps toggle.
type Setup struct {
	Config omnicache.Config // the cache's
	Limits Limits           // the engine's (NewEngine)
	modes  tensorModes
}

// fuzzReadAhead is a read-ahead budget that holds some hit steps'
// prefetch buffers and not others.
const fuzzReadAhead = 1024

// SetupFrom decodes the config bytes (c0 to c5) of in. The cache's device
// is a gputest.Faulty over the host device (the failing calls need it).
func SetupFrom(in *Input) *Setup {
	c0 := in.byte()
	c1 := in.byte()
	bs := 1 + int(c1)%8
	depth := 2 + int(in.byte())%3
	blocks := 4 + int(in.byte())%13
	cb := in.byte()
	chunk := 1 + int(cb)%8

	keys := []omnicache.Key{KeyHidden}
	if c0&0x10 == 0 {
		keys = append(keys, KeyAux)
	}
	if c0&0x04 != 0 {
		codes := KeyCodes
		if c1&0x10 != 0 {
			codes = KeyCodesOpt
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
		cfg.DeferredChunkBytes = 2 * int64(KeyCodes.RowBytes)
	}
	if c1&0x20 != 0 {
		// Every step with device rows is copied straight into the mirror
		// (and read back from the device until consumed): the budget must
		// hold depth+1 pages of them besides what the bits above left.
		cfg.MirrorDirect, cfg.MirrorDirectMinBytes = true, 1
		_, imm := rowBytes(cfg)
		page := int64(omnicache.DefaultStagingCapacityTokens) * imm
		if cap := cfg.StagingCapacityTokens; cap > 0 {
			page = int64(cap) * imm
		}
		if cfg.DeviceBudgetBytes > 0 {
			cfg.DeviceBudgetBytes += int64(depth+1) * page
		}
	}
	switch cb >> 3 % 3 {
	case 1:
		cfg.DisablePrefetch = true // hits read at Materialize
	case 2:
		cfg.ReadAheadBytes = fuzzReadAhead // some hit steps do not fit: read at Materialize
	}
	s := &Setup{
		Config: cfg,
		Limits: Limits{
			Blocks:      blocks,
			BlockSize:   bs,
			Stride:      Stride,
			TokenBudget: fuzzTokenBudget,
			Chunk:       chunk,
			MaxRunning:  fuzzMaxRunning,
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
func (e *Engine) fuzzArrive(act *Action, in *Input, kind, budget int) int {
	if len(e.running) >= e.lim.MaxRunning || budget <= 0 {
		return budget
	}
	p1, p2 := in.byte(), in.byte()
	maxTotal := min(e.lim.Stride, e.lim.Blocks) * e.bs
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
		e.Counts.Bogus++
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
func (e *Engine) reuseCached(in *Input) {
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
	e.Counts.Reuses++
}

// NextFrom generates one step from in (see Input for the layout), with
// the output modes of s, the config in was decoded to.
func (e *Engine) NextFrom(in *Input, s *Setup) Action {
	modes := &s.modes
	var act Action
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
	var abandon byte
	if failing&0x10 != 0 {
		abandon = in.byte()
	}
	cons := in.byte()
	var omit byte
	if modes.sparse {
		omit = in.byte()
	}
	if abandon != 0 {
		// drawn from the state before this step's changes
		act.failed = append(act.failed, e.abandoned(e.Counts.Steps, uint64(abandon)<<32|uint64(e.Counts.Steps), int(abandon-1)%numFail))
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
	if ev&0x10 != 0 && len(e.preempted) > 0 && len(e.running) < e.lim.MaxRunning {
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
	if ev&0x20 != 0 && len(act.Step.Sched) > 0 {
		e.continuation(&act, in.intn(len(act.Step.Sched)))
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
	if mask := cons >> 4; mask != 0 && len(act.Step.Sched) > 1 {
		// A subset, in reverse batch order.
		for j := len(act.Step.Sched) - 1; j >= 0; j-- {
			if mask>>(j%4)&1 == 1 {
				act.reqs = append(act.reqs, act.Step.Sched[j].ID())
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
		act.abortRetry = b&0x10 != 0 && abandon == 0
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

// String lists what the action does, for a trace of a fuzzer's input.
func (act Action) String() string {
	return fmt.Sprintf("%+v mode %d delay %d reqs %v omit %v misuse %d outside %v twice %v check %v badSave %d abort %v",
		act.Step, act.mode, act.delay, act.reqs, act.omitKeys, act.misuse, act.outside, act.twice, act.check, act.badSave, act.abortRetry)
}
