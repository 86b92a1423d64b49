package omnicache_test

// Wrong rows on failure paths: each test here failed on the code before
// the write path/read path split (a hit served another tenant's rows, a
// failed call left part of itself behind).

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
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
	dev := gpu.NewFaulty(gpu.NewHost())
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
	dev.FailOpAfter(gpu.OpWait, 0)
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

// Finding 9: waits on a device that never completes are bounded: a hit
// read's join fails the cache with ErrDeviceTimeout, and Close returns
// ErrDeviceTimeout within Config.WaitTimeout instead of hanging.
func TestHungDeviceBoundedWaits(t *testing.T) {
	dev := gpu.NewFaulty(gpu.NewHost())
	cfg := testConfig()
	cfg.Device = dev
	cfg.WaitTimeout = 50 * time.Millisecond
	h := newHarness(t, cfg)
	t.Cleanup(dev.Release) // let the stuck committer go at the end
	const a, b = 1, 2
	h.assign(a, 1)
	h.assign(b, 1, 2)
	dev.Hang()
	h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}})
	s := h.step(step{Sched: []S{{b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}})
	err := h.matCall(s, nil, &h.res)
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "a hit read joined to a write that never lands")
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout)
	err = guard(t, "Close", func() error { return h.c.Close() })
	h.closed = true
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout, "Close with the committer stuck on the device")
}

// Finding 9: the engine's own join (a Save waits for the copies of the
// write before the previous one) is bounded too: with the device hung, the
// third Save fails the cache with ErrDeviceTimeout instead of hanging.
func TestHungDeviceBoundedJoin(t *testing.T) {
	dev := gpu.NewFaulty(gpu.NewHost())
	cfg := testConfig()
	cfg.Device = dev
	cfg.WaitTimeout = 50 * time.Millisecond
	cfg.StagingDepth = 4
	h := newHarness(t, cfg)
	t.Cleanup(dev.Release)
	dev.Hang()
	var err error
	for i := int64(1); i <= 3 && err == nil; i++ {
		h.assign(i, int32(i))
		h.begin(step{Sched: []S{{i, 0, 2}}, Arrive: []A{{ID: i}}})
		_, err = h.trySave(h.outs())
	}
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "the Save that joins a write whose copy never completes")
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout)
	require.ErrorIs(t, h.c.Sync(), omnicache.ErrWriteFailed, "sticky")
	err = guard(t, "Close", func() error { return h.c.Close() })
	h.closed = true
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout, "Close with the committer stuck on the device")
}

// Finding 5: sizes that overflow or exceed what the process can address
// are ErrConfig naming the field; a step count beyond the staging
// capacity is rejected by Begin before anything is sized from it.
func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		mut         func(c *omnicache.Config)
	}{
		{"row bytes 1<<40", "RowBytes", func(c *omnicache.Config) { c.Keys = []omnicache.Key{{Name: "h", RowBytes: 1 << 40}} }},
		{"mirror overflows", "mirror", func(c *omnicache.Config) {
			c.NumBlocks, c.BlockSize = 1<<20, 1<<10
			c.Keys = []omnicache.Key{{Name: "h", RowBytes: 1 << 29}}
		}},
		{"staging depth 1<<40", "StagingDepth", func(c *omnicache.Config) { c.StagingDepth = 1 << 40 }},
		{"staging capacity 1<<40", "StagingCapacityTokens", func(c *omnicache.Config) { c.StagingCapacityTokens = 1 << 40 }},
		{"page bytes", "StagingCapacityTokens", func(c *omnicache.Config) {
			c.StagingCapacityTokens = 1 << 30
			c.Keys = []omnicache.Key{{Name: "h", RowBytes: 1 << 10}}
		}},
		{"slots overflow int32", "NumBlocks", func(c *omnicache.Config) { c.NumBlocks, c.BlockSize = 1<<30, 4 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.mut(&cfg)
			c, err := omnicache.New(cfg)
			if c != nil {
				c.Close()
			}
			require.ErrorIs(t, err, omnicache.ErrConfig)
			require.Contains(t, err.Error(), tc.field)
		})
	}
	t.Run("count beyond the page", func(t *testing.T) {
		h := newHarness(t, testConfig())
		p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{1<<31 - 1},
			Table: make([]int32, 8), Stride: 8, Arrivals: []int64{1}, HitTokens: []int32{0}}
		var err error
		allocs := testing.AllocsPerRun(1, func() { err = h.c.Begin(p) })
		require.ErrorIs(t, err, omnicache.ErrStepTooLarge)
		require.Less(t, allocs, 20.0, "Begin allocated before rejecting the count")
		usable(h)
	})
}

