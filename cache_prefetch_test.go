package omnicache_test

// Hit prefetch and late reads: a step's hit rows move at Begin, in queue
// order, so a Materialize that comes after the hit's blocks were given to
// another request and rewritten still serves the planned rows; without
// prefetch (or beyond the read-ahead budget) that request alone fails.

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

// lateReadSetup saves, in step 2, b's hit on a's block 1 next to d (no
// hit), then gives block 1 to c, which rewrites it in step 3, and syncs:
// step 2 is read after its hit rows were replaced.
func lateReadSetup(t *testing.T, cfg omnicache.Config) (h *harness, s2 omnicache.StepID) {
	const a, b, c, d = 1, 2, 3, 4
	h = newHarness(t, cfg)
	h.assign(a, 1)
	h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
	h.sync()
	h.assign(b, 1, 2)
	h.assign(d, 3, 4)
	s2 = h.step(step{Sched: []S{{b, 4, 2}, {d, 0, 3}}, Arrive: []A{{ID: b, Hit: 4}, {ID: d}}, Finished: []int64{a}})
	h.unassign(b)
	h.assign(c, 1)
	h.mat(h.step(step{Sched: []S{{c, 0, 4}, {d, 3, 1}}, Arrive: []A{{ID: c}}, Finished: []int64{b}}))
	h.mat(h.step(step{Sched: []S{{d, 4, 1}}, Finished: []int64{c}})) // c's deferred rows land too
	h.sync()
	require.True(t, h.rewrittenSince(s2, []int64{b}), "setup: b's hit slots were rewritten")
	return h, s2
}

func TestLateReadAfterReassignment(t *testing.T) {
	const b, d = 2, 4
	keys := []omnicache.Key{keyHidden, keyAux, keyCodes}
	t.Run("prefetch serves the planned rows", func(t *testing.T) {
		h, s2 := lateReadSetup(t, testConfig(keys...))
		h.mat(s2) // exact rows, no error
		require.Zero(t, h.stats().ReadAheadBytes, "the step's prefetch buffers are released")
		usable(h)
	})
	t.Run("prefetch off: the moved request fails, the other is served", func(t *testing.T) {
		cfg := testConfig(keys...)
		cfg.DisablePrefetch = true
		h, s2 := lateReadSetup(t, cfg)
		err := h.matCall(s2, nil, &h.res)
		var re *omnicache.RequestError
		require.ErrorAs(t, err, &re)
		require.ErrorIs(t, err, omnicache.ErrReassigned)
		require.Equal(t, []int64{b}, re.IDs)
		require.Equal(t, s2, re.Step)
		require.ErrorIs(t, h.res.Err(0), omnicache.ErrReassigned, "b")
		require.NoError(t, h.res.Err(1), "d")
		require.NoError(t, h.verifyServed(s2, nil, &h.res, map[int64]error{b: re.Errs[0]}), "d's rows exact, b's zero")
		checkConsumed(h, s2)
		usable(h)
	})
	t.Run("read-ahead budget exhausted: named in the error", func(t *testing.T) {
		cfg := testConfig(keys...)
		cfg.ReadAheadBytes = 1 // no step fits
		h, s2 := lateReadSetup(t, cfg)
		err := h.matCall(s2, nil, &h.res)
		require.ErrorIs(t, err, omnicache.ErrReassigned)
		require.Contains(t, err.Error(), "read-ahead budget")
		require.NoError(t, h.res.Err(1), "d")
		checkConsumed(h, s2)
		usable(h)
	})
	t.Run("a subset asked", func(t *testing.T) {
		h, s2 := lateReadSetup(t, testConfig(keys...))
		h.mat(s2, d, b) // copied out of the prefetch buffers, in the order asked
		usable(h)
	})
}

