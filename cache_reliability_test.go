package omnicache_test

// Wrong rows on failure paths: each test here failed on the code before
// the write path/read path split (a hit served another tenant's rows, a
// failed call left part of itself behind).

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// Finding 0: block 0 holds old's rows (or nothing). Step 1: A rewrites
// block 0 (write W1) while B hits it in the same step. Step 2: A and B
// finish and C reuses block 0 (write W2) while the committer is still
// behind W1. W1 then skips block 0 (the newer W2 replaces it). B's
// delayed read must return A's rows or ErrReassigned: never old's rows,
// never zeros, never ErrAbsentRequired.
func TestHitAcrossSkippedWrite(t *testing.T) {
	for _, written := range []bool{true, false} {
		name := "block written before"
		if !written {
			name = "block never written before"
		}
		t.Run(name, func(t *testing.T) {
			const old, a, b, c = 1, 2, 3, 4
			dev := cachetest.NewGateDevice()
			cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux)
			cfg.Device = dev
			h := cachetest.New(t, cfg)
			var fin []int64
			if written {
				h.Assign(old, 0)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{old, 0, 4}}, Arrive: []cachetest.A{{ID: old}}}))
				h.Sync()
				fin = []int64{old}
			}
			h.Assign(a, 0)
			h.Assign(b, 0, 5)
			h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}, {b, 4, 1}}, Arrive: []cachetest.A{{ID: a}, {ID: b, Hit: 4}}, Finished: fin})
			stop := dev.Hold()
			s1 := h.Save()
			w1 := stop()
			h.Unassign(a)
			h.Unassign(b)
			h.Assign(c, 0)
			h.Begin(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}, Finished: []int64{a, b}})
			stop = dev.Hold()
			s2 := h.Save()
			w2 := stop()
			require.NotZero(t, w1)
			require.NotZero(t, w2)
			dev.Release(w1) // W1 lands, skipping block 0; W2 stays in transit
			if !h.MatDelayed(s1, b) {
				t.Log("B's delayed read returned A's rows")
			}
			dev.Release(w2)
			h.Mat(s2)
			h.Sync()
			h.CheckMirror()
			h.Usable()
		})
	}
}

// Finding 1: a Save whose deferred-key reservation fails must not have
// queued the step's immediate rows: a later hit on those blocks reads the
// previous tenant's rows of every key, never the failed step's hidden rows
// next to the old deferred rows.
func TestFailedSaveWritesNothing(t *testing.T) {
	const old, x, y = 1, 2, 3
	cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyCodes)
	cfg.DeviceBudgetBytes = 8 * int64(cachetest.KeyCodes.RowBytes) // 8 deferred rows
	cfg.DeferredChunkBytes = cfg.DeviceBudgetBytes
	h := cachetest.New(t, cfg)
	h.Assign(old, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{old, 0, 8}}, Arrive: []cachetest.A{{ID: old}}}))
	h.Mat(h.Step(cachetest.Step{Finished: []int64{old}}))
	h.Sync()

	// x reuses blocks 1 and 2 and schedules 12 tokens: its deferred clone
	// (12 rows) can never fit the budget.
	h.Assign(x, 1, 2, 3)
	before := h.Stats()
	h.Begin(cachetest.Step{Sched: []cachetest.S{{x, 0, 12}}, Arrive: []cachetest.A{{ID: x}}})
	_, err := h.TrySave(h.Outs())
	require.ErrorIs(t, err, omnicache.ErrBudget)
	after := h.Stats()
	require.Equal(t, before.WriteTasks, after.WriteTasks, "a failed Save queued a write")
	require.Equal(t, before.Steps, after.Steps)
	require.Zero(t, after.PagesInUse, "a failed Save holds a page")
	require.Zero(t, after.BudgetCharged, "a failed Save holds budget")
	require.Equal(t, before.LiveRequests, after.LiveRequests, "a failed Save undoes its Begin's arrival")
	h.Sync()

	h.Unassign(x)
	h.Assign(y, 1, 2, 4)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{y, 8, 2}}, Arrive: []cachetest.A{{ID: y, Hit: 8}}}))
	h.Sync()
	h.CheckMirror()
	h.Usable()
}

