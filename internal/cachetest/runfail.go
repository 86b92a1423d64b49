package cachetest

// Failing calls a Runner makes (the actions of Engine.NextFrom, FuzzCache):
// a wrong plan for the step about to run, wrong outputs for it, a device
// that fails any method from some step on, and Close racing reads in
// flight. A call that fails with anything but ErrWriteFailed must change
// nothing (the engine-side counters are the same, no page or budget more
// is held, and the run continues: every later hit is checked exactly
// against the model); a device failure must surface only as the sticky
// ErrWriteFailed, and Close must then release every page and budget byte.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/gputest"
)

// Wrong plans for the step about to run (Action.badPlan).
const (
	badPlanNone       = iota
	badPlanDupRequest // a request scheduled twice: ErrPlan
	badPlanDupArrival // an arrival listed twice: ErrPlan
	badPlanTooLarge   // a count beyond the staging page: ErrStepTooLarge
)

// Wrong outputs for the step (Action.badSave).
const (
	badSaveNone   = iota
	badSaveTokens // one token too many: ErrTokenCount
	badSaveRows   // a tensor with a row too few: ErrOutputs
	badSaveMemory // a device tensor larger than its memory (else a tensor too few): ErrOutputs
	// a zero tensor (omitted) for the required hidden key: ErrOutputs
	// (NextFrom's omission byte, not the failing-call byte)
	badSaveOmitRequired
)

// engineStats are the Stats fields only the engine's calls change: a failed
// call must leave them as they were.
func engineStats(st omnicache.Stats) [8]int64 {
	return [8]int64{st.Steps, st.WriteTasks, st.BufferedSteps, st.BufferFlushes, st.DeferredWrites,
		st.HitRequests, st.HitTokens, int64(st.LiveRequests)}
}

// unchanged checks that a failed call changed nothing observable.
func (r *Runner) unchanged(what string, before omnicache.Stats) {
	h := r.h
	h.T.Helper()
	after := h.Stats()
	require.Equal(h.T, engineStats(before), engineStats(after), "%s%s changed the cache (steps, tasks, buffered, flushes, deferred writes, hits, hit tokens, live requests)", h.prefix(), what)
	require.LessOrEqual(h.T, after.PagesInUse, before.PagesInUse, "%s%s took a staging page", h.prefix(), what)
	require.LessOrEqual(h.T, after.BudgetCharged, before.BudgetCharged, "%s%s kept budget charged", h.prefix(), what)
}

// badPlanFirst calls Begin with the step's plan made wrong.
func (r *Runner) badPlanFirst(act Action) {
	h := r.h
	h.T.Helper()
	p := h.Plan(act.Step)
	var want error
	switch act.badPlan {
	case badPlanDupRequest:
		if len(p.IDs) == 0 {
			return
		}
		p.IDs, p.Rows = append(p.IDs, p.IDs[0]), append(p.Rows, p.Rows[0])
		p.Start, p.Count = append(p.Start, p.Start[0]), append(p.Count, 0) // no more tokens: the duplicate is the error
		want = omnicache.ErrPlan
	case badPlanDupArrival:
		if len(p.Arrivals) == 0 {
			return
		}
		p.Arrivals, p.HitTokens = append(p.Arrivals, p.Arrivals[0]), append(p.HitTokens, 0)
		want = omnicache.ErrPlan
	case badPlanTooLarge:
		if len(p.IDs) == 0 {
			return
		}
		p.Count[0] = 1<<31 - 1
		want = omnicache.ErrStepTooLarge
	default:
		return
	}
	before := h.Stats()
	err := h.BeginPlan(p)
	require.ErrorIs(h.T, err, want, "%sBegin with a wrong plan (%d)", h.prefix(), act.badPlan)
	r.unchanged(fmt.Sprintf("Begin with a wrong plan (%v)", err), before)
}

// badSaveFirst calls Save of the begun step with wrong outputs; it
// reports whether it did (the step must then be begun again).
func (r *Runner) badSaveFirst(act Action) bool {
	h := r.h
	h.T.Helper()
	if act.badSave == badSaveNone {
		return false
	}
	o := h.Outs()
	want := omnicache.ErrOutputs
	switch act.badSave {
	case badSaveTokens:
		o.Tokens++
		want = omnicache.ErrTokenCount
	case badSaveRows:
		if o.Tokens == 0 {
			o.Tensors = o.Tensors[:len(o.Tensors)-1]
		} else {
			o.Tensors[0].Rows--
		}
	case badSaveMemory:
		short := false
		for k := range o.Tensors {
			if d := &o.Tensors[k].Dev; o.Tensors[k].Host == nil && len(d.Host) > 0 {
				d.Host = d.Host[:len(d.Host)-1]
				short = true
				break
			}
		}
		if !short {
			o.Tensors = append(o.Tensors, o.Tensors[0])
		}
	case badSaveOmitRequired:
		o.Tensors[0] = omnicache.Tensor{} // KeyHidden, required
	}
	before := h.Stats()
	_, err := h.TrySave(o)
	require.ErrorIs(h.T, err, want, "%sSave with wrong outputs (%d)", h.prefix(), act.badSave)
	require.NotErrorIs(h.T, err, omnicache.ErrWriteFailed, "%sa wrong output is the call's error, not a write failure", h.prefix())
	// The failed Save undid its Begin: live requests are back to before
	// that Begin (less the finished ones), which the retry re-registers.
	b := engineStats(before)
	a := engineStats(h.Stats())
	b[7], a[7] = 0, 0
	require.Equal(h.T, b, a, "%sa failed Save changed the cache", h.prefix())
	return true
}