// A step with two hits, one over rows of the required key that were never
// written: that request fails with ErrAbsentRequired in a RequestError,
// the other request's rows are exact, and the step is consumed.
func TestMaterializePerRequest(t *testing.T) {
	const a, b, e = 1, 2, 3
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			cfg := testConfig()
			cfg.DisablePrefetch = !prefetch
			h := newHarness(t, cfg)
			h.assign(a, 1)
			h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
			h.assign(b, 1, 2)
			h.assign(e, 5, 6) // block 5 never written
			s := h.step(step{Sched: []S{{e, 4, 1}, {b, 4, 1}}, Arrive: []A{{ID: b, Hit: 4}, {ID: e, Hit: 4}}, Finished: []int64{a}})
			err := h.matCall(s, nil, &h.res)
			var re *omnicache.RequestError
			require.ErrorAs(t, err, &re)
			require.ErrorIs(t, err, omnicache.ErrAbsentRequired)
			require.Equal(t, []int64{e}, re.IDs)
			require.NoError(t, h.verifyServed(s, nil, &h.res, map[int64]error{e: re.Errs[0]}))
			checkConsumed(h, s)
			usable(h)
		})
	}
}

// Abort and Discard of a prefetched step while its read is still queued
// behind a write in transit: the read is skipped, the buffers and the
// budget come back, Stats show nothing of the aborted step, and the same
// plan run again serves its hit.
func TestPrefetchAbandoned(t *testing.T) {
	const a, b = 1, 2
	for _, how := range []string{"Abort", "Discard"} {
		t.Run(how, func(t *testing.T) {
			dev := newLagDevice()
			cfg := testConfig(keyHidden, keyAux, keyCodes)
			cfg.Device = dev
			h := newHarness(t, cfg)
			h.assign(a, 1)
			stop := dev.hold()
			sa := h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}})
			w := stop() // a's write stays in transit: b's prefetch waits behind it
			require.NotZero(t, w)
			h.assign(b, 1, 2)
			hit := step{Sched: []S{{b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}}
			before := h.stats()
			switch how {
			case "Abort":
				require.NoError(t, h.tryBegin(hit))
				require.Positive(t, h.stats().ReadAheadBytes, "Begin charged the prefetch buffers")
				require.NoError(t, h.c.Abort())
				h.pending = nil
				delete(h.live, b)
			case "Discard":
				h.discard(h.step(hit))
			}
			dev.release(w)
			h.mat(sa)
			h.sync()
			after := h.stats()
			require.Zero(t, after.ReadAheadBytes, "the read-ahead budget is back")
			require.Zero(t, after.PagesInUse)
			if how == "Abort" {
				require.Equal(t, before.HitRequests, after.HitRequests, "an aborted step's hit is not counted")
				require.Equal(t, before.HitRowsRead, after.HitRowsRead)
				require.Equal(t, before.Steps, after.Steps)
				h.mat(h.step(hit))
				require.Equal(t, 4, h.res.Prefix(0), "the hit is served when the step runs again")
			}
			usable(h)
		})
	}
}

// ErrReassigned never reaches a caller with prefetch on, however late the
// read: many steps, every one read after its blocks were rewritten.
func TestLateReadsNeverReassigned(t *testing.T) {
	keys := []omnicache.Key{keyHidden, keyAux, keyCodes}
	cfg := testConfig(keys...)
	cfg.StagingDepth = 8
	h := newHarness(t, cfg)
	var late []omnicache.StepID
	id := int64(1)
	prev := int64(0)
	for i := 0; i < 6; i++ {
		cur := id
		id++
		h.assign(cur, 1, 2)
		st := step{Sched: []S{{cur, 0, 6}}, Arrive: []A{{ID: cur}}}
		if prev != 0 {
			// cur hits prev's first block, then rewrites its second.
			st = step{Sched: []S{{cur, 4, 2}}, Arrive: []A{{ID: cur, Hit: 4}}, Finished: []int64{prev}}
		}
		late = append(late, h.step(st))
		h.mat(h.step(step{Sched: []S{{cur, 6, 2}}}))
		// the next request takes block 1 over and rewrites it
		h.unassign(cur)
		h.assign(id, 1)
		h.mat(h.step(step{Sched: []S{{id, 0, 4}}, Arrive: []A{{ID: id}}, Finished: []int64{cur}}))
		prev = id
		id++
		h.assign(prev, 1, 2)
	}
	h.sync()
	for _, s := range late {
		err := h.matCall(s, nil, &h.res)
		require.False(t, errors.Is(err, omnicache.ErrReassigned), "step %v: %v", s, err)
		require.NoError(t, err)
		require.NoError(t, h.verify(s, nil, &h.res))
	}
	usable(h)
}

