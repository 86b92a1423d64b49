package omnicache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// A tier test world: caches of block size 4 over 16 blocks with a required
// hidden key and an optional one, sharing one tier. Row (key k, token
// position pos) of prompt seq is a function of the three: a row from another
// prompt or position is detected.
const (
	tbs     = 4
	tblocks = 16
	tstride = 8
)

var tkeys = []omnicache.Key{{Name: "hidden", RowBytes: 24}, {Name: "extra", RowBytes: 8, Optional: true}}

func tns() tier.Namespace {
	ns := tier.Namespace{Model: "tier-test", BlockSize: tbs}
	for _, k := range tkeys {
		ns.Keys = append(ns.Keys, tier.Key{Name: k.Name, RowBytes: k.RowBytes})
	}
	return ns
}

func trow(seq int64, k, pos int) []byte {
	b := make([]byte, tkeys[k].RowBytes)
	for i := range b {
		b[i] = byte(seq*131 + int64(k)*71 + int64(pos)*7 + int64(i))
	}
	return b
}

func trows(seq int64, k, pos, n int) []byte {
	var b []byte
	for t := 0; t < n; t++ {
		b = append(b, trow(seq, k, pos+t)...)
	}
	return b
}

// thash is the chained hash of prompt seq's block j.
func thash(seq int64, j int) uint64 { return uint64(seq)<<32 | uint64(j+1)*0x9e3779b9 }

