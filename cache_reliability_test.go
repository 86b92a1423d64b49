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
	"github.com/omnicache/omnicache/internal/gputest"
)

// lagDevice holds chosen writes "in transit": every event recorded while
// it is armed blocks Wait until the test releases that event. It is how a
// test makes the committer lag behind the engine at an exact point.
type lagDevice struct {
	gpu.Device
	mu    sync.Mutex
	armed bool
	next  gpu.Event
	gates map[gpu.Event]chan struct{}
	last  gpu.Event
}

func newLagDevice() *lagDevice {
	return &lagDevice{Device: gpu.NewHost(), gates: map[gpu.Event]chan struct{}{}}
}

// hold gates the events recorded from now on until release(ev); it
// returns a function that stops gating and reports the last gated event.
func (d *lagDevice) hold() (stop func() gpu.Event) {
	d.mu.Lock()
	d.armed, d.last = true, 0
	d.mu.Unlock()
	return func() gpu.Event {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.armed = false
		return d.last
	}
}

func (d *lagDevice) release(ev gpu.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g, ok := d.gates[ev]; ok {
		close(g)
		delete(d.gates, ev)
	}
}

func (d *lagDevice) Record() (gpu.Event, error) {
	if _, err := d.Device.Record(); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	if d.armed {
		d.gates[d.next] = make(chan struct{})
		d.last = d.next
	}
	return d.next, nil
}

func (d *lagDevice) Wait(e gpu.Event) error {
	d.mu.Lock()
	g := d.gates[e]
	d.mu.Unlock()
	if g != nil {
		<-g
	}
	return d.Device.Wait(0)
}

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
			dev := newLagDevice()
			cfg := testConfig(keyHidden, keyAux)
			cfg.Device = dev
			h := newHarness(t, cfg)
			var fin []int64
			if written {
				h.assign(old, 0)
				h.mat(h.step(step{Sched: []S{{old, 0, 4}}, Arrive: []A{{ID: old}}}))
				h.sync()
				fin = []int64{old}
			}
			h.assign(a, 0)
			h.assign(b, 0, 5)
			h.begin(step{Sched: []S{{a, 0, 4}, {b, 4, 1}}, Arrive: []A{{ID: a}, {ID: b, Hit: 4}}, Finished: fin})
			stop := dev.hold()
			s1 := h.save()
			w1 := stop()
			h.unassign(a)
			h.unassign(b)
			h.assign(c, 0)
			h.begin(step{Sched: []S{{c, 0, 4}}, Arrive: []A{{ID: c}}, Finished: []int64{a, b}})
			stop = dev.hold()
			s2 := h.save()
			w2 := stop()
			require.NotZero(t, w1)
			require.NotZero(t, w2)
			dev.release(w1) // W1 lands, skipping block 0; W2 stays in transit
			if !h.matDelayed(s1, b) {
				t.Log("B's delayed read returned A's rows")
			}
			dev.release(w2)
			h.mat(s2)
			h.sync()
			h.checkMirror()
			usable(h)
		})
	}
}

// Finding 1: a Save whose deferred-key reservation fails must not have
// queued the step's immediate rows: a later hit on those blocks reads the
// previous tenant's rows of every key, never the failed step's hidden rows
// next to the old deferred rows.
func TestFailedSaveWritesNothing(t *testing.T) {
	const old, x, y = 1, 2, 3
	cfg := testConfig(keyHidden, keyCodes)
	cfg.DeviceBudgetBytes = 8 * int64(keyCodes.RowBytes) // 8 deferred rows
	cfg.DeferredChunkBytes = cfg.DeviceBudgetBytes
	h := newHarness(t, cfg)
	h.assign(old, 1, 2)
	h.mat(h.step(step{Sched: []S{{old, 0, 8}}, Arrive: []A{{ID: old}}}))
	h.mat(h.step(step{Finished: []int64{old}}))
	h.sync()

	// x reuses blocks 1 and 2 and schedules 12 tokens: its deferred clone
	// (12 rows) can never fit the budget.
	h.assign(x, 1, 2, 3)
	before := h.stats()
	h.begin(step{Sched: []S{{x, 0, 12}}, Arrive: []A{{ID: x}}})
	_, err := h.trySave(h.outs())
	require.ErrorIs(t, err, omnicache.ErrBudget)
	after := h.stats()
	require.Equal(t, before.WriteTasks, after.WriteTasks, "a failed Save queued a write")
	require.Equal(t, before.Steps, after.Steps)
	require.Zero(t, after.PagesInUse, "a failed Save holds a page")
	require.Zero(t, after.BudgetCharged, "a failed Save holds budget")
	require.Equal(t, before.LiveRequests, after.LiveRequests, "a failed Save undoes its Begin's arrival")
	h.sync()

	h.unassign(x)
	h.assign(y, 1, 2, 4)
	h.mat(h.step(step{Sched: []S{{y, 8, 2}}, Arrive: []A{{ID: y, Hit: 8}}}))
	h.sync()
	h.checkMirror()
	usable(h)
}

