package cachetest

// Runner: applies the model engine's actions to the cache and checks what it serves.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

type lateMat struct {
	id    omnicache.StepID
	reqs  []int64
	async bool
	done  chan error
	res   *omnicache.Result
	due   int // consumed after the Save of this step (runner's index)
}

// absentRequired reports whether the hit prefix of reqs (nil: all) of step
// id covers a row of a required key that no step had written when the step
// was saved: its read must fail.
func (h *Harness) absentRequired(id omnicache.StepID, reqs []int64) bool {
	for _, rw := range h.want(id).reqs {
		if reqs != nil && !slices.Contains(reqs, rw.id) {
			continue
		}
		for k, key := range h.Cfg.Keys {
			if key.Optional || rw.prefix == nil {
				continue
			}
			for _, g := range rw.prefix[k] {
				if g == 0 {
					return true
				}
			}
		}
	}
	return false
}

// materializeNow materializes step id right after its Save: the rows must be
// exactly the step's rows, unless a hit covers never-written rows of a
// required key (ErrAbsentRequired; ErrReassigned where such a row is a
// rejected draft: the rejection made it stale).
func materializeNow(h *Harness, id omnicache.StepID, reqs []int64) {
	h.T.Helper()
	if !h.absentRequired(id, reqs) {
		h.Mat(id, reqs...)
		return
	}
	err := h.MatCall(id, reqs, &h.Res)
	if !(h.rejectedFrom(id, reqs) && errors.Is(err, omnicache.ErrReassigned)) {
		require.ErrorIs(h.T, err, omnicache.ErrAbsentRequired, "%sMaterialize(%v, %v): the hit covers never-written rows of a required key", h.prefix(), id, reqs)
	}
	h.checkServed(id, reqs, &h.Res, err, "immediate")
}

// consume finishes a late or asynchronous Materialize: ErrReassigned is
// allowed only if a hit slot was rewritten since the step; a hit over
// never-written rows of a required key must fail (ErrAbsentRequired, or
// ErrReassigned once rewritten); otherwise the rows must be exactly the
// Step's (original) rows.
func consume(h *Harness, l lateMat) {
	h.T.Helper()
	var err error
	res := l.res
	if l.async {
		err = Guard(h.T, fmt.Sprintf("asynchronous Materialize(%v)", l.id), func() error { return <-l.done })
		h.dmu.Lock()
		h.consumed[l.id] = true
		delete(h.asyncOpen, l.id)
		h.dmu.Unlock()
		h.asyncVerify = true
		defer func() { h.asyncVerify = false }()
	} else {
		res = &h.Res
		err = h.MatCall(l.id, l.reqs, res)
	}
	if h.checkServed(l.id, l.reqs, res, err, "late") {
		h.reassigned[h.want(l.id).ord] = true
	}
}

// checkServed checks a Materialize of reqs (nil: all) of step id that
// returned err into res, request by request: a request whose hit covers
// never-written rows of a required key must fail with ErrAbsentRequired;
// one whose hit slots were rewritten since may fail with ErrReassigned
// only where the cache may not have preserved them (prefetch off, or a
// read-ahead budget that may not have held the step); every other request
// is served exactly, failed or not its neighbours. It reports whether a
// request failed with ErrReassigned.
func (h *Harness) checkServed(id omnicache.StepID, reqs []int64, res *omnicache.Result, err error, what string) (reassigned bool) {
	h.T.Helper()
	var re *omnicache.RequestError
	if err != nil && !errors.As(err, &re) {
		h.T.Fatalf("%s%s Materialize(%v, %v): %v", h.prefix(), what, id, reqs, err)
	}
	failed := map[int64]error{}
	if re != nil {
		require.Equal(h.T, id, re.Step)
		for i, rid := range re.IDs {
			failed[rid] = re.Errs[i]
		}
	}
	for _, rw := range h.want(id).reqs {
		if reqs != nil && !slices.Contains(reqs, rw.id) {
			continue
		}
		one := []int64{rw.id}
		absent := h.absentRequired(id, one)
		mayMove := h.RewrittenSince(id, one) && h.mayReassign()
		ferr := failed[rw.id]
		switch {
		case ferr == nil:
			require.False(h.T, absent, "%s%s Materialize(%v): request %d served over never-written rows of a required key", h.prefix(), what, id, rw.id)
		case mayMove && errors.Is(ferr, omnicache.ErrReassigned):
			reassigned = true
		case absent && h.rejectedFrom(id, one) && errors.Is(ferr, omnicache.ErrReassigned):
			// A never-written hit slot that the step itself (or a later
			// one) wrote with a rejected draft: the rejection made it
			// stale, which the read meets first.
		case absent:
			require.ErrorIs(h.T, ferr, omnicache.ErrAbsentRequired, "%s%s Materialize(%v): request %d", h.prefix(), what, id, rw.id)
		default:
			h.T.Fatalf("%s%s Materialize(%v): request %d failed (hit slots rewritten since: %v, the cache may let them move: %v): %v",
				h.prefix(), what, id, rw.id, h.RewrittenSince(id, one), h.mayReassign(), ferr)
		}
	}
	require.NoError(h.T, h.VerifyServed(id, reqs, res, failed))
	h.CheckConsumed(id)
	return reassigned
}