// A prefetched step consumed while the committer is held up (here by
// in-order work queued before the step's Begin; in an engine, by a backlog
// of earlier writes): Materialize does not wait for the committer to get
// to the read past the ahead wait (reader.DefaultAheadWait), it reads the
// hit rows itself (Stats.HitReadsOnCaller), of the whole step and of a
// subset, exactly, and gives the read-ahead budget back. The earlier writes the read does not need (e's, to other
// blocks) are not waited for either.
func TestMaterializeReadsUnstartedPrefetch(t *testing.T) {
	const a, b, d, e = 1, 2, 3, 4
	for _, subset := range []bool{false, true} {
		t.Run(fmt.Sprintf("subset=%v", subset), func(t *testing.T) {
			h := newHarness(t, testConfig(keyHidden, keyAux, keyCodes))
			h.assign(a, 1)
			h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
			h.sync()
			release := omnicache.HoldCommitter(h.c)
			t.Cleanup(release)
			h.assign(e, 5)
			se := h.step(step{Sched: []S{{e, 0, 4}}, Arrive: []A{{ID: e}}}) // queued, not landed
			h.assign(b, 1, 2)
			h.assign(d, 3)
			before := h.stats()
			s := h.step(step{Sched: []S{{d, 0, 3}, {b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}, {ID: d}}, Finished: []int64{a}})
			require.Positive(t, h.stats().ReadAheadBytes, "Begin charged the prefetch buffers")
			if subset {
				h.mat(s, b) // exact rows while the committer is still held
			} else {
				h.mat(s)
			}
			after := h.stats()
			require.Equal(t, before.HitReadsOnCaller+1, after.HitReadsOnCaller, "read on the caller's goroutine")
			require.Equal(t, before.HitRowsRead+4, after.HitRowsRead)
			require.Zero(t, after.ReadAheadBytes, "the read-ahead budget is back at once")
			require.Zero(t, omnicache.ReadsHandedBack(h.c))
			release()
			h.mat(se)
			h.sync()
			require.Equal(t, after.HitReadsOnCaller, h.stats().HitReadsOnCaller, "the committer skipped the read")
			usable(h)
		})
	}
}

