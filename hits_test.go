package omnicache_test

// Hits and exact rows: misses, hits, partial prefixes, streamed
// continuations, hits on blocks written in the same step, tenant
// succession, hits over buffered decode rows, never-written required and
// optional rows, a delayed read of reassigned slots, steps consumed by id,
// and a finished request arriving again. Every Materialize is checked row by row against the harness's
// oracle (internal/cachetest).

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// A request without a hit gets exactly this step's rows.
func TestMiss(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.Assign(1, 1, 2)
	h.Assign(2, 3)
	h.Assign(3, 4) // scheduled without being listed: a no-hit arrival
	s1 := h.Step(cachetest.Step{
		Sched:  []cachetest.S{{1, 0, 6}, {2, 0, 3}, {3, 0, 2}},
		Arrive: []cachetest.A{{ID: 1}, {ID: 2}},
	})
	h.Mat(s1)
	for i := 0; i < h.Res.Len(); i++ {
		assert.Equal(t, 0, h.Res.Prefix(i), "request %d: a miss has no prefix", h.Res.ID(i))
	}
	assert.Equal(t, []int{6, 3, 2}, []int{h.Res.Tokens(0), h.Res.Tokens(1), h.Res.Tokens(2)}, "rows per request = this step's tokens")

	// Next step: the same requests continue; each gets only its new rows.
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{1, 6, 2}, {2, 3, 1}, {3, 2, 1}}})
	h.Mat(s2, 3, 1) // a subset, in the order asked for
	h.CheckMirror()
	assert.Zero(t, h.Stats().HitRequests, "Stats.HitRequests after misses only")
}

// A writes 8 tokens and finishes; B arrives hitting those 2
// blocks and computes 4 more: B's result has 12 rows, the first 8 equal
// A's.
func TestHitMerge(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))

	h.Assign(b, 1, 2, 3)
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 4}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}, Finished: []int64{a}})
	h.Mat(s2)
	require.Equal(t, 1, h.Res.Len())
	require.Equal(t, 8, h.Res.Prefix(0), "B's hit prefix")
	require.Equal(t, 12, h.Res.Tokens(0), "B's rows: 8 hit + 4 computed")
	for k, key := range h.Cfg.Keys {
		rows := h.Res.Rows(0, k)
		for j := 0; j < 8; j++ {
			got := rows[j*key.RowBytes : (j+1)*key.RowBytes]
			require.Equal(t, cachetest.RowOf(cachetest.MkTag(k, a, j, 0), key.RowBytes), got, "key %q row %d must be A's row, got %s", key.Name, j, cachetest.Describe(got))
		}
	}
	st := h.Stats()
	assert.EqualValues(t, 1, st.HitRequests, "Stats.HitRequests")
	assert.EqualValues(t, 8, st.HitTokens, "Stats.HitTokens")
	h.CheckMirror()
}

// B shares 2 of A's 3 blocks; B's rows are right, B's new block
// is written, A's third block and the shared prefix are untouched — whether
// A finished before or after B.
func TestPartialPrefix(t *testing.T) {
	const a, b, c, d = 1, 2, 3, 4
	for _, tc := range []struct {
		name        string
		finishFirst bool
	}{{"A finished before B", true}, {"A finishes after B", false}} {
		t.Run(tc.name, func(t *testing.T) {
			h := cachetest.New(t, cachetest.Config())
			h.Assign(a, 1, 2, 3, 5)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 12}}, Arrive: []cachetest.A{{ID: a}}}))

			h.Assign(b, 1, 2, 4, 6)
			if tc.finishFirst {
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 4}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}, Finished: []int64{a}}))
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 12, 1}}}))
			} else {
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 12, 1}, {b, 8, 4}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}}))
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 12, 1}}, Finished: []int64{a}}))
			}
			hid := h.KeyIndex("hidden")
			h.ExpectBlock(hid, 1, a, 0, 0) // shared prefix untouched
			h.ExpectBlock(hid, 2, a, 4, 0)
			h.ExpectBlock(hid, 3, a, 8, 0) // A's third block untouched
			h.ExpectBlock(hid, 4, b, 8, 0) // B's new block written

			// Hits over A's chain and over the shared prefix + B's block.
			h.Assign(c, 1, 2, 3, 7)
			h.Assign(d, 1, 2, 4, 8)
			h.Mat(h.Step(cachetest.Step{
				Sched:  []cachetest.S{{c, 12, 1}, {d, 12, 1}},
				Arrive: []cachetest.A{{ID: c, Hit: 12}, {ID: d, Hit: 12}},
			}))
			h.CheckMirror()
		})
	}
}