// mayReassign reports whether a late read may find its hit rows moved:
// only without prefetch, or with a read-ahead budget too small to hold
// every hit step's buffers (such a step is read at Materialize).
func (h *Harness) mayReassign() bool {
	return h.Cfg.DisablePrefetch || (h.Cfg.ReadAheadBytes > 0 && h.Cfg.ReadAheadBytes < 1<<20)
}

// Runner applies actions to one harness, step by step.
type Runner struct {
	h        *Harness
	maxDelay int // cap on Action.delay: at most maxDelay steps stay unconsumed across a Save
	i        int
	late     []lateMat
	// pinnedBudget tolerates a Save failing with ErrBudget when the device
	// bytes that unconsumed steps may pin (see pinnedBound) and the step's
	// need exceed the budget: the run is then broken and must stop.
	pinnedBudget bool
	broken       error
	refinish     []int64 // finished by a step whose Save failed: finished again by the next
	dead         bool    // the cache failed or closed on purpose: the run ended
	stepAborts   int     // begun steps aborted (Action.abortRetry) and begun again
}

// outsideID is a request id no schedule uses.
const outsideID int64 = 1 << 40

// NewRunner returns a runner of actions on h. At most maxDelay steps stay
// unconsumed across a Save (a late or asynchronous read is consumed by
// then; at least 1). With pinnedBudget a Save may fail with ErrBudget where
// the device bytes that unconsumed steps may pin and the step's need exceed
// the budget (a tiny budget): the run then stops (Broken).
func NewRunner(h *Harness, maxDelay int, pinnedBudget bool) *Runner {
	return &Runner{h: h, maxDelay: maxDelay, pinnedBudget: pinnedBudget}
}

// Broken is why the run stopped before its actions ran out (nil: it did
// not): a Save failed with ErrBudget (pinnedBudget), the device failed,
// or the cache was closed during reads.
func (r *Runner) Broken() error { return r.broken }

// Dead reports whether the run ended with the cache failed or closed on
// purpose (its checks ran): no action may follow, Finish included.
func (r *Runner) Dead() bool { return r.dead }

// StepAborts is how many begun steps were aborted and begun again.
func (r *Runner) StepAborts() int { return r.stepAborts }

// RunAll applies acts to h, one after the other, with every late read
// consumed a step later, then Finish; it returns the run's Capture.
func RunAll(h *Harness, acts []Action) Capture {
	h.T.Helper()
	h.Stride = Stride
	r := NewRunner(h, 1, false)
	for _, act := range acts {
		r.Apply(act)
	}
	r.Finish()
	return h.Capture()
}

