package omnicache_test

// Failure and locking, scenarios 27 and 28 of shared/SCENARIOS.md.

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// Scenario 27: a failed copy is sticky: every later call returns
// ErrWriteFailed; nothing hangs (every call runs under the deadlock
// detector); pages, budget and goroutines are released by Close. The fault
// is injected after n successful copies, for several n, so that it hits
// different copies (step clones, parked decode rows, deferred rows).
func TestScenario27_StickyWriteFailure(t *testing.T) {
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

// Scenario 28: the state lock is never held while waiting for a copy:
// while the committer is blocked in a device Wait for one write, Stats, a
// Materialize of another (already host-ready) step, and the engine's next
// Begin and Save all return.
func TestScenario28_NoLockAcrossWaits(t *testing.T) {
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
		"the write of a step with device tensors never waited on its device event (gpu.Device.Wait): scenario 28 holds the committer there")

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
