package omnicache_test

// The write path, scenarios 19–24 of shared/SCENARIOS.md: stealing slots
// in transit, preempt + resume, finish and abort, deferred keys, the device
// byte budget and tenant succession with deferred keys.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Scenario 19: a new write claiming slots still in transit for an older
// task: the old task skips them, the newest rows win in the mirror. The
// older write is held in transit by a device whose Wait blocks.
func TestScenario19_StealInTransit(t *testing.T) {
	const a, b = 1, 2
	dev := newGatedDevice()
	cfg := testConfig()
	cfg.Device = dev
	h := newHarness(t, cfg)
	t.Cleanup(dev.open) // runs before the harness's Close
	h.device = true

	h.assign(a, 5)
	dev.arm()
	s1 := h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}})
	inTransit := dev.waitEntered(2 * time.Second)
	if !inTransit {
		t.Logf("no device Wait was observed for the first write: it may have landed already; checking the outcome only")
	}
	// A aborts; its block 5 goes to B, which writes it while A's write is
	// (held) in transit.
	h.assign(b, 5)
	s2 := h.step(step{Sched: []S{{b, 0, 4}}, Arrive: []A{{ID: b}}, Finished: []int64{a}})
	dev.open()

	h.mat(s1) // a step's own rows do not change when its slots are stolen
	h.mat(s2)
	for k := range h.cfg.Keys {
		h.expectBlock(k, 5, b, 0, 0)
	}
	h.checkMirror()
	if inTransit {
		assert.Positive(t, h.stats().RowsSkipped, "Stats.RowsSkipped: the older task must skip the stolen rows")
	}
}

// Scenario 20: preempt + resume onto the same block: the last row wins.
func TestScenario20_PreemptResumeSameBlock(t *testing.T) {
	const a, b, c = 1, 2, 3
	hitAfter := func(h *harness) {
		h.assign(c, 2, 9)
		h.mat(h.step(step{Sched: []S{{c, 4, 1}}, Arrive: []A{{ID: c, Hit: 4}}}))
		h.checkMirror()
	}

	t.Run("preempted and resumed in one plan", func(t *testing.T) {
		h := newHarness(t, testConfig())
		h.assign(a, 2, 3)
		h.assign(b, 6)
		h.mat(h.step(step{Sched: []S{{a, 0, 6}, {b, 0, 2}}, Arrive: []A{{ID: a}, {ID: b}}}))
		h.bump(a) // the recompute's rows differ from the first ones
		h.mat(h.step(step{Sched: []S{{a, 0, 6}, {b, 2, 1}}, Preempted: []int64{a}, Resumed: []int64{a}}))
		for k := range h.cfg.Keys {
			h.expectBlock(k, 2, a, 0, 1)
		}
		hitAfter(h)
	})

	t.Run("buffered rows, then preempted and resumed in one plan", func(t *testing.T) {
		h := newHarness(t, testConfig())
		h.assign(a, 2, 3)
		h.assign(b, 6, 7)
		h.mat(h.step(step{Sched: []S{{a, 0, 2}, {b, 0, 2}}, Arrive: []A{{ID: a}, {ID: b}}}))
		s2 := h.step(step{Sched: []S{{a, 2, 1}, {b, 2, 1}}}) // parked
		s3 := h.step(step{Sched: []S{{a, 3, 1}, {b, 3, 1}}}) // parked
		h.bump(a)
		s4 := h.step(step{Sched: []S{{a, 0, 4}, {b, 4, 1}}, Preempted: []int64{a}, Resumed: []int64{a}})
		h.mat(s4)
		h.mat(s2)
		h.mat(s3)
		for k := range h.cfg.Keys {
			h.expectBlock(k, 2, a, 0, 1) // the recompute wins over the parked rows
		}
		hitAfter(h)
	})

	t.Run("preempted, resumed onto the same block a step later", func(t *testing.T) {
		h := newHarness(t, testConfig())
		h.assign(a, 2, 3)
		h.assign(b, 6, 7)
		h.mat(h.step(step{Sched: []S{{a, 0, 2}, {b, 0, 2}}, Arrive: []A{{ID: a}, {ID: b}}}))
		h.mat(h.step(step{Sched: []S{{a, 2, 1}, {b, 2, 1}}}))
		h.mat(h.step(step{Sched: []S{{a, 3, 1}, {b, 3, 1}}}))
		h.mat(h.step(step{Sched: []S{{b, 4, 1}}, Preempted: []int64{a}}))
		h.bump(a)
		h.mat(h.step(step{Sched: []S{{a, 0, 4}, {b, 5, 1}}, Resumed: []int64{a}}))
		for k := range h.cfg.Keys {
			h.expectBlock(k, 2, a, 0, 1)
		}
		hitAfter(h)
	})
}