// A live request id arriving again is not a hit; after it
// finishes, the same id arriving with a hit does hit.
func TestStreamedContinuation(t *testing.T) {
	const a, z = 1, 9
	for _, tc := range []struct {
		name     string
		samePlan bool // Finished and the new arrival in one plan
	}{{"finished in an earlier plan", false}, {"finished and arriving in one plan", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := cachetest.New(t, cachetest.Config())
			h.Assign(a, 1, 2, 3)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))

			// A is live: listed as an arrival again with a (well-formed)
			// hit, it is a streamed continuation: no prefix.
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 4, 4}}, Arrive: []cachetest.A{{ID: a, Hit: 4}}}))
			require.Equal(t, 0, h.Res.Prefix(0), "a live id arriving again must not hit")
			require.Equal(t, 4, h.Res.Tokens(0), "a continuation gets just this step's rows")
			require.Zero(t, h.Stats().HitRequests, "Stats.HitRequests after a continuation")

			if !tc.samePlan {
				h.Assign(z, 10)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{z, 0, 2}}, Arrive: []cachetest.A{{ID: z}}, Finished: []int64{a}}))
			}
			// A new life of id A, hitting its old 2 blocks.
			h.Bump(a)
			h.Assign(a, 1, 2, 4)
			plan := cachetest.Step{Sched: []cachetest.S{{a, 8, 4}}, Arrive: []cachetest.A{{ID: a, Hit: 8}}}
			if tc.samePlan {
				plan.Finished = []int64{a}
			}
			h.Mat(h.Step(plan))
			require.Equal(t, 8, h.Res.Prefix(0), "a finished id arriving again with a hit must hit")
			st := h.Stats()
			assert.EqualValues(t, 1, st.HitRequests, "Stats.HitRequests")
			assert.EqualValues(t, 8, st.HitTokens, "Stats.HitTokens")
			h.CheckMirror()
		})
	}
}

// B hits blocks that A writes in the same step: B's prefix is
// A's rows.
func TestSameStepHit(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2, 5)
	h.Assign(b, 1, 2, 3)
	s1 := h.Step(cachetest.Step{
		Sched:  []cachetest.S{{a, 0, 8}, {b, 8, 2}},
		Arrive: []cachetest.A{{ID: a}, {ID: b, Hit: 8}},
	})
	h.Mat(s1)
	require.Equal(t, 8, h.Res.Prefix(1), "B's prefix")
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 8, 1}, {b, 10, 1}}})) // A moves on to its block 5
	h.CheckMirror()
}

// A block reused by B after A: a later hit reads B's rows
// (every key).
func TestTenantSuccession(t *testing.T) {
	const a, b, c, d = 1, 2, 3, 4
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))

	// A finishes; its block 1 goes to B (no hit), B writes it.
	h.Assign(b, 1)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}, Finished: []int64{a}}))
	for k := range h.Cfg.Keys {
		h.ExpectBlock(k, 1, b, 0, 0)
		h.ExpectBlock(k, 2, a, 4, 0)
	}

	// C hits block 1 (B's rows), D hits block 2 (still A's rows).
	h.Assign(c, 1, 9)
	h.Assign(d, 2, 10)
	h.Mat(h.Step(cachetest.Step{
		Sched:    []cachetest.S{{c, 4, 2}, {d, 4, 2}},
		Arrive:   []cachetest.A{{ID: c, Hit: 4}, {ID: d, Hit: 4}},
		Finished: []int64{b},
	}))
	for k, key := range h.Cfg.Keys {
		got := h.Res.Rows(0, k)[:key.RowBytes]
		require.Equal(t, cachetest.RowOf(cachetest.MkTag(k, b, 0, 0), key.RowBytes), got, "C's first prefix row of key %q must be the new tenant B's, got %s", key.Name, cachetest.Describe(got))
	}
	h.CheckMirror()
}

