package omnicache_test

// Failures and what is kept: a failed copy is sticky, the state lock is
// never held across a device wait, waits on a
// hung device are bounded, and a call that fails leaves nothing of itself
// behind: no hit serves another tenant's rows or a failed step's. The
// "Finding" tests failed on the code before the write path/read path
// split.

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// A failed copy is sticky: every later call returns
// ErrWriteFailed; nothing hangs (every call runs under the deadlock
// detector); pages, budget and goroutines are released by Close. The fault
// is injected after n successful copies, for several n, so that it hits
// different copies (step clones, parked decode rows, deferred rows).
func TestStickyWriteFailure(t *testing.T) {
	for _, n := range []int64{0, 1, 2, 3, 5, 8, 13} {
		t.Run(fmt.Sprintf("fail after %d copies", n), func(t *testing.T) {
			base := runtime.NumGoroutine()
			dev := gputest.NewFaulty(gpu.NewHost())
			cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes)
			cfg.Device = dev
			h := cachetest.New(t, cfg)
			h.Device = true
			dev.FailAfter(n)

			failedAt := ""
			failed := func(what string, err error) bool {
				if err == nil {
					return false
				}
				require.ErrorIs(t, err, omnicache.ErrWriteFailed, "%s: a failing device copy may only surface as ErrWriteFailed", what)
				failedAt = what
				return true
			}
			// A long request decoding (pure steps, parked), joined every
			// third step by a short request that finishes two steps later.
			const r = 1
			h.Assign(r, 1, 2, 3, 4, 5, 6, 7, 8)
			var prev omnicache.StepID
			havePrev := false
			var short []int64
			for i := 0; i < 20 && failedAt == ""; i++ {
				st := cachetest.Step{}
				if i == 0 {
					st = cachetest.Step{Sched: []cachetest.S{{r, 0, 4}}, Arrive: []cachetest.A{{ID: r}}}
				} else {
					st.Sched = []cachetest.S{{r, int64(3 + i), 1}}
				}
				if i > 0 && i%3 == 0 {
					id := int64(100 + i)
					h.Assign(id, int32(9+i%6))
					st.Sched = append(st.Sched, cachetest.S{id, 0, 3})
					st.Arrive = []cachetest.A{{ID: id}}
					short = append(short, id)
				}
				if i > 0 && i%3 == 2 && len(short) > 0 {
					st.Finished = short
					short = nil
				}
				if failed(fmt.Sprintf("Begin of step %d", i), h.TryBegin(st)) {
					break
				}
				sid, err := h.TrySave(h.Outs())
				if failed(fmt.Sprintf("Save of step %d", i), err) {
					break
				}
				if havePrev {
					err := h.MatCall(prev, nil, &h.Res)
					if failed(fmt.Sprintf("Materialize of step %d", i-1), err) {
						havePrev = false // a failed Materialize consumed the step
						break
					}
					require.NoError(t, h.Verify(prev, nil, &h.Res), "a Materialize that succeeds returns the right rows")
				}
				prev, havePrev = sid, true
				if i%4 == 3 || i == 19 {
					if failed(fmt.Sprintf("Sync after step %d", i), h.TrySync()) {
						break
					}
				}
			}
			require.NotEmpty(t, failedAt, "no call returned ErrWriteFailed although every device copy after the first %d fails", n)
			t.Logf("first ErrWriteFailed from %s", failedAt)

			// Sticky: every later entry returns ErrWriteFailed.
			const late = 900
			h.Assign(late, 15)
			lateStep := cachetest.Step{Sched: []cachetest.S{{late, 0, 2}}, Arrive: []cachetest.A{{ID: late}}}
			require.ErrorIs(t, h.TryBegin(lateStep), omnicache.ErrWriteFailed, "Begin after the failure")
			_, err := h.TrySave(h.OutputsFor(lateStep))
			require.ErrorIs(t, err, omnicache.ErrWriteFailed, "Save after the failure")
			if havePrev {
				// Materialize after the failure still consumes the step
				// (its page and pins go back), and says why it has no rows.
				require.ErrorIs(t, h.MatCall(prev, nil, &h.Res), omnicache.ErrWriteFailed, "Materialize after the failure")
				require.ErrorIs(t, h.TryDiscard(prev), omnicache.ErrUnknownStep, "Discard of the step Materialize consumed after the failure")
			}
			require.ErrorIs(t, h.TrySync(), omnicache.ErrWriteFailed, "Sync after the failure")
			require.ErrorIs(t, h.TrySync(), omnicache.ErrWriteFailed, "Sync again after the failure")

			h.MarkClosed()
			err = cachetest.Guard(t, "Close after the failure", func() error { return h.C.Close() })
			if err != nil {
				require.ErrorIs(t, err, omnicache.ErrWriteFailed, "Close returns nil or the sticky error")
			}
			st := h.Stats()
			assert.Zero(t, st.PagesInUse, "Stats.PagesInUse after Close")
			assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged after Close")
			cachetest.WaitGoroutines(t, base)
		})
	}
}

