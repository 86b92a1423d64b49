package omnicache_test

// The newest rows win: stealing slots in transit, preempt + resume,
// finish and abort, deferred keys, and tenant succession with deferred
// keys: the mirror and every later hit hold the rows of the last write in
// step order. (The device byte budget is in budget_test.go.)

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/internal/cachetest"
)

// A new write claiming slots still in transit for an older
// task: the old task skips them, the newest rows win in the mirror. The
// older write is held in transit by a device whose Wait blocks.
func TestStealInTransit(t *testing.T) {
	const a, b = 1, 2
	dev := cachetest.NewGateDevice()
	cfg := cachetest.Config()
	cfg.Device = dev
	h := cachetest.New(t, cfg)
	t.Cleanup(dev.Open) // runs before the harness's Close
	h.Device = true

	h.Assign(a, 5)
	dev.Arm()
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}})
	inTransit := dev.WaitEntered(2 * time.Second)
	if !inTransit {
		t.Logf("no device Wait was observed for the first write: it may have landed already; checking the outcome only")
	}
	// A aborts; its block 5 goes to B, which writes it while A's write is
	// (held) in transit.
	h.Assign(b, 5)
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}, Finished: []int64{a}})
	dev.Open()

	h.Mat(s1) // a step's own rows do not change when its slots are stolen
	h.Mat(s2)
	for k := range h.Cfg.Keys {
		h.ExpectBlock(k, 5, b, 0, 0)
	}
	h.CheckMirror()
	if inTransit {
		assert.Positive(t, h.Stats().RowsSkipped, "Stats.RowsSkipped: the older task must skip the stolen rows")
	}
}

// Preempt + resume onto the same block: the last row wins.
func TestPreemptResumeSameBlock(t *testing.T) {
	const a, b, c = 1, 2, 3
	hitAfter := func(h *cachetest.Harness) {
		h.Assign(c, 2, 9)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{c, 4, 1}}, Arrive: []cachetest.A{{ID: c, Hit: 4}}}))
		h.CheckMirror()
	}

	t.Run("preempted and resumed in one plan", func(t *testing.T) {
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 2, 3)
		h.Assign(b, 6)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}, {b, 0, 2}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
		h.Bump(a) // the recompute's rows differ from the first ones
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}, {b, 2, 1}}, Preempted: []int64{a}, Resumed: []int64{a}}))
		for k := range h.Cfg.Keys {
			h.ExpectBlock(k, 2, a, 0, 1)
		}
		hitAfter(h)
	})

	t.Run("buffered rows, then preempted and resumed in one plan", func(t *testing.T) {
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 2, 3)
		h.Assign(b, 6, 7)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}, {b, 0, 2}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
		s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 2, 1}, {b, 2, 1}}}) // parked
		s3 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 3, 1}, {b, 3, 1}}}) // parked
		h.Bump(a)
		s4 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}, {b, 4, 1}}, Preempted: []int64{a}, Resumed: []int64{a}})
		h.Mat(s4)
		h.Mat(s2)
		h.Mat(s3)
		for k := range h.Cfg.Keys {
			h.ExpectBlock(k, 2, a, 0, 1) // the recompute wins over the parked rows
		}
		hitAfter(h)
	})

	t.Run("preempted, resumed onto the same block a step later", func(t *testing.T) {
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 2, 3)
		h.Assign(b, 6, 7)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}, {b, 0, 2}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 2, 1}, {b, 2, 1}}}))
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 3, 1}, {b, 3, 1}}}))
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 1}}, Preempted: []int64{a}}))
		h.Bump(a)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}, {b, 5, 1}}, Resumed: []int64{a}}))
		for k := range h.Cfg.Keys {
			h.ExpectBlock(k, 2, a, 0, 1)
		}
		hitAfter(h)
	})
}