// Finding 2: a Begin that fails registers nothing, and a Save that fails
// undoes its Begin: the corrected (or retried) plan's arrival is a hit
// served in that very step, not a continuation, and a later decode step
// carries no prefix.
func TestFailedCallsKeepHits(t *testing.T) {
	const a, b = 1, 2
	setup := func(t *testing.T) *harness {
		h := newHarness(t, testConfig())
		h.assign(a, 1)
		h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
		h.assign(b, 1, 2)
		return h
	}
	hit := step{Sched: []S{{b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}}
	decode := step{Sched: []S{{b, 6, 1}}}
	check := func(t *testing.T, h *harness) {
		s := h.step(hit)
		h.mat(s) // the harness expects the 4-token prefix in this step
		require.Equal(t, 4, h.res.Prefix(0), "the hit is served in the retried step")
		s = h.step(decode)
		h.mat(s)
		require.Equal(t, 0, h.res.Prefix(0), "a decode step after the hit carries no prefix")
		require.Equal(t, 1, h.res.Tokens(0))
		usable(h)
	}
	t.Run("Begin fails on a request scheduled twice", func(t *testing.T) {
		h := setup(t)
		p := h.plan(hit)
		p.IDs = append(p.IDs, p.IDs[0])
		p.Rows = append(p.Rows, p.Rows[0])
		p.Start = append(p.Start, p.Start[0])
		p.Count = append(p.Count, p.Count[0])
		require.ErrorIs(t, h.beginPlan(p), omnicache.ErrPlan)
		check(t, h)
	})
	t.Run("Begin fails on an arrival listed twice", func(t *testing.T) {
		h := setup(t)
		p := h.plan(hit)
		p.Arrivals = append(p.Arrivals, b)
		p.HitTokens = append(p.HitTokens, 0)
		require.ErrorIs(t, h.beginPlan(p), omnicache.ErrPlan)
		check(t, h)
	})
	t.Run("Begin fails on a hit that disagrees with the first position", func(t *testing.T) {
		h := setup(t)
		p := h.plan(hit)
		p.Start[0] = 5
		p.Count[0] = 1
		err := h.beginPlan(p)
		require.ErrorIs(t, err, omnicache.ErrPlan)
		require.Contains(t, err.Error(), "position 5")
		check(t, h)
	})
	t.Run("Save fails on bad outputs, same plan again", func(t *testing.T) {
		h := setup(t)
		h.begin(hit)
		o := h.outs()
		o.Tokens--
		_, err := h.trySave(o)
		require.ErrorIs(t, err, omnicache.ErrTokenCount)
		check(t, h)
	})
}

// The staging-page timeout is a typed error naming the unconsumed steps.
func TestStagingTimeoutErrorAs(t *testing.T) {
	cfg := testConfig()
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = omnicache.NoWait
	h := newHarness(t, cfg)
	const a, b = 1, 2
	h.assign(a, 1)
	h.assign(b, 2)
	s1 := h.step(step{Sched: []S{{a, 0, 2}}, Arrive: []A{{ID: a}}})
	h.begin(step{Sched: []S{{b, 0, 2}}, Arrive: []A{{ID: b}}})
	_, err := h.trySave(h.outs())
	var te *omnicache.StagingTimeoutError
	require.True(t, errors.As(err, &te), "want a *StagingTimeoutError, got %v", err)
	require.ErrorIs(t, err, omnicache.ErrStagingTimeout)
	require.Equal(t, []omnicache.StepID{s1}, te.Unconsumed)
	require.Equal(t, 1, te.Depth)
	h.mat(s1)
	h.sync() // the page returns once s1's write landed too (NoWait does not wait for it)
	usable(h)
}

// Finding 3: Close racing reads in flight never crashes and never frees
// memory a reader still copies from: each concurrent Materialize returns
// its exact rows or ErrClosed. Run under -race; a read of unmapped memory
// would kill the test binary.
func TestCloseRacingMaterialize(t *testing.T) {
	for round := 0; round < 20; round++ {
		cfg := testConfig()
		cfg.StagingDepth = 8
		cfg.NumBlocks = 64
		h := newHarness(t, cfg)
		// A writes 4 blocks; eight requests then hit them, one step each,
		// left unconsumed.
		const a = 1
		h.assign(a, 0, 1, 2, 3)
		h.mat(h.step(step{Sched: []S{{a, 0, 16}}, Arrive: []A{{ID: a}}}))
		var ids []omnicache.StepID
		for i := 0; i < 7; i++ {
			id := int64(10 + i)
			h.assign(id, 0, 1, 2, 3, int32(4+i))
			ids = append(ids, h.step(step{Sched: []S{{id, 16, 2}}, Arrive: []A{{ID: id, Hit: 16}}}))
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
				err := h.c.Materialize(sid, nil, &res)
				if err == nil {
					err = h.verify(sid, nil, &res)
				}
				errs[i] = err
			}()
		}
		closed := make(chan error)
		go func() {
			<-start
			closed <- h.c.Close()
		}()
		close(start)
		require.NoError(t, <-closed, "Close")
		h.closed = true
		wg.Wait()
		for i, err := range errs {
			if err != nil && !errors.Is(err, omnicache.ErrClosed) {
				t.Fatalf("round %d: Materialize of step %v racing Close: %v (want exact rows or ErrClosed)", round, ids[i], err)
			}
		}
		st := h.c.Stats()
		require.Zero(t, st.PagesInUse, "pages in use after Close")
		require.Zero(t, st.BudgetCharged, "budget charged after Close")
	}
}