// A hit right after buffered decode steps reads the buffered
// rows.
func TestHitAfterBufferedDecode(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2, 3)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}}, Arrive: []cachetest.A{{ID: a}}}))

	base := h.Stats()
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 6, 1}}}) // pure decode: parked
	s3 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 7, 1}}}) // pure decode: parked; block 2 now full
	st := h.Stats()
	require.Equal(t, int64(2), st.BufferedSteps-base.BufferedSteps, "two pure decode steps must be parked in the decode buffer")
	require.Equal(t, int64(0), st.BufferFlushes-base.BufferFlushes, "fewer than block_size pure decode steps must not flush")

	// B arrives hitting A's 2 blocks; positions 6 and 7 exist only in the
	// decode buffer when B's Begin runs.
	h.Assign(b, 1, 2, 4)
	s4 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 8, 1}, {b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}})
	h.Mat(s4)
	require.Equal(t, 8, h.Res.Prefix(1), "B's prefix")
	// The buffered steps are consumed a step late: they still return their
	// own rows.
	h.Mat(s3)
	h.Mat(s2)
	h.CheckMirror()
}

// A hit over never-written blocks of a required key is an
// error at Materialize (never served as a miss); the step is consumed and
// its staging page released (with one page, the next Save does not wait).
func TestAbsentRequired(t *testing.T) {
	const a, b = 1, 2
	for _, tc := range []struct {
		name    string
		written bool // A wrote the hit's first block
	}{{"nothing written", false}, {"second hit block never written", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cachetest.Config()
			cfg.StagingDepth = 1
			h := cachetest.New(t, cfg)
			if tc.written {
				h.Assign(a, 5)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			}
			h.Assign(b, 5, 6, 7)
			s := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}})
			err := h.MatCall(s, nil, &h.Res)
			require.ErrorIs(t, err, omnicache.ErrAbsentRequired, "hit over never-written rows of the required key %q", cachetest.KeyHidden.Name)
			t.Logf("error: %v", err)
			require.ErrorIs(t, h.MatCall(s, nil, &h.Res), omnicache.ErrUnknownStep, "the failed read consumes the step")
			h.Usable() // StagingDepth 1: needs the page back
			assert.Zero(t, h.Stats().PagesInUse, "Stats.PagesInUse once every step is consumed")
		})
	}
}

// A hit over never-written blocks of an optional key reads
// exact zero rows.
func TestAbsentOptional(t *testing.T) {
	const a, b = 1, 2
	keys := []omnicache.Key{cachetest.KeyAux, {Name: "aux2", RowBytes: 16, Optional: true}}
	for _, tc := range []struct {
		name    string
		written bool
	}{{"nothing written", false}, {"second hit block never written", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := cachetest.New(t, cachetest.Config(keys...))
			if tc.written {
				h.Assign(a, 5)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			}
			h.Assign(b, 5, 6, 7)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}}))
			require.Equal(t, 8, h.Res.Prefix(0))
			for k, key := range h.Cfg.Keys {
				absent := h.Res.Rows(0, k)[4*key.RowBytes : 8*key.RowBytes]
				require.Equal(t, make([]byte, len(absent)), absent, "key %q: rows of the never-written block must be exact zeros", key.Name)
			}
			h.CheckMirror()
		})
	}
}

// A delayed read (materialize a step later) whose hit slots
// were reassigned meanwhile: ErrReassigned or the preserved original rows,
// never the new tenant's rows.
func TestDelayedReadReassigned(t *testing.T) {
	const a, b, c = 1, 2, 3
	setup := func(t *testing.T) (*cachetest.Harness, omnicache.StepID) {
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 3)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
		// B hits A's block 3; its step is not consumed yet.
		h.Assign(b, 3, 4)
		sb := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}})
		h.Assign(c, 3)
		return h, sb
	}
	// consumeAfter checks that a step whose read failed is handled
	// (consumed or still consumable) and that the cache stays usable.
	consumeAfter := func(h *cachetest.Harness, sb omnicache.StepID, reassigned bool) {
		if reassigned {
			err := h.TryDiscard(sb)
			if err != nil {
				require.ErrorIs(h.T, err, omnicache.ErrUnknownStep, "Discard after a failed read: the step is either consumed or still held")
			}
		}
		h.CheckMirror()
		h.Sync()
		assert.Zero(h.T, h.Stats().PagesInUse, "Stats.PagesInUse once every step is consumed")
	}

	t.Run("read after the new tenant wrote", func(t *testing.T) {
		h, sb := setup(t)
		// B finishes (its last outputs were saved); block 3 goes to C,
		// which writes it.
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}, Finished: []int64{b}}))
		h.Sync()
		reassigned := h.MatDelayed(sb)
		t.Logf("delayed read of reassigned slots: ErrReassigned=%v", reassigned)
		consumeAfter(h, sb, reassigned)
	})
	t.Run("read concurrent with the reassigning step", func(t *testing.T) {
		h, sb := setup(t)
		var res omnicache.Result
		done := make(chan error, 1)
		go func() { done <- h.C.Materialize(sb, nil, &res) }()
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}, Finished: []int64{b}}))
		err := cachetest.Guard(t, "concurrent Materialize", func() error { return <-done })
		reassigned := errors.Is(err, omnicache.ErrReassigned)
		if !reassigned {
			require.NoError(t, err, "delayed read: want success or ErrReassigned")
			require.NoError(t, h.Verify(sb, nil, &res), "a delayed read must return the original rows")
		}
		consumeAfter(h, sb, reassigned)
	})
}