// Finding 2: a Begin that fails registers nothing, and a Save that fails
// undoes its Begin: the corrected (or retried) plan's arrival is a hit
// served in that very step, not a continuation, and a later decode step
// carries no prefix.
func TestFailedCallsKeepHits(t *testing.T) {
	const a, b = 1, 2
	setup := func(t *testing.T) *cachetest.Harness {
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 1)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
		h.Assign(b, 1, 2)
		return h
	}
	hit := cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}}
	decode := cachetest.Step{Sched: []cachetest.S{{b, 6, 1}}}
	check := func(t *testing.T, h *cachetest.Harness) {
		s := h.Step(hit)
		h.Mat(s) // the harness expects the 4-token prefix in this step
		require.Equal(t, 4, h.Res.Prefix(0), "the hit is served in the retried step")
		s = h.Step(decode)
		h.Mat(s)
		require.Equal(t, 0, h.Res.Prefix(0), "a decode step after the hit carries no prefix")
		require.Equal(t, 1, h.Res.Tokens(0))
		h.Usable()
	}
	t.Run("Begin fails on a request scheduled twice", func(t *testing.T) {
		h := setup(t)
		p := h.Plan(hit)
		p.IDs = append(p.IDs, p.IDs[0])
		p.Rows = append(p.Rows, p.Rows[0])
		p.Start = append(p.Start, p.Start[0])
		p.Count = append(p.Count, p.Count[0])
		require.ErrorIs(t, h.BeginPlan(p), omnicache.ErrPlan)
		check(t, h)
	})
	t.Run("Begin fails on an arrival listed twice", func(t *testing.T) {
		h := setup(t)
		p := h.Plan(hit)
		p.Arrivals = append(p.Arrivals, b)
		p.HitTokens = append(p.HitTokens, 0)
		require.ErrorIs(t, h.BeginPlan(p), omnicache.ErrPlan)
		check(t, h)
	})
	t.Run("Begin fails on a hit that disagrees with the first position", func(t *testing.T) {
		h := setup(t)
		p := h.Plan(hit)
		p.Start[0] = 5
		p.Count[0] = 1
		err := h.BeginPlan(p)
		require.ErrorIs(t, err, omnicache.ErrPlan)
		require.Contains(t, err.Error(), "position 5")
		check(t, h)
	})
	t.Run("Save fails on bad outputs, same plan again", func(t *testing.T) {
		h := setup(t)
		h.Begin(hit)
		o := h.Outs()
		o.Tokens--
		_, err := h.TrySave(o)
		require.ErrorIs(t, err, omnicache.ErrTokenCount)
		check(t, h)
	})
}

// The staging-page timeout is a typed error naming the unconsumed steps.
func TestStagingTimeoutErrorAs(t *testing.T) {
	cfg := cachetest.Config()
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = omnicache.NoWait
	h := cachetest.New(t, cfg)
	const a, b = 1, 2
	h.Assign(a, 1)
	h.Assign(b, 2)
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}})
	h.Begin(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})
	_, err := h.TrySave(h.Outs())
	var te *omnicache.StagingTimeoutError
	require.True(t, errors.As(err, &te), "want a *StagingTimeoutError, got %v", err)
	require.ErrorIs(t, err, omnicache.ErrStagingTimeout)
	require.Equal(t, []omnicache.StepID{s1}, te.Unconsumed)
	require.Equal(t, 1, te.Depth)
	h.Mat(s1)
	h.Sync() // the page returns once s1's write landed too (NoWait does not wait for it)
	h.Usable()
}

