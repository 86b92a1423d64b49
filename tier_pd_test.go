package omnicache_test

// Prefill/decode disaggregation through the tier: a prefill cache publishes
// a request's full prompt blocks and waits for them (WaitPublished); a
// decode cache, whose KV for those blocks came from outside, imports their
// rows (Plan.TierBlocks), recomputes the prompt's partial last block and
// decodes. Faults between the two: the tier flushed, a value evicted, the
// publish queue full, the store stopped.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/redistest"
	"github.com/omnicache/omnicache/tier"
)

// pdPrompt is a 14-token prompt: 3 full blocks of 4 and 2 tokens more.
const pdPrompt = 14

// pdHashes are prompt seq's full blocks' chained hashes.
func pdHashes(seq int64) []uint64 { return []uint64{thash(seq, 0), thash(seq, 1), thash(seq, 2)} }

// pdPrefill runs prompt seq on the prefill cache a (request id, its blocks
// in the first table row), consumes it, and waits until its full blocks
// are in the tier.
func pdPrefill(t *testing.T, a *omnicache.Cache, id, seq int64, blocks []int32) error {
	t.Helper()
	table := make([]int32, tstride)
	copy(table, blocks)
	full := map[int32]uint64{}
	for j, h := range pdHashes(seq) {
		full[blocks[j]] = h
	}
	res, err := tstep(t, a, table, []treq{{id: id, seq: seq, row: 0, start: 0, count: pdPrompt, arrive: true}}, full)
	if err != nil {
		t.Fatal(err)
	}
	checkRows(t, res, 0, seq, 0)
	// The request finished after its prefill: the KV connector reports
	// it transferred once the rows are in the tier too.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return a.WaitPublished(ctx, pdHashes(seq))
}

// pdDecode is the decode side's first step of request id (prompt seq):
// its KV for the prompt's full blocks was loaded into blocks (the hit, all
// tier blocks); it computes the prompt's last 2 tokens and its first
// output token. other, when not zero, is a request arriving in the same
// step without a hit (prompt other, 3 tokens, in blocks[3:]).
func pdDecode(t *testing.T, b *omnicache.Cache, id, seq int64, blocks []int32, other int64) (*omnicache.Result, error) {
	t.Helper()
	table := make([]int32, 2*tstride)
	copy(table, blocks[:4])
	copy(table[tstride:], blocks[4:])
	reqs := []treq{{id: id, seq: seq, row: 0, start: 12, count: pdPrompt - 12 + 1, arrive: true,
		hitBlocks: blocks[:3], tierBlocks: 3}}
	if other != 0 {
		reqs = append(reqs, treq{id: id + 1000, seq: other, row: 1, start: 0, count: 3, arrive: true})
	}
	return tstep(t, b, table, reqs, nil)
}