// Apply runs one action: Begin, Save, the due late reads, this step's
// consumption, and the checks.
func (r *Runner) Apply(act Action) {
	h := r.h
	h.T.Helper()
	i := r.i
	r.i++
	if len(r.refinish) > 0 {
		act.Step.Finished = append(slices.Clone(r.refinish), act.Step.Finished...)
		r.refinish = nil
	}
	for _, fb := range act.failed {
		r.failBegin(fb) // before the step's own table changes: it was drawn from the state before them
	}
	h.applyTable(act.unassign, act.assign, act.bump)
	h.DevKeys, h.OwnKeys, h.OmitKeys = act.devKeys, act.ownKeys, act.omitKeys
	if act.fault > 0 {
		r.faultStep(act)
		return
	}
	if act.closeNow {
		r.closeMidReads()
		return
	}
	r.misuseBefore(act.misuse)
	r.badPlanFirst(act)
	if act.nilArgs {
		before := h.Stats()
		require.ErrorIs(h.T, h.BeginPlan(nil), omnicache.ErrPlan, "%sBegin(nil)", h.prefix())
		r.unchanged("Begin(nil)", before)
	}
	err := h.TryBegin(act.Step)
	require.NoError(h.T, err, "%sBegin of step %d", h.prefix(), i)
	if act.nilArgs {
		_, err := h.TrySave(nil)
		require.ErrorIs(h.T, err, omnicache.ErrOutputs, "%sSave(nil)", h.prefix())
		require.NoError(h.T, h.TryBegin(act.Step), "%sBegin of step %d again after Save(nil)", h.prefix(), i)
	}
	if r.badSaveFirst(act) {
		require.NoError(h.T, h.TryBegin(act.Step), "%sBegin of step %d again after its failed Save", h.prefix(), i)
	}
	if act.abortRetry {
		// The forward failed: the cache returns to before this Begin
		// (and the model with it), and the engine retries the
		// step; its rows and hits must come out as if it never failed.
		h.AbortBegun()
		r.stepAborts++
		require.NoError(h.T, h.TryBegin(act.Step), "%sBegin of step %d again after Abort", h.prefix(), i)
	}
	if act.misuse == misuseBeginTwice {
		err := h.BeginPlan(&omnicache.Plan{Stride: h.Stride})
		require.ErrorIs(h.T, err, omnicache.ErrSequence, "%sBegin twice (step %d)", h.prefix(), i)
	}
	ps := h.pending
	sid, err := h.TrySave(h.Outs())
	if err != nil && r.pinnedBudget && errors.Is(err, omnicache.ErrBudget) {
		pinned, need := r.pinnedBound(ps), r.needBound(ps)
		require.Greater(h.T, pinned+need, h.Cfg.DeviceBudgetBytes,
			"%sSave of step %d failed (%v) although unconsumed steps pin at most %d device bytes and the step needs at most %d",
			h.prefix(), i, err, pinned, need)
		r.breakOn(ps, fmt.Errorf("Save of step %d: %w (unconsumed steps may pin %d bytes, the step needs up to %d)", i, err, pinned, need))
		return
	}
	require.NoError(h.T, err, "%sSave of step %d", h.prefix(), i)
	r.consumeDue(i)

	if act.outside {
		err := h.MatCall(sid, []int64{outsideID}, &h.Res)
		require.ErrorIs(h.T, err, omnicache.ErrNotInStep, "%sMaterialize(%v) of a request outside the step", h.prefix(), sid)
	}
	reqs := reqList(act.reqs)
	due := i + min(max(act.delay, 1), max(r.maxDelay, 1))
	switch act.mode {
	case matNow:
		if act.nilArgs {
			err := h.MatCall(sid, reqs, nil)
			require.ErrorIs(h.T, err, omnicache.ErrOutputs, "%sMaterialize(%v) into a nil Result", h.prefix(), sid)
		}
		materializeNow(h, sid, reqs) // still unconsumed: every row checked

	case matLate:
		r.late = append(r.late, lateMat{id: sid, reqs: reqs, due: due})
	case matDiscard:
		h.Discard(sid)
	case matAsync:
		l := lateMat{id: sid, reqs: reqs, async: true, done: make(chan error, 1), res: new(omnicache.Result), due: due}
		h.dmu.Lock()
		h.asyncOpen[sid] = true
		h.dmu.Unlock()
		go func(c *omnicache.Cache) { l.done <- c.Materialize(l.id, l.reqs, l.res) }(h.C)
		r.late = append(r.late, l)
	}
	if act.twice && (act.mode == matNow || act.mode == matDiscard) {
		err := h.MatCall(sid, reqs, &h.Res)
		require.ErrorIs(h.T, err, omnicache.ErrUnknownStep, "%sMaterialize(%v) of a consumed step", h.prefix(), sid)
		require.ErrorIs(h.T, h.TryDiscard(sid), omnicache.ErrUnknownStep, "%sDiscard(%v) of a consumed step", h.prefix(), sid)
	}
	st := h.Stats()
	require.LessOrEqual(h.T, st.BudgetPeak, st.BudgetLimit, "%sStats.BudgetPeak after step %d", h.prefix(), i)
	require.LessOrEqual(h.T, st.PagesInUse, max(h.Cfg.StagingDepth, omnicache.DefaultStagingDepth), "%sStats.PagesInUse", h.prefix())
	if act.check {
		h.CheckMirror()
	}
}

// consumeDue consumes the late and asynchronous reads due by step i.
func (r *Runner) consumeDue(i int) {
	keep := r.late[:0]
	for _, l := range r.late {
		if l.due <= i {
			consume(r.h, l)
		} else {
			keep = append(keep, l)
		}
	}
	clear(r.late[len(keep):])
	r.late = keep
}

// rowBytes sums the row bytes of the deferred keys and of the immediate
// keys.
func rowBytes(cfg omnicache.Config) (deferred, immediate int64) {
	for _, k := range cfg.Keys {
		if k.Deferred {
			deferred += int64(k.RowBytes)
		} else {
			immediate += int64(k.RowBytes)
		}
	}
	return deferred, immediate
}

