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
	"github.com/omnicache/omnicache/internal/cachetest"
)

// lateReadSetup saves, in step 2, b's hit on a's block 1 next to d (no
// hit), then gives block 1 to c, which rewrites it in step 3, and syncs:
// step 2 is read after its hit rows were replaced.
func lateReadSetup(t *testing.T, cfg omnicache.Config) (h *cachetest.Harness, s2 omnicache.StepID) {
	const a, b, c, d = 1, 2, 3, 4
	h = cachetest.New(t, cfg)
	h.Assign(a, 1)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Sync()
	h.Assign(b, 1, 2)
	h.Assign(d, 3, 4)
	s2 = h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 2}, {d, 0, 3}}, Arrive: []cachetest.A{{ID: b, Hit: 4}, {ID: d}}, Finished: []int64{a}})
	h.Unassign(b)
	h.Assign(c, 1)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}, {d, 3, 1}}, Arrive: []cachetest.A{{ID: c}}, Finished: []int64{b}}))
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{d, 4, 1}}, Finished: []int64{c}})) // c's deferred rows land too
	h.Sync()
	require.True(t, h.RewrittenSince(s2, []int64{b}), "setup: b's hit slots were rewritten")
	return h, s2
}

func TestLateReadAfterReassignment(t *testing.T) {
	const b, d = 2, 4
	keys := []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes}
	t.Run("prefetch serves the planned rows", func(t *testing.T) {
		h, s2 := lateReadSetup(t, cachetest.Config(keys...))
		h.Mat(s2) // exact rows, no error
		require.Zero(t, h.Stats().ReadAheadBytes, "the step's prefetch buffers are released")
		h.Usable()
	})
	t.Run("prefetch off: the moved request fails, the other is served", func(t *testing.T) {
		cfg := cachetest.Config(keys...)
		cfg.DisablePrefetch = true
		h, s2 := lateReadSetup(t, cfg)
		err := h.MatCall(s2, nil, &h.Res)
		var re *omnicache.RequestError
		require.ErrorAs(t, err, &re)
		require.ErrorIs(t, err, omnicache.ErrReassigned)
		require.Equal(t, []int64{b}, re.IDs)
		require.Equal(t, s2, re.Step)
		require.ErrorIs(t, h.Res.Err(0), omnicache.ErrReassigned, "b")
		require.NoError(t, h.Res.Err(1), "d")
		require.NoError(t, h.VerifyServed(s2, nil, &h.Res, map[int64]error{b: re.Errs[0]}), "d's rows exact, b's zero")
		h.CheckConsumed(s2)
		h.Usable()
	})
	t.Run("read-ahead budget exhausted: named in the error", func(t *testing.T) {
		cfg := cachetest.Config(keys...)
		cfg.ReadAheadBytes = 1 // no step fits
		h, s2 := lateReadSetup(t, cfg)
		err := h.MatCall(s2, nil, &h.Res)
		require.ErrorIs(t, err, omnicache.ErrReassigned)
		require.Contains(t, err.Error(), "read-ahead budget")
		require.NoError(t, h.Res.Err(1), "d")
		h.CheckConsumed(s2)
		h.Usable()
	})
	t.Run("a subset asked", func(t *testing.T) {
		h, s2 := lateReadSetup(t, cachetest.Config(keys...))
		h.Mat(s2, d, b) // copied out of the prefetch buffers, in the order asked
		h.Usable()
	})
}