// Finish and abort: open writes (parked decode rows, steps not
// consumed yet) still land; a later hit on those blocks reads them. Abort
// never rolls back: discarding the aborted request's steps changes nothing.
func TestFinishAbortLand(t *testing.T) {
	const a, b, c = 1, 2, 3
	for _, abort := range []bool{false, true} {
		name := "finish"
		if abort {
			name = "abort"
		}
		t.Run(name, func(t *testing.T) {
			h := cachetest.New(t, cachetest.Config())
			h.Assign(a, 1, 2)
			h.Assign(b, 3, 4)
			s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}, {b, 0, 2}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}})
			s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 2, 1}, {b, 2, 1}}}) // parked
			s3 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 3, 1}, {b, 3, 1}}}) // parked
			// A leaves (its last outputs were saved in s3) with its writes open.
			s4 := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 1}}, Finished: []int64{a}})
			if abort {
				h.Discard(s1)
				h.Discard(s2)
				h.Discard(s3)
			} else {
				h.Mat(s1)
				h.Mat(s2)
				h.Mat(s3)
			}
			h.Mat(s4)
			for k := range h.Cfg.Keys {
				h.ExpectBlock(k, 1, a, 0, 0)
			}
			h.Assign(c, 1, 5)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 5, 1}, {c, 4, 2}}, Arrive: []cachetest.A{{ID: c, Hit: 4}}}))
			require.Equal(t, 4, h.Res.Prefix(1), "C's hit on A's block")
			h.CheckMirror()
		})
	}
}

// A deferred key's rows accumulate over decode steps, are
// readable while pending (a hit reads them), and land at finish; a finish
// of one request sharing a step clone with another keeps the budget charged
// until the last one finished.
func TestDeferredKey(t *testing.T) {
	const a, b, c = 1, 2, 3
	h := cachetest.New(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyCodes))
	h.Device = true
	hid, cod := h.KeyIndex("hidden"), h.KeyIndex("codes")
	h.Assign(a, 1, 2)
	h.Assign(b, 3, 4, 6)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}, {b, 0, 4}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}})) // one clone, two requests
	for pos := 4; pos < 7; pos++ {
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, int64(pos), 1}, {b, int64(pos), 1}}}))
	}
	h.Sync()
	require.Positive(t, h.Stats().BudgetCharged, "pending deferred rows are held on the device and charged")
	h.ExpectBlock(hid, 1, a, 0, 0)  // immediate rows landed
	h.ExpectBlock(cod, 1, -1, 0, 0) // deferred rows of a live request stay pending

	// C hits A's block 1 while A's deferred rows are pending.
	h.Assign(c, 1, 5)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 7, 1}, {b, 7, 1}, {c, 4, 2}}, Arrive: []cachetest.A{{ID: c, Hit: 4}}}))
	require.Equal(t, 4, h.Res.Prefix(2), "C's hit on A's block")

	// A finishes: its deferred rows land; B's (same step clones) stay
	// pending and charged.
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 1}, {c, 6, 1}}, Finished: []int64{a}}))
	h.Sync()
	h.ExpectBlock(cod, 1, a, 0, 0)
	h.ExpectBlock(cod, 2, a, 4, 0)
	h.ExpectBlock(cod, 3, -1, 0, 0)
	require.Positive(t, h.Stats().BudgetCharged, "B still holds deferred rows of the shared clones")

	h.Drain(b, c)
	h.Sync()
	h.ExpectBlock(cod, 3, b, 0, 0)
	h.ExpectBlock(cod, 4, b, 4, 0)
	st := h.Stats()
	assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
	assert.Positive(t, st.DeferredWrites, "Stats.DeferredWrites")
	assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak <= BudgetLimit")
	h.CheckMirror(hid, cod)
}

// Tenant succession with deferred keys: B reuses A's block;
// finishing B then A (or A then B) leaves B's rows.
func TestDeferredTenantSuccession(t *testing.T) {
	const a, b, d = 1, 2, 4
	for _, bFirst := range []bool{true, false} {
		name := "finish B then A"
		if !bFirst {
			name = "finish A then B"
		}
		t.Run(name, func(t *testing.T) {
			h := cachetest.New(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyCodes))
			h.Device = true
			h.Assign(a, 5)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			// A is preempted (its block freed; its deferred rows still
			// pending); B gets block 5 and writes it.
			h.Assign(b, 5, 7)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}, Preempted: []int64{a}}))
			if bFirst {
				h.Bump(a)
				h.Assign(a, 6)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Finished: []int64{b}, Resumed: []int64{a}}))
				h.Drain(a)
			} else {
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 1}}, Finished: []int64{a}}))
				h.Drain(b)
			}
			for k := range h.Cfg.Keys {
				h.ExpectBlock(k, 5, b, 0, 0)
			}
			h.CheckMirror(0, 1)
			h.Assign(d, 5, 8)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{d, 4, 2}}, Arrive: []cachetest.A{{ID: d, Hit: 4}}}))
			require.Equal(t, 4, h.Res.Prefix(0))
			h.Drain(d)
			h.CheckMirror(0, 1)
			assert.Zero(t, h.Stats().BudgetCharged, "Stats.BudgetCharged once every request finished")
		})
	}
}
