package omnicache_test

// propRun: applies the model engine's actions to the cache and checks what it serves.

import (
	"errors"
	"fmt"

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
func (h *harness) absentRequired(id omnicache.StepID, reqs []int64) bool {
	for _, rw := range h.want(id).reqs {
		if reqs != nil && !containsID(reqs, rw.id) {
			continue
		}
		for k, key := range h.cfg.Keys {
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

// checkConsumed checks that a step whose read failed is consumed: a later
// Discard fails with ErrUnknownStep (or succeeds, if the failed read left
// it unconsumed).
func checkConsumed(h *harness, id omnicache.StepID) {
	h.t.Helper()
	if err := h.tryDiscard(id); err != nil {
		require.ErrorIs(h.t, err, omnicache.ErrUnknownStep, "%sDiscard(%v) after a failed read", h.prefix(), id)
	}
}

// materializeNow materializes step id right after its Save: the rows must be
// exactly the step's rows, unless a hit covers never-written rows of a
// required key (ErrAbsentRequired).
func materializeNow(h *harness, id omnicache.StepID, reqs []int64) {
	h.t.Helper()
	if !h.absentRequired(id, reqs) {
		h.mat(id, reqs...)
		return
	}
	err := h.matCall(id, reqs, &h.res)
	require.ErrorIs(h.t, err, omnicache.ErrAbsentRequired, "%sMaterialize(%v, %v): the hit covers never-written rows of a required key", h.prefix(), id, reqs)
	h.checkServed(id, reqs, &h.res, err, "immediate")
}

// consume finishes a late or asynchronous Materialize: ErrReassigned is
// allowed only if a hit slot was rewritten since the step; a hit over
// never-written rows of a required key must fail (ErrAbsentRequired, or
// ErrReassigned once rewritten); otherwise the rows must be exactly the
// step's (original) rows.
func consume(h *harness, l lateMat) {
	h.t.Helper()
	var err error
	res := l.res
	if l.async {
		err = guard(h.t, fmt.Sprintf("asynchronous Materialize(%v)", l.id), func() error { return <-l.done })
		h.dmu.Lock()
		h.consumed[l.id] = true
		delete(h.asyncOpen, l.id)
		h.dmu.Unlock()
		h.asyncVerify = true
		defer func() { h.asyncVerify = false }()
	} else {
		res = &h.res
		err = h.matCall(l.id, l.reqs, res)
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
func (h *harness) checkServed(id omnicache.StepID, reqs []int64, res *omnicache.Result, err error, what string) (reassigned bool) {
	h.t.Helper()
	var re *omnicache.RequestError
	if err != nil && !errors.As(err, &re) {
		h.t.Fatalf("%s%s Materialize(%v, %v): %v", h.prefix(), what, id, reqs, err)
	}
	failed := map[int64]error{}
	if re != nil {
		require.Equal(h.t, id, re.Step)
		for i, rid := range re.IDs {
			failed[rid] = re.Errs[i]
		}
	}
	for _, rw := range h.want(id).reqs {
		if reqs != nil && !containsID(reqs, rw.id) {
			continue
		}
		one := []int64{rw.id}
		absent := h.absentRequired(id, one)
		mayMove := h.rewrittenSince(id, one) && h.mayReassign()
		ferr := failed[rw.id]
		switch {
		case ferr == nil:
			require.False(h.t, absent, "%s%s Materialize(%v): request %d served over never-written rows of a required key", h.prefix(), what, id, rw.id)
		case mayMove && errors.Is(ferr, omnicache.ErrReassigned):
			reassigned = true
		case absent:
			require.ErrorIs(h.t, ferr, omnicache.ErrAbsentRequired, "%s%s Materialize(%v): request %d", h.prefix(), what, id, rw.id)
		default:
			h.t.Fatalf("%s%s Materialize(%v): request %d failed (hit slots rewritten since: %v, the cache may let them move: %v): %v",
				h.prefix(), what, id, rw.id, h.rewrittenSince(id, one), h.mayReassign(), ferr)
		}
	}
	require.NoError(h.t, h.verifyServed(id, reqs, res, failed))
	checkConsumed(h, id)
	return reassigned
}

// mayReassign reports whether a late read may find its hit rows moved:
// only without prefetch, or with a read-ahead budget too small to hold
// every hit step's buffers (such a step is read at Materialize).
func (h *harness) mayReassign() bool {
	return h.cfg.DisablePrefetch || (h.cfg.ReadAheadBytes > 0 && h.cfg.ReadAheadBytes < 1<<20)
}

// propRun applies actions to one harness, step by step.
type propRun struct {
	h        *harness
	maxDelay int // cap on propAction.delay: at most maxDelay steps stay unconsumed across a Save
	i        int
	late     []lateMat
	// pinnedBudget tolerates a Save failing with ErrBudget when the device
	// bytes that unconsumed steps may pin (see pinnedBound) and the step's
	// need exceed the budget: the run is then broken and must stop.
	pinnedBudget bool
	broken       error
	dead         bool // the cache failed or closed on purpose: the run ended
	stepAborts   int  // begun steps aborted (propAction.abortRetry) and begun again
}

// outsideID is a request id no schedule uses.
const outsideID int64 = 1 << 40

// apply runs one action: Begin, Save, the due late reads, this step's
// consumption, and the checks.
func (r *propRun) apply(act propAction) {
	h := r.h
	h.t.Helper()
	i := r.i
	r.i++
	for _, id := range act.unassign {
		h.unassign(id)
	}
	for _, as := range act.assign {
		h.assign(as.id, as.blocks...)
	}
	for _, id := range act.bump {
		h.bump(id)
	}
	h.devKeys, h.ownKeys, h.omitKeys = act.devKeys, act.ownKeys, act.omitKeys
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
		before := h.stats()
		require.ErrorIs(h.t, h.beginPlan(nil), omnicache.ErrPlan, "%sBegin(nil)", h.prefix())
		r.unchanged("Begin(nil)", before)
	}
	err := h.tryBegin(act.st)
	require.NoError(h.t, err, "%sBegin of step %d", h.prefix(), i)
	if act.nilArgs {
		_, err := h.trySave(nil)
		require.ErrorIs(h.t, err, omnicache.ErrOutputs, "%sSave(nil)", h.prefix())
		require.NoError(h.t, h.tryBegin(act.st), "%sBegin of step %d again after Save(nil)", h.prefix(), i)
	}
	if r.badSaveFirst(act) {
		require.NoError(h.t, h.tryBegin(act.st), "%sBegin of step %d again after its failed Save", h.prefix(), i)
	}
	if act.abortRetry {
		// The forward failed: the cache returns to before this Begin
		// (finished requests stay dropped), and the engine retries the
		// step; its rows and hits must come out as if it never failed.
		h.abortBegun()
		r.stepAborts++
		require.NoError(h.t, h.tryBegin(act.st), "%sBegin of step %d again after Abort", h.prefix(), i)
	}
	if act.misuse == misuseBeginTwice {
		err := h.beginPlan(&omnicache.Plan{Stride: h.stride})
		require.ErrorIs(h.t, err, omnicache.ErrSequence, "%sBegin twice (step %d)", h.prefix(), i)
	}
	ps := h.pending
	sid, err := h.trySave(h.outs())
	if err != nil && r.pinnedBudget && errors.Is(err, omnicache.ErrBudget) {
		pinned, need := r.pinnedBound(ps), r.needBound(ps)
		require.Greater(h.t, pinned+need, h.cfg.DeviceBudgetBytes,
			"%sSave of step %d failed (%v) although unconsumed steps pin at most %d device bytes and the step needs at most %d",
			h.prefix(), i, err, pinned, need)
		r.breakOn(ps, fmt.Errorf("Save of step %d: %w (unconsumed steps may pin %d bytes, the step needs up to %d)", i, err, pinned, need))
		return
	}
	require.NoError(h.t, err, "%sSave of step %d", h.prefix(), i)
	r.consumeDue(i)

	if act.outside {
		err := h.matCall(sid, []int64{outsideID}, &h.res)
		require.ErrorIs(h.t, err, omnicache.ErrNotInStep, "%sMaterialize(%v) of a request outside the step", h.prefix(), sid)
	}
	reqs := reqList(act.reqs)
	due := i + min(max(act.delay, 1), max(r.maxDelay, 1))
	switch act.mode {
	case matNow:
		if act.nilArgs {
			err := h.matCall(sid, reqs, nil)
			require.ErrorIs(h.t, err, omnicache.ErrOutputs, "%sMaterialize(%v) into a nil Result", h.prefix(), sid)
		}
		materializeNow(h, sid, reqs) // still unconsumed: every row checked

	case matLate:
		r.late = append(r.late, lateMat{id: sid, reqs: reqs, due: due})
	case matDiscard:
		h.discard(sid)
	case matAsync:
		l := lateMat{id: sid, reqs: reqs, async: true, done: make(chan error, 1), res: new(omnicache.Result), due: due}
		h.dmu.Lock()
		h.asyncOpen[sid] = true
		h.dmu.Unlock()
		go func(c *omnicache.Cache) { l.done <- c.Materialize(l.id, l.reqs, l.res) }(h.c)
		r.late = append(r.late, l)
	}
	if act.twice && (act.mode == matNow || act.mode == matDiscard) {
		err := h.matCall(sid, reqs, &h.res)
		require.ErrorIs(h.t, err, omnicache.ErrUnknownStep, "%sMaterialize(%v) of a consumed step", h.prefix(), sid)
		require.ErrorIs(h.t, h.tryDiscard(sid), omnicache.ErrUnknownStep, "%sDiscard(%v) of a consumed step", h.prefix(), sid)
	}
	st := h.stats()
	require.LessOrEqual(h.t, st.BudgetPeak, st.BudgetLimit, "%sStats.BudgetPeak after step %d", h.prefix(), i)
	require.LessOrEqual(h.t, st.PagesInUse, max(h.cfg.StagingDepth, omnicache.DefaultStagingDepth), "%sStats.PagesInUse", h.prefix())
	if act.check {
		h.checkMirror()
	}
}

// consumeDue consumes the late and asynchronous reads due by step i.
func (r *propRun) consumeDue(i int) {
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
func (r *propRun) pinnedBound(ps *pendingStep) int64 {
	h := r.h
	def, imm := rowBytes(h.cfg)
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
func (r *propRun) needBound(ps *pendingStep) int64 {
	def, imm := rowBytes(r.h.cfg)
	n := 0
	for _, s := range ps.st.Sched {
		n += s.Count
	}
	return int64(n) * (def + imm)
}

// breakOn ends a run whose Save failed: the slots the step scheduled may or
// may not have been written, so the model forgets them (and a delayed read
// of a hit on them may fail with ErrReassigned).
func (r *propRun) breakOn(ps *pendingStep, err error) {
	h := r.h
	r.broken = err
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
func (r *propRun) misuseBefore(kind int) {
	h := r.h
	bs := int32(h.cfg.BlockSize)
	arrival := func(hit int32, blocks ...int32) *omnicache.Plan {
		return &omnicache.Plan{Stride: h.stride, Arrivals: []int64{outsideID}, HitTokens: []int32{hit}, HitBlocks: blocks}
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
		p, want = arrival(bs, int32(h.cfg.NumBlocks)), omnicache.ErrPlan
	case misuseNegativeStart:
		p = &omnicache.Plan{Stride: h.stride, IDs: []int64{outsideID}, Rows: []int32{0}, Start: []int32{-1}, Count: []int32{1},
			Table: make([]int32, h.stride)}
		want = omnicache.ErrPlan
	case misuseSaveFirst:
		res := guard(h.t, h.prefix()+"Save", func() saveResult {
			id, err := h.c.Save(h.outputsFor(step{}))
			return saveResult{id, err}
		})
		require.ErrorIs(h.t, res.err, omnicache.ErrSequence, "%sSave without Begin", h.prefix())
		return
	default:
		panic(fmt.Sprintf("misuse kind %d", kind))
	}
	err := h.beginPlan(p)
	require.ErrorIs(h.t, err, want, "%sBegin with misuse %d", h.prefix(), kind)
}

// finish consumes what is still unconsumed and checks the whole mirror,
// deferred keys included.
func (r *propRun) finish() {
	r.h.t.Helper()
	for _, l := range r.late {
		consume(r.h, l)
	}
	r.late = nil
	r.h.checkMirror(allKeys(r.h)...)
}