// A prefetched step consumed while the committer works and is about to
// reach its read (here held at in-order work queued before the step's
// Begin, released 10 ms later, within the ahead wait): Materialize leaves
// the read to the committer, whose in-order read serves the exact rows,
// rather than read them itself (which would hold the committer at them).
// The wait spins: not on one P, where the consumer reads at once.
func TestMaterializeLeavesAWorkingCommitterItsRead(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	const a, b = 1, 2
	for _, subset := range []bool{false, true} {
		t.Run(fmt.Sprintf("subset=%v", subset), func(t *testing.T) {
			h := newHarness(t, testConfig(keyHidden, keyAux, keyCodes))
			omnicache.SetAheadWait(h.c, deadlockTimeout)
			h.assign(a, 1)
			h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
			h.sync()
			release := omnicache.HoldWorkingCommitter(h.c)
			t.Cleanup(release)
			h.assign(b, 1, 2)
			before := h.stats()
			s := h.step(step{Sched: []S{{b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}})
			time.AfterFunc(10*time.Millisecond, release)
			if subset {
				h.mat(s, b)
			} else {
				h.mat(s)
			}
			after := h.stats()
			require.Equal(t, before.HitReadsOnCaller, after.HitReadsOnCaller, "served by the committer's read")
			require.Equal(t, before.HitRowsRead+4, after.HitRowsRead)
			require.Zero(t, after.ReadAheadBytes, "the read-ahead budget is back")
			usable(h)
		})
	}
}

// A prefetched step whose hit blocks were rewritten before it was consumed,
// while its read was still queued: Materialize begins the read itself,
// finds a row claimed since the plan (the new tenant's Save changed the
// deferred key's occupancy), hands the read back to the committer and
// waits for it; the committer reads in order, before the new tenant's
// rows land, so the planned rows are served, never ErrReassigned.
func TestMaterializeHandsBackARewrittenHit(t *testing.T) {
	const a, b, c, z = 1, 2, 3, 4
	h := newHarness(t, testConfig(keyHidden, keyAux, keyCodes))
	h.assign(a, 1)
	h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
	h.assign(z, 9)
	h.mat(h.step(step{Sched: []S{{z, 0, 1}}, Arrive: []A{{ID: z}}, Finished: []int64{a}}))
	h.sync() // a's deferred rows are in the mirror too
	release := omnicache.HoldCommitter(h.c)
	t.Cleanup(release)
	h.assign(b, 1, 2)
	before := h.stats()
	sb := h.step(step{Sched: []S{{b, 4, 2}}, Arrive: []A{{ID: b, Hit: 4}}})
	h.unassign(b)
	h.assign(c, 1)
	sc := h.step(step{Sched: []S{{c, 0, 4}}, Arrive: []A{{ID: c}}, Finished: []int64{b}})
	require.True(t, h.rewrittenSince(sb, []int64{b}), "setup: b's hit slots were rewritten")
	go func() {
		for omnicache.ReadsHandedBack(h.c) == 0 { // Materialize waits for the committer now
			time.Sleep(time.Millisecond)
		}
		release()
	}()
	h.mat(sb) // the planned rows (a's), no error
	require.Equal(t, int64(1), omnicache.ReadsHandedBack(h.c))
	require.Equal(t, before.HitReadsOnCaller, h.stats().HitReadsOnCaller, "served by the committer's read")
	h.mat(sc)
	h.sync()
	require.Zero(t, h.stats().ReadAheadBytes)
	usable(h)
}

// A hit on a block whose newest write is still queued joins that write:
// the rows served are the new write's, never the block's older ones, even
// when Materialize reads the hit itself (the committer held up before it).
// The write is a short step (its slots give its blocks) or a long one (its
// blocks read off the block table); the hit is on the write's last block.
func TestHitJoinsQueuedWriteOfItsBlock(t *testing.T) {
	const x, a, b = 1, 2, 3
	for _, prefetch := range []bool{true, false} {
		for _, long := range []bool{false, true} {
			t.Run(fmt.Sprintf("prefetch=%v/long=%v", prefetch, long), func(t *testing.T) {
				cfg := testConfig(keyHidden, keyAux)
				cfg.DisablePrefetch = !prefetch
				h := newHarness(t, cfg)
				h.assign(x, 1, 2)
				h.mat(h.step(step{Sched: []S{{x, 0, 8}}, Arrive: []A{{ID: x}}})) // blocks 1 and 2's older rows
				h.sync()
				release := omnicache.HoldCommitter(h.c)
				t.Cleanup(release)
				h.unassign(x)
				h.assign(a, 1, 2)
				if !long { // blocks 1 and 2 in two short steps
					h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}, Finished: []int64{x}}))
					h.mat(h.step(step{Sched: []S{{a, 4, 4}}}))
				} else {
					h.mat(h.step(step{Sched: []S{{a, 0, 8}}, Arrive: []A{{ID: a}}, Finished: []int64{x}})) // one step of 8 tokens, queued behind the hold
				}
				h.assign(b, 2, 5)
				sb := h.step(step{Sched: []S{{b, 4, 1}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}})
				time.AfterFunc(20*time.Millisecond, release) // Materialize is waiting for a's write by then (or not yet: the rows are a's either way)
				h.mat(sb)
				usable(h)
			})
		}
	}
}