// A step with two hits, one over rows of the required key that were never
// written: that request fails with ErrAbsentRequired in a RequestError,
// the other request's rows are exact, and the step is consumed.
func TestMaterializePerRequest(t *testing.T) {
	const a, b, e = 1, 2, 3
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			cfg := cachetest.Config()
			cfg.DisablePrefetch = !prefetch
			h := cachetest.New(t, cfg)
			h.Assign(a, 1)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			h.Assign(b, 1, 2)
			h.Assign(e, 5, 6) // block 5 never written
			s := h.Step(cachetest.Step{Sched: []cachetest.S{{e, 4, 1}, {b, 4, 1}}, Arrive: []cachetest.A{{ID: b, Hit: 4}, {ID: e, Hit: 4}}, Finished: []int64{a}})
			err := h.MatCall(s, nil, &h.Res)
			var re *omnicache.RequestError
			require.ErrorAs(t, err, &re)
			require.ErrorIs(t, err, omnicache.ErrAbsentRequired)
			require.Equal(t, []int64{e}, re.IDs)
			require.NoError(t, h.VerifyServed(s, nil, &h.Res, map[int64]error{e: re.Errs[0]}))
			h.CheckConsumed(s)
			h.Usable()
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
			dev := cachetest.NewGateDevice()
			cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes)
			cfg.Device = dev
			h := cachetest.New(t, cfg)
			h.Assign(a, 1)
			stop := dev.Hold()
			sa := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}})
			w := stop() // a's write stays in transit: b's prefetch waits behind it
			require.NotZero(t, w)
			h.Assign(b, 1, 2)
			hit := cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}}
			before := h.Stats()
			switch how {
			case "Abort":
				require.NoError(t, h.TryBegin(hit))
				require.Positive(t, h.Stats().ReadAheadBytes, "Begin charged the prefetch buffers")
				h.AbortBegun()
			case "Discard":
				h.Discard(h.Step(hit))
			}
			dev.Release(w)
			h.Mat(sa)
			h.Sync()
			after := h.Stats()
			require.Zero(t, after.ReadAheadBytes, "the read-ahead budget is back")
			require.Zero(t, after.PagesInUse)
			if how == "Abort" {
				require.Equal(t, before.HitRequests, after.HitRequests, "an aborted step's hit is not counted")
				require.Equal(t, before.HitRowsRead, after.HitRowsRead)
				require.Equal(t, before.Steps, after.Steps)
				h.Mat(h.Step(hit))
				require.Equal(t, 4, h.Res.Prefix(0), "the hit is served when the step runs again")
			}
			h.Usable()
		})
	}
}