// Finding 3: Close racing reads in flight never crashes and never frees
// memory a reader still copies from: each concurrent Materialize returns
// its exact rows or ErrClosed. Run under -race; a read of unmapped memory
// would kill the test binary.
func TestCloseRacingMaterialize(t *testing.T) {
	for round := 0; round < 20; round++ {
		cfg := cachetest.Config()
		cfg.StagingDepth = 8
		cfg.NumBlocks = 64
		h := cachetest.New(t, cfg)
		// A writes 4 blocks; eight requests then hit them, one step each,
		// left unconsumed.
		const a = 1
		h.Assign(a, 0, 1, 2, 3)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 16}}, Arrive: []cachetest.A{{ID: a}}}))
		var ids []omnicache.StepID
		for i := 0; i < 7; i++ {
			id := int64(10 + i)
			h.Assign(id, 0, 1, 2, 3, int32(4+i))
			ids = append(ids, h.Step(cachetest.Step{Sched: []cachetest.S{{id, 16, 2}}, Arrive: []cachetest.A{{ID: id, Hit: 16}}}))
		}
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		start := make(chan struct{})
		for i, sid := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res omnicache.Result
				<-start
				err := h.C.Materialize(sid, nil, &res)
				if err == nil {
					err = h.Verify(sid, nil, &res)
				}
				errs[i] = err
			}()
		}
		closed := make(chan error)
		go func() {
			<-start
			closed <- h.C.Close()
		}()
		close(start)
		require.NoError(t, <-closed, "Close")
		h.MarkClosed()
		wg.Wait()
		for i, err := range errs {
			if err != nil && !errors.Is(err, omnicache.ErrClosed) {
				t.Fatalf("round %d: Materialize of step %v racing Close: %v (want exact rows or ErrClosed)", round, ids[i], err)
			}
		}
		st := h.C.Stats()
		require.Zero(t, st.PagesInUse, "pages in use after Close")
		require.Zero(t, st.BudgetCharged, "budget charged after Close")
	}
}

// Finding 3: a Save waiting for a staging page when Close runs fails with
// ErrClosed (it never gets the page Close frees), and Close releases
// everything.
func TestCloseWakesSaveWaitingForPage(t *testing.T) {
	base := runtime.NumGoroutine()
	cfg := cachetest.Config()
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = time.Hour // only Close can end the wait
	h := cachetest.New(t, cfg)
	const a, b = 1, 2
	h.Assign(a, 1)
	h.Assign(b, 2)
	h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}}) // holds the only page, unconsumed
	h.Begin(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})
	done, join := h.SaveAsync(h.Outs())
	select {
	case <-done:
		t.Fatal("Save returned while every page was held")
	case <-time.After(20 * time.Millisecond): // a chance to fail; never a threshold
	}
	require.NoError(t, cachetest.Guard(t, "Close", func() error { return h.C.Close() }))
	h.MarkClosed()
	_, err := join()
	require.ErrorIs(t, err, omnicache.ErrClosed, "the Save waiting for a page when Close ran")
	st := h.C.Stats()
	require.Zero(t, st.PagesInUse)
	require.Zero(t, st.BudgetCharged)
	_, err = h.C.Save(&omnicache.Outputs{})
	require.ErrorIs(t, err, omnicache.ErrClosed)
	require.ErrorIs(t, h.C.Begin(h.Plan(cachetest.Step{})), omnicache.ErrClosed)
	cachetest.WaitGoroutines(t, base)
}

// Finding 4: a sticky failure wakes a Save waiting for a page at once
// with ErrWriteFailed (not after the claim timeout); Discard after the
// failure still consumes its step (finding 8), and Close leaves no page
// or budget held.
func TestFailureWakesSaveWaitingForPage(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = time.Hour // only the failure can end the wait
	h := cachetest.New(t, cfg)
	const a, b = 1, 2
	h.Assign(a, 1)
	h.Assign(b, 2)
	dev.Hang() // the committer will block in Wait on a's write
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}})
	h.Begin(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})
	done, join := h.SaveAsync(h.Outs())
	select {
	case <-done:
		t.Fatal("Save returned while every page was held")
	case <-time.After(20 * time.Millisecond):
	}
	dev.FailOpAfter(gputest.OpWait, 0)
	dev.Release() // the committer's Wait now fails: the cache fails
	_, err := join()
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "the waiting Save wakes with the failure")
	require.ErrorIs(t, h.TryDiscard(s1), omnicache.ErrWriteFailed, "Discard after the failure reports it")
	require.ErrorIs(t, h.TryDiscard(s1), omnicache.ErrUnknownStep, "and consumed the step")
	require.NoError(t, cachetest.Guard(t, "Close", func() error { return h.C.Close() }))
	h.MarkClosed()
	st := h.C.Stats()
	require.Zero(t, st.PagesInUse)
	require.Zero(t, st.BudgetCharged)
}