// Scenario 21: finish and abort: open writes (parked decode rows, steps not
// consumed yet) still land; a later hit on those blocks reads them. Abort
// never rolls back: discarding the aborted request's steps changes nothing.
func TestScenario21_FinishAbortLand(t *testing.T) {
	const a, b, c = 1, 2, 3
	for _, abort := range []bool{false, true} {
		name := "finish"
		if abort {
			name = "abort"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, testConfig())
			h.assign(a, 1, 2)
			h.assign(b, 3, 4)
			s1 := h.step(step{Sched: []S{{a, 0, 2}, {b, 0, 2}}, Arrive: []A{{ID: a}, {ID: b}}})
			s2 := h.step(step{Sched: []S{{a, 2, 1}, {b, 2, 1}}}) // parked
			s3 := h.step(step{Sched: []S{{a, 3, 1}, {b, 3, 1}}}) // parked
			// A leaves (its last outputs were saved in s3) with its writes open.
			s4 := h.step(step{Sched: []S{{b, 4, 1}}, Finished: []int64{a}})
			if abort {
				h.discard(s1)
				h.discard(s2)
				h.discard(s3)
			} else {
				h.mat(s1)
				h.mat(s2)
				h.mat(s3)
			}
			h.mat(s4)
			for k := range h.cfg.Keys {
				h.expectBlock(k, 1, a, 0, 0)
			}
			h.assign(c, 1, 5)
			h.mat(h.step(step{Sched: []S{{b, 5, 1}, {c, 4, 2}}, Arrive: []A{{ID: c, Hit: 4}}}))
			require.Equal(t, 4, h.res.Prefix(1), "C's hit on A's block")
			h.checkMirror()
		})
	}
}

// Scenario 22: a deferred key's rows accumulate over decode steps, are
// readable while pending (a hit reads them), and land at finish; a finish
// of one request sharing a step clone with another keeps the budget charged
// until the last one finished.
func TestScenario22_DeferredKey(t *testing.T) {
	const a, b, c = 1, 2, 3
	h := newHarness(t, testConfig(keyHidden, keyCodes))
	h.device = true
	hid, cod := h.keyIndex("hidden"), h.keyIndex("codes")
	h.assign(a, 1, 2)
	h.assign(b, 3, 4, 6)
	h.mat(h.step(step{Sched: []S{{a, 0, 4}, {b, 0, 4}}, Arrive: []A{{ID: a}, {ID: b}}})) // one clone, two requests
	for pos := 4; pos < 7; pos++ {
		h.mat(h.step(step{Sched: []S{{a, pos, 1}, {b, pos, 1}}}))
	}
	h.sync()
	require.Positive(t, h.stats().BudgetCharged, "pending deferred rows are held on the device and charged")
	h.expectBlock(hid, 1, a, 0, 0)  // immediate rows landed
	h.expectBlock(cod, 1, -1, 0, 0) // deferred rows of a live request stay pending

	// C hits A's block 1 while A's deferred rows are pending.
	h.assign(c, 1, 5)
	h.mat(h.step(step{Sched: []S{{a, 7, 1}, {b, 7, 1}, {c, 4, 2}}, Arrive: []A{{ID: c, Hit: 4}}}))
	require.Equal(t, 4, h.res.Prefix(2), "C's hit on A's block")

	// A finishes: its deferred rows land; B's (same step clones) stay
	// pending and charged.
	h.mat(h.step(step{Sched: []S{{b, 8, 1}, {c, 6, 1}}, Finished: []int64{a}}))
	h.sync()
	h.expectBlock(cod, 1, a, 0, 0)
	h.expectBlock(cod, 2, a, 4, 0)
	h.expectBlock(cod, 3, -1, 0, 0)
	require.Positive(t, h.stats().BudgetCharged, "B still holds deferred rows of the shared clones")

	h.drain(b, c)
	h.sync()
	h.expectBlock(cod, 3, b, 0, 0)
	h.expectBlock(cod, 4, b, 4, 0)
	st := h.stats()
	assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
	assert.Positive(t, st.DeferredWrites, "Stats.DeferredWrites")
	assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak <= BudgetLimit")
	h.checkMirror(hid, cod)
}