// The state lock is never held while waiting for a copy:
// while the committer is blocked in a device Wait for one write, Stats, a
// Materialize of another (already host-ready) step, and the engine's next
// Begin and Save all return.
func TestNoLockAcrossWaits(t *testing.T) {
	const a, b, c = 1, 2, 3
	dev := cachetest.NewGateDevice()
	cfg := cachetest.Config()
	cfg.Device = dev
	h := cachetest.New(t, cfg)
	t.Cleanup(dev.Open) // runs before the harness's Close
	h.Device = true

	h.Assign(a, 1, 2)
	h.Assign(b, 3, 4)
	h.Assign(c, 5)
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}}, Arrive: []cachetest.A{{ID: a}}})
	h.Sync() // s1 is host-ready and landed

	dev.Arm()
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 5}}, Arrive: []cachetest.A{{ID: b}}})
	require.True(t, dev.WaitEntered(cachetest.DeadlockTimeout),
		"the write of a step with device tensors never waited on its device event (gpu.Device.Wait): the test holds the committer there")

	// The committer is blocked in Wait. None of these may wait for it.
	st := cachetest.Guard(t, "Stats while the committer waits on a copy", func() omnicache.Stats { return h.C.Stats() })
	assert.Positive(t, st.Steps, "Stats.Steps")
	h.Mat(s1) // guarded: fails the test if it blocks
	s3 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 6, 1}, {c, 0, 2}}, Arrive: []cachetest.A{{ID: c}}})

	dev.Open()
	h.Mat(s2)
	h.Mat(s3)
	h.CheckMirror()
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

// Finding 9: waits on a device that never completes are bounded: a hit
// read's join fails the cache with ErrDeviceTimeout, and Close returns
// ErrDeviceTimeout within Config.WaitTimeout instead of hanging.
func TestHungDeviceBoundedWaits(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	cfg.WaitTimeout = 50 * time.Millisecond
	h := cachetest.New(t, cfg)
	t.Cleanup(dev.Release) // let the stuck committer go at the end
	const a, b = 1, 2
	h.Assign(a, 1)
	h.Assign(b, 1, 2)
	dev.Hang()
	h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}})
	s := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}})
	err := h.MatCall(s, nil, &h.Res)
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "a hit read joined to a write that never lands")
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout)
	err = cachetest.Guard(t, "Close", func() error { return h.C.Close() })
	h.MarkClosed()
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout, "Close with the committer stuck on the device")
}

// Finding 9: the engine's own join (a Save waits for the copies of the
// write before the previous one) is bounded too: with the device hung, the
// third Save fails the cache with ErrDeviceTimeout instead of hanging.
func TestHungDeviceBoundedJoin(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	cfg.WaitTimeout = 50 * time.Millisecond
	cfg.StagingDepth = 4
	h := cachetest.New(t, cfg)
	t.Cleanup(dev.Release)
	dev.Hang()
	var err error
	for i := int64(1); i <= 3 && err == nil; i++ {
		h.Assign(i, int32(i))
		h.Begin(cachetest.Step{Sched: []cachetest.S{{i, 0, 2}}, Arrive: []cachetest.A{{ID: i}}})
		_, err = h.TrySave(h.Outs())
	}
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "the Save that joins a write whose copy never completes")
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout)
	require.ErrorIs(t, h.C.Sync(), omnicache.ErrWriteFailed, "sticky")
	err = cachetest.Guard(t, "Close", func() error { return h.C.Close() })
	h.MarkClosed()
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout, "Close with the committer stuck on the device")
}

// Finding 6: a device tensor whose declared size exceeds its memory is
// this Save's ErrOutputs, not a failed copy that fails the cache.
func TestDeviceTensorLargerThanItsMemory(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.Device = true
	const a = 1
	h.Assign(a, 1, 2)
	h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}}, Arrive: []cachetest.A{{ID: a}}})
	o := h.Outs()
	d := &o.Tensors[0].Dev
	d.Host = d.Host[:len(d.Host)/2] // the buffer holds half of what it declares
	_, err := h.TrySave(o)
	require.ErrorIs(t, err, omnicache.ErrOutputs)
	require.NotErrorIs(t, err, omnicache.ErrWriteFailed)
	h.Usable()
}

// Finding 7: a staging page that cannot be allocated is a sticky write
// failure like any device failure (not a one-off ErrWriteFailed).
func TestStagingAllocFailureIsSticky(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	h := cachetest.New(t, cfg)
	dev.FailOpAfter(gputest.OpAllocHost, 0)
	const a = 1
	h.Assign(a, 1)
	h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}})
	_, err := h.TrySave(h.Outs())
	require.ErrorIs(t, err, omnicache.ErrWriteFailed)
	dev.Heal()
	require.ErrorIs(t, h.C.Begin(h.Plan(cachetest.Step{})), omnicache.ErrWriteFailed, "the failure is sticky")
	require.ErrorIs(t, h.C.Sync(), omnicache.ErrWriteFailed)
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