func newTierCache(t *testing.T, tr *tier.Tier, mod func(*omnicache.TierConfig)) *omnicache.Cache {
	t.Helper()
	tc := &omnicache.TierConfig{Tier: tr}
	if mod != nil {
		mod(tc)
	}
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys, Tier: tc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func embeddedTier(t *testing.T) (*tier.Tier, *tier.Embedded) {
	t.Helper()
	e, _ := tier.NewEmbedded(0)
	tr, err := tier.New(e, tns(), tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, e
}

// treq is one scheduled request of a step.
type treq struct {
	id, seq      int64
	row          int32
	start, count int
	arrive       bool
	hitBlocks    []int32
	tierBlocks   int
}

// tstep runs one step of reqs over table and returns the result (err from
// Materialize). full names the blocks (row, column) completed, hashed as
// prompt seq's.
func tstep(t *testing.T, c *omnicache.Cache, table []int32, reqs []treq, full map[int32]uint64) (*omnicache.Result, error) {
	t.Helper()
	p := &omnicache.Plan{Table: table, Stride: tstride}
	var n int
	var tierBlocks []int32
	for _, r := range reqs {
		p.IDs = append(p.IDs, r.id)
		p.Rows = append(p.Rows, r.row)
		p.Start = append(p.Start, int32(r.start))
		p.Count = append(p.Count, int32(r.count))
		n += r.count
		if r.arrive {
			p.Arrivals = append(p.Arrivals, r.id)
			p.HitTokens = append(p.HitTokens, int32(len(r.hitBlocks)*tbs))
			p.HitBlocks = append(p.HitBlocks, r.hitBlocks...)
			tierBlocks = append(tierBlocks, int32(r.tierBlocks))
			for j := len(r.hitBlocks) - r.tierBlocks; j < len(r.hitBlocks); j++ {
				p.TierHashes = append(p.TierHashes, thash(r.seq, j))
			}
		}
	}
	if len(p.TierHashes) > 0 {
		p.TierBlocks = tierBlocks
	}
	for b, h := range full {
		p.FullBlocks = append(p.FullBlocks, b)
		p.FullHashes = append(p.FullHashes, h)
	}
	if err := c.Begin(p); err != nil {
		t.Fatalf("Begin: %v", err)
	}
	o := &omnicache.Outputs{Tokens: n, Padded: n}
	for k := range tkeys {
		var b []byte
		for _, r := range reqs {
			b = append(b, trows(r.seq, k, r.start, r.count)...)
		}
		o.Tensors = append(o.Tensors, omnicache.Tensor{Host: b, Rows: n})
	}
	sid, err := c.Save(o)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	var res omnicache.Result
	return &res, c.Materialize(sid, nil, &res)
}

// checkRows fails unless request i of res holds prompt seq's rows from
// position 0 (its prefix) through its own.
func checkRows(t *testing.T, res *omnicache.Result, i int, seq int64, from int) {
	t.Helper()
	if err := res.Err(i); err != nil {
		t.Fatalf("request %d: %v", res.ID(i), err)
	}
	for k := range tkeys {
		want := trows(seq, k, from, res.Tokens(i))
		if got := res.Rows(i, k); string(got) != string(want) {
			t.Fatalf("request %d key %d: wrong rows (prefix %d, %d tokens)", res.ID(i), k, res.Prefix(i), res.Tokens(i))
		}
	}
}

// waitPublished waits (bounded) until c published n blocks in all.
func waitPublished(t *testing.T, c *omnicache.Cache, n int64) {
	t.Helper()
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2000; i++ { // bounded: the publisher is asynchronous
		st := c.Stats()
		if st.TierPublished+st.TierPublishErrors+st.TierPublishDropped+st.TierPublishSkipped+st.TierPublishRecent >= n {
			if st.TierPublished != n {
				t.Fatalf("published %d of %d blocks: %+v", st.TierPublished, n, st)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("only %d of %d blocks published", c.Stats().TierPublished, n)
}

// publishPrompt runs prompt seq (12 tokens: 3 full blocks, in blocks 2, 5,
// 7) through cache a and waits until its blocks are in the tier.
func publishPrompt(t *testing.T, a *omnicache.Cache, seq int64) {
	t.Helper()
	table := make([]int32, tstride)
	copy(table, []int32{2, 5, 7})
	res, err := tstep(t, a, table, []treq{{id: 1, seq: seq, row: 0, start: 0, count: 12, arrive: true}},
		map[int32]uint64{2: thash(seq, 0), 5: thash(seq, 1), 7: thash(seq, 2)})
	if err != nil {
		t.Fatal(err)
	}
	checkRows(t, res, 0, seq, 0)
	waitPublished(t, a, 3)
}

func TestTierImportAcrossCaches(t *testing.T) {
	tr, _ := embeddedTier(t)
	var mu sync.Mutex
	var events []omnicache.ImportEvent
	a := newTierCache(t, tr, nil)
	b := newTierCache(t, tr, func(tc *omnicache.TierConfig) {
		tc.OnImport = func(e omnicache.ImportEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }
	})
	publishPrompt(t, a, 7)
	if n, err := b.Lookup(context.Background(), []uint64{thash(7, 0), thash(7, 1), thash(7, 2), thash(7, 3)}); err != nil || n != 3 {
		t.Fatalf("Lookup = %d, %v; want 3", n, err)
	}
	// Cache b first fills blocks 10, 3 and 0 with another prompt's rows:
	// the import must replace them.
	table := make([]int32, 2*tstride)
	copy(table, []int32{10, 3, 0})
	copy(table[tstride:], []int32{10, 3, 0, 1})
	if _, err := tstep(t, b, table, []treq{{id: 50, seq: 99, row: 0, start: 0, count: 12, arrive: true}}, nil); err != nil {
		t.Fatal(err)
	}
	// Request 9 (prompt 7) arrives with its KV loaded from outside into
	// blocks 10, 3, 0 and computes 2 tokens; request 50 finished.
	res, err := tstep(t, b, table, []treq{{id: 9, seq: 7, row: 1, start: 12, count: 2, arrive: true,
		hitBlocks: []int32{10, 3, 0}, tierBlocks: 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Prefix(0) != 12 || res.Tokens(0) != 14 {
		t.Fatalf("prefix %d, tokens %d; want 12, 14", res.Prefix(0), res.Tokens(0))
	}
	checkRows(t, res, 0, 7, 0)
	// The rows are now cache b's own: a local hit on them reads the mirror.
	copy(table, []int32{10, 3, 4})
	res, err = tstep(t, b, table, []treq{{id: 11, seq: 7, row: 0, start: 8, count: 3, arrive: true, hitBlocks: []int32{10, 3}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRows(t, res, 0, 7, 0)
	st := b.Stats()
	if st.TierImported != 3 || st.TierImportFailed != 0 || st.TierBytesImported != 3*tbs*(24+8) {
		t.Fatalf("stats %+v: want 3 blocks (%d bytes) imported", st, 3*tbs*(24+8))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Blocks != 3 || events[0].Failed != 0 || events[0].Latency <= 0 {
		t.Fatalf("import events %+v", events)
	}
}

func TestTierEvictedBetweenLookupAndImport(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			tr, e := embeddedTier(t)
			a := newTierCache(t, tr, nil)
			publishPrompt(t, a, 7)
			c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys,
				DisablePrefetch: !prefetch, Tier: &omnicache.TierConfig{Tier: tr}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if n, err := c.Lookup(context.Background(), []uint64{thash(7, 0), thash(7, 1), thash(7, 2)}); err != nil || n != 3 {
				t.Fatalf("Lookup = %d, %v", n, err)
			}
			// Blocks 10, 3, 0 hold an older tenant's rows; then the tier
			// evicts the prompt's second block before the import.
			table := make([]int32, 3*tstride)
			copy(table, []int32{10, 3, 0})
			copy(table[tstride:], []int32{10, 3, 0, 1})
			copy(table[2*tstride:], []int32{12})
			if _, err := tstep(t, c, table, []treq{{id: 50, seq: 99, row: 0, start: 0, count: 12, arrive: true}}, nil); err != nil {
				t.Fatal(err)
			}
			e.Delete(context.Background(), []string{tr.Addr(thash(7, 1), 0)})
			res, err := tstep(t, c, table, []treq{
				{id: 9, seq: 7, row: 1, start: 12, count: 2, arrive: true, hitBlocks: []int32{10, 3, 0}, tierBlocks: 3},
				{id: 20, seq: 20, row: 2, start: 0, count: 3, arrive: true},
			}, nil)
			var re *omnicache.RequestError
			if !errors.As(err, &re) || len(re.IDs) != 1 || re.IDs[0] != 9 {
				t.Fatalf("Materialize: %v; want a RequestError for request 9 only", err)
			}
			var te *omnicache.TierImportError
			if !errors.As(res.Err(0), &te) || !errors.Is(res.Err(0), omnicache.ErrTierMiss) || !errors.Is(res.Err(0), tier.ErrMiss) {
				t.Fatalf("request 9: %v; want a TierImportError (ErrTierMiss, tier.ErrMiss)", res.Err(0))
			}
			if te.Request != 9 || te.Index != 1 || te.Block != 3 || te.Hash != thash(7, 1) {
				t.Fatalf("error names %+v; want request 9, hit block 1 (local block 3, hash %x)", te, thash(7, 1))
			}
			for k := range tkeys {
				for _, x := range res.Rows(0, k) {
					if x != 0 {
						t.Fatal("a failed request's rows are not zeros")
					}
				}
			}
			checkRows(t, res, 1, 20, 0) // the other request is served
			// A later local hit on the lost block is refused, never the
			// older tenant's rows; the imported blocks read exact.
			copy(table, []int32{10, 3, 4})
			if res, err = tstep(t, c, table, []treq{{id: 11, seq: 7, row: 0, start: 8, count: 1, arrive: true, hitBlocks: []int32{10, 3}}}, nil); !errors.Is(err, omnicache.ErrReassigned) {
				t.Fatalf("hit on the lost block: %v, want ErrReassigned", err)
			}
			copy(table, []int32{10, 6})
			res, err = tstep(t, c, table, []treq{{id: 12, seq: 7, row: 0, start: 4, count: 1, arrive: true, hitBlocks: []int32{10}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkRows(t, res, 0, 7, 0)
			if st := c.Stats(); st.TierImported != 2 || st.TierImportFailed != 1 {
				t.Fatalf("stats %+v: want 2 imported, 1 failed", st)
			}
		})
	}
}

func TestTierPlanValidation(t *testing.T) {
	tr, _ := embeddedTier(t)
	c := newTierCache(t, tr, nil)
	plain, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	table := make([]int32, tstride)
	copy(table, []int32{1, 2, 3})
	base := func() *omnicache.Plan {
		return &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{8}, Count: []int32{2}, Table: table, Stride: tstride,
			Arrivals: []int64{1}, HitTokens: []int32{8}, HitBlocks: []int32{1, 2}, TierBlocks: []int32{2}, TierHashes: []uint64{5, 6}}
	}
	cases := []struct {
		name string
		mod  func(*omnicache.Plan)
		want error
	}{
		{"counts per arrival", func(p *omnicache.Plan) { p.TierBlocks = []int32{1, 1} }, omnicache.ErrPlan},
		{"more tier blocks than hit blocks", func(p *omnicache.Plan) { p.TierBlocks = []int32{3}; p.TierHashes = []uint64{4, 5, 6} }, omnicache.ErrPlan},
		{"negative", func(p *omnicache.Plan) { p.TierBlocks = []int32{-1} }, omnicache.ErrPlan},
		{"hashes short", func(p *omnicache.Plan) { p.TierHashes = p.TierHashes[:1] }, omnicache.ErrPlan},
		{"hashes without counts", func(p *omnicache.Plan) { p.TierBlocks = nil }, omnicache.ErrPlan},
		{"full hashes short", func(p *omnicache.Plan) { p.FullBlocks = []int32{3} }, omnicache.ErrPlan},
		{"full block outside", func(p *omnicache.Plan) { p.FullBlocks, p.FullHashes = []int32{tblocks}, []uint64{1} }, omnicache.ErrPlan},
	}
	for _, tc := range cases {
		p := base()
		tc.mod(p)
		if err := c.Begin(p); !errors.Is(err, tc.want) {
			t.Fatalf("%s: Begin = %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := plain.Begin(base()); !errors.Is(err, omnicache.ErrConfig) {
		t.Fatalf("tier blocks without a tier: %v, want ErrConfig", err)
	}
	if _, err := plain.Lookup(context.Background(), []uint64{1}); !errors.Is(err, omnicache.ErrConfig) {
		t.Fatalf("Lookup without a tier: %v", err)
	}
	// Nothing was applied: the same request arrives afresh, without tier
	// blocks, and is served (its blocks were never written: the hit over
	// a required key is refused as absent, as for any cache).
	p := base()
	p.TierBlocks, p.TierHashes = nil, nil
	p.HitTokens, p.HitBlocks, p.Start = []int32{0}, nil, []int32{0}
	if err := c.Begin(p); err != nil {
		t.Fatalf("valid Begin after the failed ones: %v", err)
	}
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.LiveRequests != 0 || st.TierImported+st.TierImportFailed != 0 {
		t.Fatalf("stats after failed Begins: %+v", st)
	}
	// Configs.
	bad := []omnicache.Config{
		{NumBlocks: tblocks, BlockSize: tbs, Keys: []omnicache.Key{{Name: "hidden", RowBytes: 24}, {Name: "extra", RowBytes: 8, Deferred: true}}, Tier: &omnicache.TierConfig{Tier: tr}},
		{NumBlocks: tblocks, BlockSize: 8, Keys: tkeys, Tier: &omnicache.TierConfig{Tier: tr}},
		{NumBlocks: tblocks, BlockSize: tbs, Keys: []omnicache.Key{{Name: "hidden", RowBytes: 24}, {Name: "other", RowBytes: 8}}, Tier: &omnicache.TierConfig{Tier: tr}},
		{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys, Tier: &omnicache.TierConfig{}},
		{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys, WaitTimeout: time.Second, Tier: &omnicache.TierConfig{Tier: tr, ImportTimeout: time.Second}},
	}
	for i, cfg := range bad {
		if c, err := omnicache.New(cfg); !errors.Is(err, omnicache.ErrConfig) {
			if c != nil {
				c.Close()
			}
			t.Errorf("config %d: %v, want ErrConfig", i, err)
		}
	}
}