// faultStep arms the device to fail act.fault from now on and runs the
// step, accepting only the sticky ErrWriteFailed from any call. If the
// fault did not trigger, the device is healed and the step is consumed as
// usual; otherwise the run ends: every later call fails the same way, the
// unconsumed steps are still consumed, and Close releases everything.
func (r *Runner) faultStep(act Action) {
	h := r.h
	h.T.Helper()
	f, ok := h.Cfg.Device.(*gputest.Faulty)
	require.True(h.T, ok, "harness: faults need a gputest.Faulty device")
	op := gputest.Op(act.fault - 1)
	// Reads in flight on other goroutines finish first: a fault they
	// triggered after the checks below would go unnoticed there.
	keep := r.late[:0]
	for _, l := range r.late {
		if l.async {
			consume(h, l)
		} else {
			keep = append(keep, l)
		}
	}
	r.late = keep
	f.FailOpAfter(op, int64(act.faultN))
	var failed error
	note := func(what string, err error) bool {
		if err == nil {
			return false
		}
		require.ErrorIs(h.T, err, omnicache.ErrWriteFailed, "%s%s with the device failing %v: only the sticky failure may surface", h.prefix(), what, op)
		failed = err
		return true
	}
	var sid omnicache.StepID
	if !note("Begin", h.TryBegin(act.Step)) {
		ps := h.pending
		var err error
		sid, err = h.TrySave(h.Outs())
		if err != nil && r.pinnedBudget && errors.Is(err, omnicache.ErrBudget) {
			// Not the fault: the tiny budget is pinned by unconsumed steps
			// (see apply); the run stops as there.
			f.Heal()
			r.breakOn(ps, fmt.Errorf("Save of step %d: %w", r.i-1, err))
			return
		}
		if !note("Save", err) {
			note("Sync", h.TrySync())
		}
	}
	if failed == nil {
		f.Heal()
		// Consume as generated (now, or with the other late reads).
		r.late = append(r.late, lateMat{id: sid, due: r.i})
		r.consumeDue(r.i)
		return
	}
	f.Heal() // the failure is sticky whatever the device does now
	require.ErrorIs(h.T, h.BeginPlan(h.Plan(Step{})), omnicache.ErrWriteFailed, "%sBegin after the failure", h.prefix())
	require.ErrorIs(h.T, h.TrySync(), omnicache.ErrWriteFailed, "%sSync after the failure", h.prefix())
	for _, l := range r.late {
		var err error
		if l.async {
			err = Guard(h.T, "asynchronous Materialize", func() error { return <-l.done })
			if err == nil {
				require.NoError(h.T, h.Verify(l.id, l.reqs, l.res), "%san asynchronous read that completed returns exact rows", h.prefix())
				continue
			}
		} else {
			err = h.MatCall(l.id, l.reqs, &h.Res)
		}
		if !errors.Is(err, omnicache.ErrWriteFailed) {
			require.True(h.T, errors.Is(err, omnicache.ErrReassigned) || errors.Is(err, omnicache.ErrAbsentRequired),
				"%sread of step %v after the failure: %v", h.prefix(), l.id, err)
		}
		h.CheckConsumed(l.id)
	}
	r.late = nil
	r.closeAndCheck()
	r.broken = fmt.Errorf("device failing %v: %w", op, failed)
	r.dead = true
}

// closeMidReads starts every unconsumed step's read on its own goroutine
// and closes the cache while they run: each read returns exact rows or
// ErrClosed (or a documented read error), none crashes, and Close releases
// everything. The run ends.
func (r *Runner) closeMidReads() {
	h := r.h
	h.T.Helper()
	type res struct {
		l   lateMat
		err error
	}
	out := make([]res, len(r.late))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, l := range r.late {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.async {
				out[i] = res{l, <-l.done}
				return
			}
			l.res = new(omnicache.Result)
			<-start
			out[i] = res{l, h.C.Materialize(l.id, l.reqs, l.res)}
		}()
	}
	closed := make(chan error, 1)
	go func() { <-start; closed <- h.C.Close() }()
	close(start)
	require.NoError(h.T, Guard(h.T, "Close during reads", func() error { return <-closed }))
	h.closed = true
	wg.Wait()
	for _, o := range out {
		switch {
		case o.err == nil:
			h.asyncVerify = true // read concurrently with the others and Close: taken at a time the harness does not know
			require.NoError(h.T, h.Verify(o.l.id, o.l.reqs, o.l.res), "%sa read that completed during Close returns exact rows", h.prefix())
			h.asyncVerify = false
		case errors.Is(o.err, omnicache.ErrClosed), errors.Is(o.err, omnicache.ErrReassigned), errors.Is(o.err, omnicache.ErrAbsentRequired):
		default:
			h.T.Fatalf("%sread of step %v during Close: %v", h.prefix(), o.l.id, o.err)
		}
	}
	r.late = nil
	r.checkReleased()
	r.broken = errors.New("closed during reads")
	r.dead = true
}

// closeAndCheck closes the cache and checks nothing is held.
func (r *Runner) closeAndCheck() {
	h := r.h
	err := Guard(h.T, "Close", func() error { return h.C.Close() })
	h.closed = true
	if err != nil {
		require.ErrorIs(h.T, err, omnicache.ErrWriteFailed)
	}
	r.checkReleased()
}

func (r *Runner) checkReleased() {
	h := r.h
	st := h.C.Stats()
	require.Zero(h.T, st.PagesInUse, "%sStats.PagesInUse after Close", h.prefix())
	require.Zero(h.T, st.BudgetCharged, "%sStats.BudgetCharged after Close", h.prefix())
}