// Finding 3: a Save waiting for a staging page when Close runs fails with
// ErrClosed (it never gets the page Close frees), and Close releases
// everything.
func TestCloseWakesSaveWaitingForPage(t *testing.T) {
	base := runtime.NumGoroutine()
	cfg := testConfig()
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = time.Hour // only Close can end the wait
	h := newHarness(t, cfg)
	const a, b = 1, 2
	h.assign(a, 1)
	h.assign(b, 2)
	h.step(step{Sched: []S{{a, 0, 2}}, Arrive: []A{{ID: a}}}) // holds the only page, unconsumed
	h.begin(step{Sched: []S{{b, 0, 2}}, Arrive: []A{{ID: b}}})
	done, join := h.saveAsync(h.outs())
	select {
	case <-done:
		t.Fatal("Save returned while every page was held")
	case <-time.After(20 * time.Millisecond): // a chance to fail; never a threshold
	}
	require.NoError(t, guard(t, "Close", func() error { return h.c.Close() }))
	h.closed = true
	_, err := join()
	require.ErrorIs(t, err, omnicache.ErrClosed, "the Save waiting for a page when Close ran")
	st := h.c.Stats()
	require.Zero(t, st.PagesInUse)
	require.Zero(t, st.BudgetCharged)
	_, err = h.c.Save(&omnicache.Outputs{})
	require.ErrorIs(t, err, omnicache.ErrClosed)
	require.ErrorIs(t, h.c.Begin(h.plan(step{})), omnicache.ErrClosed)
	waitGoroutines(t, base)
}

// Finding 4: a sticky failure wakes a Save waiting for a page at once
// with ErrWriteFailed (not after the claim timeout); Discard after the
// failure still consumes its step (finding 8), and Close leaves no page
// or budget held.
func TestFailureWakesSaveWaitingForPage(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := testConfig()
	cfg.Device = dev
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = time.Hour // only the failure can end the wait
	h := newHarness(t, cfg)
	const a, b = 1, 2
	h.assign(a, 1)
	h.assign(b, 2)
	dev.Hang() // the committer will block in Wait on a's write
	s1 := h.step(step{Sched: []S{{a, 0, 2}}, Arrive: []A{{ID: a}}})
	h.begin(step{Sched: []S{{b, 0, 2}}, Arrive: []A{{ID: b}}})
	done, join := h.saveAsync(h.outs())
	select {
	case <-done:
		t.Fatal("Save returned while every page was held")
	case <-time.After(20 * time.Millisecond):
	}
	dev.FailOpAfter(gputest.OpWait, 0)
	dev.Release() // the committer's Wait now fails: the cache fails
	_, err := join()
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "the waiting Save wakes with the failure")
	require.ErrorIs(t, h.tryDiscard(s1), omnicache.ErrWriteFailed, "Discard after the failure reports it")
	require.ErrorIs(t, h.tryDiscard(s1), omnicache.ErrUnknownStep, "and consumed the step")
	require.NoError(t, guard(t, "Close", func() error { return h.c.Close() }))
	h.closed = true
	st := h.c.Stats()
	require.Zero(t, st.PagesInUse)
	require.Zero(t, st.BudgetCharged)
}