// Finding 6: a device tensor whose declared size exceeds its memory is
// this Save's ErrOutputs, not a failed copy that fails the cache.
func TestDeviceTensorLargerThanItsMemory(t *testing.T) {
	h := newHarness(t, testConfig())
	h.device = true
	const a = 1
	h.assign(a, 1, 2)
	h.begin(step{Sched: []S{{a, 0, 6}}, Arrive: []A{{ID: a}}})
	o := h.outs()
	d := &o.Tensors[0].Dev
	d.Host = d.Host[:len(d.Host)/2] // the buffer holds half of what it declares
	_, err := h.trySave(o)
	require.ErrorIs(t, err, omnicache.ErrOutputs)
	require.NotErrorIs(t, err, omnicache.ErrWriteFailed)
	usable(h)
}

// Finding 7: a staging page that cannot be allocated is a sticky write
// failure like any device failure (not a one-off ErrWriteFailed).
func TestStagingAllocFailureIsSticky(t *testing.T) {
	dev := gpu.NewFaulty(gpu.NewHost())
	cfg := testConfig()
	cfg.Device = dev
	h := newHarness(t, cfg)
	dev.FailOpAfter(gpu.OpAllocHost, 0)
	const a = 1
	h.assign(a, 1)
	h.begin(step{Sched: []S{{a, 0, 2}}, Arrive: []A{{ID: a}}})
	_, err := h.trySave(h.outs())
	require.ErrorIs(t, err, omnicache.ErrWriteFailed)
	dev.Heal()
	require.ErrorIs(t, h.c.Begin(h.plan(step{})), omnicache.ErrWriteFailed, "the failure is sticky")
	require.ErrorIs(t, h.c.Sync(), omnicache.ErrWriteFailed)
}

// A Save whose reservation cannot be met because unconsumed steps pin the
// deferred clones fails with ErrBudget before forcing anything out: the
// cache is exactly as before (no budget flush, no task, no page), and once
// the steps are consumed the same step saves.
func TestBudgetPinnedFailsFirst(t *testing.T) {
	const a, b, c = 1, 2, 3
	cfg := testConfig(keyHidden, keyCodes)
	cfg.DeviceBudgetBytes = 8 * int64(keyCodes.RowBytes) // two 4-token steps of deferred rows
	cfg.DeferredChunkBytes = cfg.DeviceBudgetBytes
	h := newHarness(t, cfg)
	h.assign(a, 1)
	h.assign(b, 2)
	h.assign(c, 3)
	s1 := h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}})
	s2 := h.step(step{Sched: []S{{b, 0, 4}}, Arrive: []A{{ID: b}}, Finished: []int64{a}})
	before := h.stats()
	h.begin(step{Sched: []S{{c, 0, 4}}, Arrive: []A{{ID: c}}})
	afterBegin := h.stats()
	_, err := h.trySave(h.outs())
	require.ErrorIs(t, err, omnicache.ErrBudget)
	require.Contains(t, err.Error(), "pinned")
	after := h.stats()
	require.Equal(t, afterBegin.BudgetFlushes, after.BudgetFlushes, "the failed Save forced a write out")
	require.Equal(t, afterBegin.WriteTasks, after.WriteTasks, "the failed Save queued a task")
	require.Equal(t, afterBegin.DeferredWrites, after.DeferredWrites)
	require.Equal(t, afterBegin.Steps, after.Steps)
	require.Equal(t, before.LiveRequests, after.LiveRequests, "the failed Save undid its Begin")
	h.mat(s1)
	h.mat(s2)
	h.mat(h.step(step{Sched: []S{{c, 0, 4}}, Arrive: []A{{ID: c}}}))
	h.sync()
	h.checkMirror()
}