// ErrReassigned never reaches a caller with prefetch on, however late the
// read: many steps, every one read after its blocks were rewritten.
func TestLateReadsNeverReassigned(t *testing.T) {
	keys := []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes}
	cfg := cachetest.Config(keys...)
	cfg.StagingDepth = 8
	h := cachetest.New(t, cfg)
	var late []omnicache.StepID
	id := int64(1)
	prev := int64(0)
	for i := 0; i < 6; i++ {
		cur := id
		id++
		h.Assign(cur, 1, 2)
		st := cachetest.Step{Sched: []cachetest.S{{cur, 0, 6}}, Arrive: []cachetest.A{{ID: cur}}}
		if prev != 0 {
			// cur hits prev's first block, then rewrites its second.
			st = cachetest.Step{Sched: []cachetest.S{{cur, 4, 2}}, Arrive: []cachetest.A{{ID: cur, Hit: 4}}, Finished: []int64{prev}}
		}
		late = append(late, h.Step(st))
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{cur, 6, 2}}}))
		// the next request takes block 1 over and rewrites it
		h.Unassign(cur)
		h.Assign(id, 1)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{id, 0, 4}}, Arrive: []cachetest.A{{ID: id}}, Finished: []int64{cur}}))
		prev = id
		id++
		h.Assign(prev, 1, 2)
	}
	h.Sync()
	for _, s := range late {
		err := h.MatCall(s, nil, &h.Res)
		require.False(t, errors.Is(err, omnicache.ErrReassigned), "step %v: %v", s, err)
		require.NoError(t, err)
		require.NoError(t, h.Verify(s, nil, &h.Res))
	}
	h.Usable()
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
			h := cachetest.New(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes))
			h.Assign(a, 1)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			h.Sync()
			release := omnicache.HoldCommitter(h.C)
			t.Cleanup(release)
			h.Assign(e, 5)
			se := h.Step(cachetest.Step{Sched: []cachetest.S{{e, 0, 4}}, Arrive: []cachetest.A{{ID: e}}}) // queued, not landed
			h.Assign(b, 1, 2)
			h.Assign(d, 3)
			before := h.Stats()
			s := h.Step(cachetest.Step{Sched: []cachetest.S{{d, 0, 3}, {b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}, {ID: d}}, Finished: []int64{a}})
			require.Positive(t, h.Stats().ReadAheadBytes, "Begin charged the prefetch buffers")
			if subset {
				h.Mat(s, b) // exact rows while the committer is still held
			} else {
				h.Mat(s)
			}
			after := h.Stats()
			require.Equal(t, before.HitReadsOnCaller+1, after.HitReadsOnCaller, "read on the caller's goroutine")
			require.Equal(t, before.HitRowsRead+4, after.HitRowsRead)
			require.Zero(t, after.ReadAheadBytes, "the read-ahead budget is back at once")
			require.Zero(t, omnicache.ReadsHandedBack(h.C))
			release()
			h.Mat(se)
			h.Sync()
			require.Equal(t, after.HitReadsOnCaller, h.Stats().HitReadsOnCaller, "the committer skipped the read")
			h.Usable()
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
			h := cachetest.New(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes))
			omnicache.SetAheadWait(h.C, cachetest.DeadlockTimeout)
			h.Assign(a, 1)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			h.Sync()
			release := omnicache.HoldWorkingCommitter(h.C)
			t.Cleanup(release)
			h.Assign(b, 1, 2)
			before := h.Stats()
			s := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}})
			time.AfterFunc(10*time.Millisecond, release)
			if subset {
				h.Mat(s, b)
			} else {
				h.Mat(s)
			}
			after := h.Stats()
			require.Equal(t, before.HitReadsOnCaller, after.HitReadsOnCaller, "served by the committer's read")
			require.Equal(t, before.HitRowsRead+4, after.HitRowsRead)
			require.Zero(t, after.ReadAheadBytes, "the read-ahead budget is back")
			h.Usable()
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
	h := cachetest.New(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes))
	h.Assign(a, 1)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(z, 9)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{z, 0, 1}}, Arrive: []cachetest.A{{ID: z}}, Finished: []int64{a}}))
	h.Sync() // a's deferred rows are in the mirror too
	release := omnicache.HoldCommitter(h.C)
	t.Cleanup(release)
	h.Assign(b, 1, 2)
	before := h.Stats()
	sb := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}})
	h.Unassign(b)
	h.Assign(c, 1)
	sc := h.Step(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}, Finished: []int64{b}})
	require.True(t, h.RewrittenSince(sb, []int64{b}), "setup: b's hit slots were rewritten")
	go func() {
		for omnicache.ReadsHandedBack(h.C) == 0 { // Materialize waits for the committer now
			time.Sleep(time.Millisecond)
		}
		release()
	}()
	h.Mat(sb) // the planned rows (a's), no error
	require.Equal(t, int64(1), omnicache.ReadsHandedBack(h.C))
	require.Equal(t, before.HitReadsOnCaller, h.Stats().HitReadsOnCaller, "served by the committer's read")
	h.Mat(sc)
	h.Sync()
	require.Zero(t, h.Stats().ReadAheadBytes)
	h.Usable()
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
				cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux)
				cfg.DisablePrefetch = !prefetch
				h := cachetest.New(t, cfg)
				h.Assign(x, 1, 2)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{x, 0, 8}}, Arrive: []cachetest.A{{ID: x}}})) // blocks 1 and 2's older rows
				h.Sync()
				release := omnicache.HoldCommitter(h.C)
				t.Cleanup(release)
				h.Unassign(x)
				h.Assign(a, 1, 2)
				if !long { // blocks 1 and 2 in two short steps
					h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}, Finished: []int64{x}}))
					h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 4, 4}}}))
				} else {
					h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}, Finished: []int64{x}})) // one step of 8 tokens, queued behind the hold
				}
				h.Assign(b, 2, 5)
				sb := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 1}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}})
				time.AfterFunc(20*time.Millisecond, release) // Materialize is waiting for a's write by then (or not yet: the rows are a's either way)
				h.Mat(sb)
				h.Usable()
			})
		}
	}
}