// Scenario 23: with a budget of 3 step clones of the deferred key, the 4th
// forces the oldest pending write out; charged bytes never exceed the
// budget and return to 0 when idle.
func TestScenario23_BudgetPressure(t *testing.T) {
	const r, q = 1, 2
	const chunk = 4 // tokens per step
	clone := int64(chunk * keyCodes.RowBytes)
	cfg := testConfig(keyCodes) // the only key: every device byte is a deferred clone
	cfg.DeviceBudgetBytes = 3 * clone
	cfg.DeferredChunkBytes = clone
	h := newHarness(t, cfg)
	h.device = true
	check := func(when string) {
		st := h.stats()
		require.LessOrEqual(t, st.BudgetCharged, st.BudgetLimit, "Stats.BudgetCharged %s", when)
		require.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak %s", when)
	}
	h.assign(r, 1, 2, 3, 4, 5)
	for i := 0; i < 4; i++ {
		st := step{Sched: []S{{r, i * chunk, chunk}}}
		if i == 0 {
			st.Arrive = []A{{ID: r}}
		}
		s := h.step(st)
		check("after Save")
		h.mat(s)
		check("after Materialize")
	}
	st := h.stats()
	require.EqualValues(t, 3*clone, st.BudgetLimit, "Stats.BudgetLimit")
	require.Positive(t, st.BudgetFlushes, "the 4th clone must force the oldest pending write out (Stats.BudgetFlushes)")
	h.sync()
	h.expectBlock(0, 1, r, 0, 0) // the oldest chunk was written early, R still live

	// Q hits R's first 3 blocks: rows partly in the mirror, partly pending.
	h.assign(q, 1, 2, 3, 6)
	h.mat(h.step(step{Sched: []S{{r, 16, 1}, {q, 12, 2}}, Arrive: []A{{ID: q, Hit: 12}}}))
	check("after the hit")
	h.drain(r, q)
	h.sync()
	st = h.stats()
	assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
	assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak")
	h.checkMirror(0)
}

// Scenario 24: tenant succession with deferred keys: B reuses A's block;
// finishing B then A (or A then B) leaves B's rows.
func TestScenario24_DeferredTenantSuccession(t *testing.T) {
	const a, b, d = 1, 2, 4
	for _, bFirst := range []bool{true, false} {
		name := "finish B then A"
		if !bFirst {
			name = "finish A then B"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, testConfig(keyHidden, keyCodes))
			h.device = true
			h.assign(a, 5)
			h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
			// A is preempted (its block freed; its deferred rows still
			// pending); B gets block 5 and writes it.
			h.assign(b, 5, 7)
			h.mat(h.step(step{Sched: []S{{b, 0, 4}}, Arrive: []A{{ID: b}}, Preempted: []int64{a}}))
			if bFirst {
				h.bump(a)
				h.assign(a, 6)
				h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Finished: []int64{b}, Resumed: []int64{a}}))
				h.drain(a)
			} else {
				h.mat(h.step(step{Sched: []S{{b, 4, 1}}, Finished: []int64{a}}))
				h.drain(b)
			}
			for k := range h.cfg.Keys {
				h.expectBlock(k, 5, b, 0, 0)
			}
			h.checkMirror(0, 1)
			h.assign(d, 5, 8)
			h.mat(h.step(step{Sched: []S{{d, 4, 2}}, Arrive: []A{{ID: d, Hit: 4}}}))
			require.Equal(t, 4, h.res.Prefix(0))
			h.drain(d)
			h.checkMirror(0, 1)
			assert.Zero(t, h.stats().BudgetCharged, "Stats.BudgetCharged once every request finished")
		})
	}
}