// pinnedBound bounds the device bytes that unconsumed steps may keep
// charged however the cache forces writes out: a step record pins its own
// deferred clones and the deferred clones its hits read while in transit
// (at most the clones of the steps that last wrote the hit slots), and an
// asynchronous read in flight may hold parked decode rows.
func (r *Runner) pinnedBound(ps *pendingStep) int64 {
	h := r.h
	def, imm := rowBytes(h.Cfg)
	seen := map[int]bool{}
	var b int64
	add := func(ord int) {
		if ord > 0 && !seen[ord] {
			seen[ord] = true
			b += int64(h.tokensAt[ord]) * def
		}
	}
	// The step being saved is not consumed either: its hit plan (made at
	// Begin) pins the deferred clones its hit rows come from while they
	// are in transit.
	if ps != nil {
		for _, hs := range ps.hits {
			for _, sl := range hs {
				if sl >= 0 && int(sl) < len(h.writtenAt) {
					add(h.writtenAt[sl])
				}
			}
		}
	}
	for _, l := range r.late {
		sw := h.want(l.id)
		add(sw.ord)
		for _, rw := range sw.reqs {
			for _, w := range rw.hitFrom {
				add(w)
			}
		}
		if l.async {
			b += int64(h.tokensAt[sw.ord]) * imm
		}
	}
	return b
}

// needBound bounds the device bytes the Save of ps reserves.
func (r *Runner) needBound(ps *pendingStep) int64 {
	def, imm := rowBytes(r.h.Cfg)
	n := 0
	for _, s := range ps.st.Sched {
		n += s.Count()
	}
	return int64(n) * (def + imm)
}

// breakOn ends a run whose Save failed: the slots the step scheduled may or
// may not have been written, so the model forgets them (and a delayed read
// of a hit on them may fail with ErrReassigned).
func (r *Runner) breakOn(ps *pendingStep, err error) {
	h := r.h
	r.broken = err
	// The failed Save undid its Begin: the requests it finished are live
	// again, and the next step (the drain) finishes them.
	r.refinish = append(r.refinish, ps.st.Finished...)
	for _, sl := range ps.slots {
		for _, s := range sl {
			if s >= 0 && int(s) < len(h.unknown) {
				h.unknown[s] = true
				h.writtenAt[s] = h.nsteps + 1
			}
		}
	}
}

// misuseBefore makes a call that must fail with its documented error and
// change nothing, before the step's Begin.
func (r *Runner) misuseBefore(kind int) {
	h := r.h
	bs := int32(h.Cfg.BlockSize)
	arrival := func(hit int32, blocks ...int32) *omnicache.Plan {
		return &omnicache.Plan{Stride: h.Stride, Arrivals: []int64{outsideID}, HitTokens: []int32{hit}, HitBlocks: blocks}
	}
	var (
		p    *omnicache.Plan
		want error
	)
	switch kind {
	case misuseNone, misuseBeginTwice:
		return
	case misuseUnalignedHit:
		if bs == 1 {
			p, want = arrival(1), omnicache.ErrHitBlocks
		} else {
			p, want = arrival(bs+1, 0, 1), omnicache.ErrUnalignedHit
		}
	case misuseNoHitBlocks:
		p, want = arrival(bs), omnicache.ErrHitBlocks
	case misuseExtraBlocks:
		p, want = arrival(bs, 0, 1), omnicache.ErrHitBlocks
	case misuseHitOutOfRange:
		p, want = arrival(bs, int32(h.Cfg.NumBlocks)), omnicache.ErrPlan
	case misuseNegativeStart:
		p = &omnicache.Plan{Stride: h.Stride, IDs: []int64{outsideID}, Rows: []int32{0}, Start: []int32{-1}, Count: []int32{1},
			Table: make([]int32, h.Stride)}
		want = omnicache.ErrPlan
	case misuseSaveFirst:
		res := Guard(h.T, h.prefix()+"Save", func() saveResult {
			id, err := h.C.Save(h.OutputsFor(Step{}))
			return saveResult{id, err}
		})
		require.ErrorIs(h.T, res.err, omnicache.ErrSequence, "%sSave without Begin", h.prefix())
		return
	default:
		panic(fmt.Sprintf("misuse kind %d", kind))
	}
	err := h.BeginPlan(p)
	require.ErrorIs(h.T, err, want, "%sBegin with misuse %d", h.prefix(), kind)
}

// Finish consumes what is still unconsumed and checks the whole mirror,
// deferred keys included.
func (r *Runner) Finish() {
	r.h.T.Helper()
	for _, l := range r.late {
		consume(r.h, l)
	}
	r.late = nil
	r.h.CheckMirror(r.h.AllKeys()...)
}