// Abort: a forward that fails after Begin abandons the step; the same plan
// then runs as if the failed attempt never happened (its hit is served),
// and Abort outside a begun step is ErrSequence.
func TestAbort(t *testing.T) {
	const a, b = 1, 2
	h := newHarness(t, testConfig())
	require.ErrorIs(t, h.c.Abort(), omnicache.ErrSequence, "Abort without Begin")
	h.assign(a, 1)
	h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
	h.assign(b, 1, 2)
	hit := step{Sched: []S{{b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}}
	before := h.stats()
	require.NoError(t, h.tryBegin(hit))
	require.NoError(t, h.c.Abort())
	h.pending = nil
	delete(h.live, b) // the harness's side of the undone Begin
	after := h.stats()
	require.Equal(t, before.LiveRequests-1, after.LiveRequests, "a stays finished, b is gone again")
	require.ErrorIs(t, h.c.Abort(), omnicache.ErrSequence, "Abort twice")
	_, err := h.c.Save(&omnicache.Outputs{})
	require.ErrorIs(t, err, omnicache.ErrSequence, "Save after Abort")
	h.mat(h.step(hit))
	require.Equal(t, 4, h.res.Prefix(0), "the hit is served when the step runs again")
	usable(h)
}

// asyncDevice models a device whose copies run later, in stream order,
// when an event recorded after them is waited for (as on a GPU): a copy's
// source is read only then. Host→device copies take their source at once
// (pageable memory is staged by the driver before the call returns).
type asyncDevice struct {
	gpu.Host
	mu    sync.Mutex
	ops   []func()
	done  int
	next  gpu.Event
	marks map[gpu.Event]int
}

func newAsyncDevice() *asyncDevice { return &asyncDevice{marks: map[gpu.Event]int{}} }

func (d *asyncDevice) enqueue(f func()) {
	d.mu.Lock()
	d.ops = append(d.ops, f)
	d.mu.Unlock()
}

func (d *asyncDevice) CopyDtoD(dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff int, n int) error {
	d.enqueue(func() { copy(dst.Host[dstOff:dstOff+n], src.Host[srcOff:srcOff+n]) })
	return nil
}

func (d *asyncDevice) CopyDtoH(dst []byte, src gpu.Buffer, srcOff int) error {
	d.enqueue(func() { copy(dst, src.Host[srcOff:srcOff+len(dst)]) })
	return nil
}

func (d *asyncDevice) CopyHtoD(dst gpu.Buffer, dstOff int, src []byte) error {
	staged := append([]byte(nil), src...)
	d.enqueue(func() { copy(dst.Host[dstOff:], staged) })
	return nil
}

func (d *asyncDevice) Record() (gpu.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	d.marks[d.next] = len(d.ops)
	return d.next, nil
}

func (d *asyncDevice) Wait(e gpu.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ; d.done < d.marks[e]; d.done++ {
		d.ops[d.done]()
	}
	return nil
}

func (d *asyncDevice) WaitFor(e gpu.Event, _ time.Duration) error { return d.Wait(e) }

// A non-owned device tensor may be overwritten as soon as Save returns,
// even on a device whose copies run later: Save waits for its clones. The
// harness scribbles every non-owned output right after Save; a clone that
// ran after that would hand back the scribbles.
func TestNonOwnedDeviceTensorOverwrittenAfterSave(t *testing.T) {
	for _, buffer := range []bool{true, false} {
		t.Run(fmt.Sprintf("buffer=%v", buffer), func(t *testing.T) {
			cfg := testConfig(keyHidden, keyAux, keyCodes)
			cfg.Device = newAsyncDevice()
			cfg.DisableDecodeBuffer = !buffer
			h := newHarness(t, cfg)
			h.device = true
			const a, b = 1, 2
			h.assign(a, 1, 2, 3)
			h.mat(h.step(step{Sched: []S{{a, 0, 8}}, Arrive: []A{{ID: a}}}))
			for pos := 8; pos < 12; pos++ { // pure decode steps (parked with the buffer on)
				h.mat(h.step(step{Sched: []S{{a, pos, 1}}}))
			}
			h.assign(b, 1, 2, 4)
			h.mat(h.step(step{Sched: []S{{b, 8, 2}}, Arrive: []A{{ID: b, Hit: 8}}, Finished: []int64{a}}))
			h.mat(h.step(step{Finished: []int64{b}}))
			h.sync()
			h.checkMirror(allKeys(h)...)
		})
	}
}

// A large step's non-owned device tensor: Save waits for its clone, and
// issues the copy out of the clone itself (behind it on the stream) before
// it hands the write over; the committer waits for that copy instead of
// issuing one. On a device whose copies run at the next wait, the step's
// own rows, the mirror and a later hit read the clone's rows, not the
// tensor scribbled after Save. A device→host copy failing there is the
// sticky write failure: Save fails, the pages and the budget come back.
func TestLargeClonedStepCopiedBySave(t *testing.T) {
	const rb, tok, bs = 128 << 10, 48, 16 // 6 MiB: above the lazy hand-over's 4 MiB
	newCfg := func(d gpu.Device) omnicache.Config {
		return omnicache.Config{NumBlocks: 8, BlockSize: bs, StagingCapacityTokens: 64,
			Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, DisableDecodeBuffer: true, Device: d}
	}
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	plan := func(id int64, start, count int32, hit int32, finished ...int64) *omnicache.Plan {
		p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{0}, Start: []int32{start}, Count: []int32{count},
			Table: table, Stride: len(table), Arrivals: []int64{id}, HitTokens: []int32{hit}, Finished: finished}
		if hit > 0 {
			p.HitBlocks = []int32{0, 1, 2}[:hit/bs]
		}
		return p
	}
	src := make([]byte, tok*rb)
	for i := range src {
		src[i] = byte(i*7 + i/rb)
	}

	t.Run("rows", func(t *testing.T) {
		d := newAsyncDevice()
		c, err := omnicache.New(newCfg(d))
		require.NoError(t, err)
		defer c.Close()
		tensor, err := d.Alloc(tok * rb)
		require.NoError(t, err)
		copy(tensor.Host, src)
		require.NoError(t, c.Begin(plan(1, 0, tok, 0)))
		id, err := c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
		require.NoError(t, err)
		for i := range tensor.Host {
			tensor.Host[i] = 0xEE // the engine reuses its tensor at once
		}
		var res omnicache.Result
		require.NoError(t, c.Materialize(id, nil, &res))
		require.True(t, bytes.Equal(res.Rows(0, 0), src), "the step's own rows")
		require.NoError(t, c.Sync())
		got := make([]byte, tok*rb)
		sl := make([]int32, tok)
		for i := range sl {
			sl[i] = int32(i)
		}
		require.NoError(t, c.Peek(0, sl, got))
		require.True(t, bytes.Equal(got, src), "the mirror's rows")

		// A new request hits the first 32 rows and computes 16 more.
		copy(tensor.Host, src[:16*rb])
		require.NoError(t, c.Begin(plan(2, 32, 16, 32, 1)))
		id, err = c.Save(&omnicache.Outputs{Tokens: 16, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: 16}}})
		require.NoError(t, err)
		require.NoError(t, c.Materialize(id, nil, &res))
		require.True(t, bytes.Equal(res.Rows(0, 0)[:32*rb], src[:32*rb]), "hit rows")
		st := c.Stats()
		require.Zero(t, st.RowsSkipped)
	})

	t.Run("copy fails", func(t *testing.T) {
		f := gpu.NewFaulty(gpu.NewHost())
		c, err := omnicache.New(newCfg(f))
		require.NoError(t, err)
		defer c.Close()
		tensor, err := f.Alloc(tok * rb)
		require.NoError(t, err)
		copy(tensor.Host, src)
		f.FailOpAfter(gpu.OpCopyDtoH, 0) // the clone succeeds, its copy out fails
		require.NoError(t, c.Begin(plan(1, 0, tok, 0)))
		_, err = c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
		require.ErrorIs(t, err, omnicache.ErrWriteFailed)
		st := c.Stats()
		require.Zero(t, st.PagesInUse, "the page came back")
		require.Zero(t, st.BudgetCharged, "the clone's budget came back")
		require.ErrorIs(t, c.Begin(plan(2, 0, 1, 0)), omnicache.ErrWriteFailed, "the failure is sticky")
	})
}