// pdBackends runs f over the embedded store and over a real Redis server.
func pdBackends(t *testing.T, f func(t *testing.T, tr *tier.Tier, evict func(h uint64), flush func(), rs *redistest.Server)) {
	t.Run("backend=embedded", func(t *testing.T) {
		tr, e := embeddedTier(t)
		f(t, tr, func(h uint64) {
			for k := range tkeys {
				e.Delete(context.Background(), []string{tr.Addr(h, k)})
			}
		}, func() {
			if _, err := tr.Purge(context.Background()); err != nil {
				t.Fatal(err)
			}
		}, nil)
	})
	t.Run("backend=redis", func(t *testing.T) {
		s := redistest.Start(t, redistest.Options{})
		be, err := tier.Open("redis://"+s.Addr, tier.RedisOptions{IOTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := tier.New(be, tns(), tier.Options{Timeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		f(t, tr, func(h uint64) {
			for k := range tkeys {
				s.Cli(t, "DEL", tr.Addr(h, k))
			}
		}, func() { s.Cli(t, "FLUSHALL") }, s)
	})
}

func pdCaches(t *testing.T, tr *tier.Tier) (prefill, decode *omnicache.Cache) {
	prefill = newTierCache(t, tr, func(tc *omnicache.TierConfig) { tc.PublishBarrier = true })
	decode = newTierCache(t, tr, func(tc *omnicache.TierConfig) { tc.ImportTimeout = 300 * time.Millisecond })
	return prefill, decode
}

// The prompt's rows reach the decode side exact, through the tier, and
// only once WaitPublished said so; the histograms saw the publish lag and
// the import.
func TestPDPrefillToDecode(t *testing.T) {
	pdBackends(t, func(t *testing.T, tr *tier.Tier, _ func(uint64), _ func(), _ *redistest.Server) {
		a, b := pdCaches(t, tr)
		for i, seq := range []int64{10, 20, 30} { // thash's seq part must differ by 2: (j+1)·φ overflows into it
			if err := pdPrefill(t, a, int64(i+1), seq, []int32{2, 5, 7, 9}); err != nil {
				t.Fatalf("WaitPublished: %v", err)
			}
			blocks := []int32{10, 3, 0, 1}
			if i%2 == 1 {
				blocks = []int32{4, 6, 8, 11}
			}
			res, err := pdDecode(t, b, int64(100+i), seq, append(blocks, 12), 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Prefix(0) != 12 || res.Tokens(0) != pdPrompt+1 {
				t.Fatalf("prefix %d, tokens %d; want 12, %d", res.Prefix(0), res.Tokens(0), pdPrompt+1)
			}
			checkRows(t, res, 0, seq, 0)
		}
		if st := b.Stats(); st.TierImported != 9 || st.TierImportFailed != 0 {
			t.Fatalf("decode side stats %+v: want 9 blocks imported", st)
		}
		counts := map[string]uint64{}
		for _, h := range a.Histograms() {
			counts[h.Name] = h.Count
		}
		if counts["tier_publish_lag_seconds"] != 9 {
			t.Fatalf("prefill side histograms %v: want 9 publish lags", counts)
		}
		counts = map[string]uint64{}
		for _, h := range b.Histograms() {
			counts[h.Name] = h.Count
		}
		if counts["tier_import_seconds"] != 3 || counts["tier_import_wait_seconds"] != 3 {
			t.Fatalf("decode side histograms %v: want 3 imports and 3 waits", counts)
		}
	})
}

// Rows lost in the tier between the two sides: the decode side's request
// fails with a TierImportError (the engine recomputes it), never zeros or
// another prompt's rows served as its own; a request beside it is served
// exact, and a later step of the decode cache is too.
func TestPDTierLostRows(t *testing.T) {
	pdBackends(t, func(t *testing.T, tr *tier.Tier, evict func(uint64), flush func(), _ *redistest.Server) {
		for _, fault := range []string{"flushed", "evicted"} {
			t.Run("fault="+fault, func(t *testing.T) {
				a, b := pdCaches(t, tr)
				if err := pdPrefill(t, a, 1, 7, []int32{2, 5, 7, 9}); err != nil {
					t.Fatal(err)
				}
				// The decode cache's blocks hold an older tenant's rows.
				if _, err := pdDecode(t, b, 50, 99, []int32{10, 3, 0, 1, 12}, 0); !errors.Is(err, omnicache.ErrTierMiss) {
					t.Fatalf("a prompt never published: %v, want ErrTierMiss", err)
				}
				if fault == "flushed" {
					flush()
				} else {
					evict(thash(7, 1))
				}
				res, err := pdDecode(t, b, 9, 7, []int32{10, 3, 0, 1, 12}, 20)
				var re *omnicache.RequestError
				if !errors.As(err, &re) || len(re.IDs) != 1 || re.IDs[0] != 9 {
					t.Fatalf("Materialize: %v; want a RequestError for request 9 only", err)
				}
				var te *omnicache.TierImportError
				if !errors.As(res.Err(0), &te) || !errors.Is(res.Err(0), tier.ErrMiss) {
					t.Fatalf("request 9: %v; want a TierImportError (tier.ErrMiss)", res.Err(0))
				}
				for k := range tkeys {
					for _, x := range res.Rows(0, k) {
						if x != 0 {
							t.Fatal("a failed request's rows are not zeros")
						}
					}
				}
				checkRows(t, res, 1, 20, 0)
				// Recomputed: the engine schedules the whole prompt again.
				table := make([]int32, tstride)
				copy(table, []int32{10, 3, 0, 1})
				res, err = tstep(t, b, table, []treq{{id: 30, seq: 7, row: 0, start: 0, count: pdPrompt, arrive: true}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				checkRows(t, res, 0, 7, 0)
			})
		}
	})
}

// The store stopped (SIGSTOP) between the two sides: the decode side's
// import gives up within its bound and fails the request, and the engine's
// calls return; once the store answers again a new prompt goes through.
func TestPDStoreStopped(t *testing.T) {
	pdBackends(t, func(t *testing.T, tr *tier.Tier, _ func(uint64), _ func(), rs *redistest.Server) {
		if rs == nil {
			t.Skip("an embedded store cannot stop")
		}
		a, b := pdCaches(t, tr)
		if err := pdPrefill(t, a, 1, 7, []int32{2, 5, 7, 9}); err != nil {
			t.Fatal(err)
		}
		rs.Pause(t)
		t0 := time.Now()
		res, err := pdDecode(t, b, 9, 7, []int32{10, 3, 0, 1, 12}, 20)
		if !errors.Is(err, omnicache.ErrTierMiss) || !errors.Is(res.Err(0), tier.ErrUnavailable) {
			t.Fatalf("import from a stopped store: %v (%v); want ErrTierMiss, tier.ErrUnavailable", err, res.Err(0))
		}
		checkRows(t, res, 1, 20, 0)
		if d := time.Since(t0); d > 10*time.Second {
			t.Fatalf("the step took %v with the store stopped", d)
		}
		// The prefill side's wait for a prompt published while the store
		// is stopped ends with its context, naming what is pending.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		table := make([]int32, tstride)
		copy(table, []int32{1, 3, 4, 6})
		full := map[int32]uint64{1: thash(8, 0), 3: thash(8, 1), 4: thash(8, 2)}
		if _, err := tstep(t, a, table, []treq{{id: 2, seq: 8, row: 0, start: 0, count: pdPrompt, arrive: true}}, full); err != nil {
			t.Fatal(err)
		}
		werr := a.WaitPublished(ctx, pdHashes(8))
		cancel()
		if werr == nil {
			t.Fatal("WaitPublished returned nil with the store stopped")
		}
		rs.Resume(t)
		// Once the store answers again (its circuit closes on a probe), a
		// new prompt goes through.
		deadline := time.Now().Add(10 * time.Second)
		for seq := int64(40); ; seq += 2 { // see thash
			err := pdPrefill(t, a, seq, seq, []int32{8, 10, 11, 12})
			if err == nil {
				res, err := pdDecode(t, b, 200+seq, seq, []int32{13, 14, 15, 2, 5}, 0)
				if err == nil {
					checkRows(t, res, 0, seq, 0)
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no prompt through after the store resumed: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// WaitPublished's refusals: without the barrier, a block never noted, a
// block the publish queue dropped, and after Close.
func TestWaitPublishedErrors(t *testing.T) {
	tr, _ := embeddedTier(t)
	plain := newTierCache(t, tr, nil)
	if err := plain.WaitPublished(context.Background(), pdHashes(7)); !errors.Is(err, omnicache.ErrConfig) {
		t.Fatalf("without PublishBarrier: %v, want ErrConfig", err)
	}
	a := newTierCache(t, tr, func(tc *omnicache.TierConfig) { tc.PublishBarrier = true })
	err := a.WaitPublished(context.Background(), []uint64{12345})
	var pe *omnicache.TierPublishError
	if !errors.Is(err, omnicache.ErrNotPublished) || !errors.As(err, &pe) || pe.Hash != 12345 {
		t.Fatalf("a block never noted: %v, want a TierPublishError (ErrNotPublished) naming it", err)
	}
	if err := pdPrefill(t, a, 1, 7, []int32{2, 5, 7, 9}); err != nil {
		t.Fatal(err)
	}
	// Already stored: a second wait returns at once.
	if err := a.WaitPublished(context.Background(), pdHashes(7)); err != nil {
		t.Fatal(err)
	}

	// A publish queue of one block drops the others of a step: the wait
	// names one of them.
	e, _ := tier.NewEmbedded(0)
	stuck := &stuckBackend{Backend: e, release: make(chan struct{}), sets: make(chan struct{}, 1)}
	str, err := tier.New(stuck, tns(), tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer str.Close()
	q := newTierCache(t, str, func(tc *omnicache.TierConfig) {
		tc.PublishBarrier, tc.PublishQueue, tc.PublishBatch, tc.Publishers = true, 1, 1, 1
	})
	table := make([]int32, tstride)
	copy(table, []int32{2, 5, 7, 9})
	full := map[int32]uint64{2: thash(7, 0), 5: thash(7, 1), 7: thash(7, 2)}
	if _, err := tstep(t, q, table, []treq{{id: 1, seq: 7, row: 0, start: 0, count: pdPrompt, arrive: true}}, full); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = q.WaitPublished(ctx, pdHashes(7))
	if !errors.Is(err, omnicache.ErrNotPublished) || !errors.As(err, &pe) {
		t.Fatalf("a dropped block: %v, want ErrNotPublished", err)
	}
	if !strings.Contains(err.Error(), "publish queue was full") || !strings.Contains(err.Error(), fmt.Sprintf("%016x", pe.Hash)) {
		t.Fatalf("%v: want the block and the cause named", err)
	}
	close(stuck.release)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.WaitPublished(context.Background(), pdHashes(7)); !errors.Is(err, omnicache.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}
