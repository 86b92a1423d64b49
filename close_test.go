package omnicache_test

// Close at any moment: while an engine goroutine decodes, while reads are
// in flight, while a Save waits for a staging page. Every call returns its
// rows or ErrClosed, none crashes (run under -race), and Close releases
// every page and budget byte.

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// TestCloseDuringDecodeSteps races Close against an engine goroutine in
// steady decode (steps parked by the decode buffer, whose Begin stays off
// the call gate), a change of batch, and a finish. Every call either
// succeeds or returns ErrClosed; under -race no read of the write path's
// state by Begin may race with Close releasing it.
func TestCloseDuringDecodeSteps(t *testing.T) {
	const bs, rb = 4, 8
	iters := 60
	if testing.Short() {
		iters = 10
	}
	for it := range iters {
		c, err := omnicache.New(omnicache.Config{NumBlocks: 64, BlockSize: bs, Keys: []omnicache.Key{{Name: "h", RowBytes: rb}}})
		if err != nil {
			t.Fatal(err)
		}
		table := make([]int32, 4*16)
		for i := range table {
			table[i] = int32(i)
		}
		host := make([]byte, 64*rb)
		var wg sync.WaitGroup
		wg.Add(1)
		var engineErr error
		go func() { // the engine goroutine
			defer wg.Done()
			fail := func(what string, err error) bool {
				if err == nil {
					return false
				}
				if !errors.Is(err, omnicache.ErrClosed) {
					engineErr = errors.Join(errors.New(what), err)
				}
				return true
			}
			ids := []int64{1, 2}
			p := &omnicache.Plan{IDs: ids, Rows: []int32{0, 1}, Start: []int32{0, 0}, Count: []int32{4, 4},
				Table: table, Stride: 16, Arrivals: ids, HitTokens: []int32{0, 0}}
			for pos := int32(0); pos < 40; pos++ {
				if fail("Begin", c.Begin(p)) {
					return
				}
				n := 0
				for _, k := range p.Count {
					n += int(k)
				}
				id, err := c.Save(&omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{{Host: host[:n*rb], Rows: n}}})
				if fail("Save", err) {
					return
				}
				if fail("Discard", c.Discard(id)) {
					return
				}
				// Decode steps from here on; every tenth one changes the
				// batch (one request finishes, then the other decodes on).
				start := p.Start[0] + p.Count[0]
				p = &omnicache.Plan{IDs: ids, Rows: []int32{0, 1}[:len(ids)], Start: []int32{start, start}[:len(ids)],
					Count: []int32{1, 1}[:len(ids)], Table: table, Stride: 16}
				if pos == 20 {
					ids = []int64{2}
					p = &omnicache.Plan{IDs: ids, Rows: []int32{1}, Start: []int32{start}, Count: []int32{1},
						Table: table, Stride: 16, Finished: []int64{1}}
				}
			}
		}()
		for range it % 16 {
			runtime.Gosched()
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wg.Wait()
		if engineErr != nil {
			t.Fatalf("iteration %d: %v", it, engineErr)
		}
	}
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