// Step ids are consumed by id, not order (discard 2, then
// materialize 1).
func TestConsumeByID(t *testing.T) {
	const a, b, c = 1, 2, 3
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Assign(b, 3)
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 5}}, Arrive: []cachetest.A{{ID: a}}})
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 5, 1}, {b, 0, 3}}, Arrive: []cachetest.A{{ID: b}}})
	assert.NotEqual(t, s1, s2, "step ids must differ")
	h.Discard(s2)
	h.Mat(s1)
	require.ErrorIs(t, h.MatCall(s2, nil, &h.Res), omnicache.ErrUnknownStep, "Materialize of a discarded step")

	h.Assign(c, 4)
	s3 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 6, 1}, {b, 3, 1}, {c, 0, 2}}, Arrive: []cachetest.A{{ID: c}}})
	h.Mat(s3)
	h.CheckMirror()
	assert.Zero(t, h.Stats().PagesInUse, "Stats.PagesInUse once every step is consumed")
}

// TestFinishedRearrivesAtItsPosition: a request that finishes and arrives
// again under the same id, at the same batch position, is a new request
// (Begin looks it up again rather than keeping the position's handle from
// the step before): its hit is served, then its own rows.
func TestFinishedRearrivesAtItsPosition(t *testing.T) {
	const bs, rb, stride = 4, 8, 4
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: bs, Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	table := []int32{0, 1, 0, 0, 4, 5, 0, 0, 8, 9, 0, 0} // requests 1, 2, 3: blocks 0-1, 4-5, 8-9
	rows := func(tag byte, n int) []byte {
		b := make([]byte, n*rb)
		for t := 0; t < n; t++ {
			for j := 0; j < rb; j++ {
				b[t*rb+j] = tag + byte(t)
			}
		}
		return b
	}
	var res omnicache.Result
	step := func(p *omnicache.Plan, out []byte, n int, read []int64) []byte {
		t.Helper()
		if err := c.Begin(p); err != nil {
			t.Fatal(err)
		}
		sid, err := c.Save(&omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{{Host: out, Rows: n}}})
		if err != nil {
			t.Fatal(err)
		}
		if read == nil {
			if err := c.Discard(sid); err != nil {
				t.Fatal(err)
			}
			return nil
		}
		if err := c.Materialize(sid, read, &res); err != nil {
			t.Fatal(err)
		}
		return append([]byte(nil), res.Rows(0, 0)...)
	}
	// Both prefill 4 tokens (a full block each), then decode one.
	pre := append(rows(10, 4), rows(50, 4)...)
	step(&omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{0, 0}, Count: []int32{4, 4},
		Table: table, Stride: stride, Arrivals: []int64{1, 2}, HitTokens: []int32{0, 0}}, pre, 8, nil)
	step(&omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{4, 4}, Count: []int32{1, 1},
		Table: table, Stride: stride}, append(rows(14, 1), rows(54, 1)...), 2, nil)
	// Request 2 finishes and arrives again at position 1 with a hit on its
	// first block; it computes token 4 anew. Request 3 arrives first (and
	// may be given the handle request 2 had).
	got := step(&omnicache.Plan{IDs: []int64{1, 2, 3}, Rows: []int32{0, 1, 2}, Start: []int32{5, 4, 0}, Count: []int32{1, 1, 1},
		Table: table, Stride: stride, Finished: []int64{2}, Arrivals: []int64{3, 2}, HitTokens: []int32{0, 4}, HitBlocks: []int32{4}},
		append(append(rows(15, 1), rows(90, 1)...), rows(120, 1)...), 3, []int64{2})
	want := append(rows(50, 4), rows(90, 1)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("request 2 after it arrived again: %v, want its hit block's rows then its own: %v", got, want)
	}
}
