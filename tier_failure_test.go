package omnicache_test

// Tier failure and shutdown tests: a lost Redis node, hung and dead backends, Close.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/redistest"
	"github.com/omnicache/omnicache/tier"
)

// TestTierRedisNodeLost imports through a Redis node with a password, then
// kills it: the next import fails its request (counted), never serves a
// wrong row, and the engine's calls return.
func TestTierRedisNodeLost(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "pw"})
	b, err := tier.Open("redis://:pw@"+s.Addr, tier.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tier.New(b, tns(), tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	a := newTierCache(t, tr, nil)
	c := newTierCache(t, tr, func(tc *omnicache.TierConfig) { tc.ImportTimeout = time.Second })
	publishPrompt(t, a, 7)
	table := make([]int32, 2*tstride)
	copy(table, []int32{10, 3, 0, 1})
	copy(table[tstride:], []int32{11, 4, 5})
	res, err := tstep(t, c, table, []treq{{id: 9, seq: 7, row: 0, start: 12, count: 1, arrive: true, hitBlocks: []int32{10, 3, 0}, tierBlocks: 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRows(t, res, 0, 7, 0)
	s.Kill()
	res, err = tstep(t, c, table, []treq{{id: 10, seq: 7, row: 1, start: 8, count: 1, arrive: true, hitBlocks: []int32{11, 4}, tierBlocks: 2}}, nil)
	if !errors.Is(err, omnicache.ErrTierMiss) || !errors.Is(res.Err(0), tier.ErrUnavailable) {
		t.Fatalf("import from a dead node: %v (%v); want ErrTierMiss, tier.ErrUnavailable", err, res.Err(0))
	}
	if st := c.Stats(); st.TierImported != 3 || st.TierImportFailed != 2 {
		t.Fatalf("stats %+v: want 3 imported, 2 failed", st)
	}
}

// TestTierCloseLeavesNothing: Close stops the importers and the publisher.
func TestTierCloseLeavesNothing(t *testing.T) {
	tr, _ := embeddedTier(t)
	before := runtime.NumGoroutine()
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys, Tier: &omnicache.TierConfig{Tier: tr, Importers: 4}})
	if err != nil {
		t.Fatal(err)
	}
	publishPrompt(t, c, 5)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000 && runtime.NumGoroutine() > before; i++ { // bounded: exiting goroutines
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after Close, %d before New", n, before)
	}
}

// hungBackend never answers a Get until released, whatever the context
// says: the worst a network can do.
type hungBackend struct {
	tier.Backend
	release chan struct{}
}

func (h *hungBackend) Get(ctx context.Context, keys []string) ([][]byte, []error) {
	<-h.release
	return h.Backend.Get(ctx, keys)
}

// TestTierImportNeverBlocksTheEngine: with a tier that hangs, Begin and
// Save return (the test would hang otherwise), and Materialize gives up on
// the import after its bound, failing only the importing request.
func TestTierImportNeverBlocksTheEngine(t *testing.T) {
	e, _ := tier.NewEmbedded(0)
	hb := &hungBackend{Backend: e, release: make(chan struct{})}
	tr, err := tier.New(hb, tns(), tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	a := newTierCache(t, tr, nil)
	publishPrompt(t, a, 7)
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys,
		Tier: &omnicache.TierConfig{Tier: tr, ImportTimeout: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	table := make([]int32, 2*tstride)
	copy(table, []int32{10, 3, 0, 1})
	copy(table[tstride:], []int32{12})
	res, err := tstep(t, c, table, []treq{
		{id: 9, seq: 7, row: 0, start: 12, count: 1, arrive: true, hitBlocks: []int32{10, 3, 0}, tierBlocks: 3},
		{id: 20, seq: 20, row: 1, start: 0, count: 2, arrive: true},
	}, nil)
	var te *omnicache.TierImportError
	if !errors.As(err, &te) || te.Request != 9 || te.Index != 0 || !errors.Is(err, tier.ErrUnavailable) {
		t.Fatalf("Materialize: %v; want request 9's import to give up (ErrUnavailable) at its first block", err)
	}
	checkRows(t, res, 1, 20, 0)
	if st := c.Stats(); st.TierImportFailed != 3 {
		t.Fatalf("stats %+v: want 3 failed blocks", st)
	}
	close(hb.release) // the importer's fetch returns; Close then stops it
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// deadBackend is a tier whose stores never complete before their context
// ends (a black-holed network). entered is closed by the first store.
type deadBackend struct {
	tier.Backend
	entered chan struct{}
	once    *sync.Once
}

func (d deadBackend) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	d.once.Do(func() { close(d.entered) })
	<-ctx.Done()
	errs := make([]error, len(keys))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: %w", tier.ErrUnavailable, ctx.Err())
	}
	return errs
}

// TestTierCloseWithDeadTier: Close returns with a tier that never stores:
// the store in flight ends at the tier's timeout, the queued blocks are
// dropped and counted, nothing is lost from the counts.
func TestTierCloseWithDeadTier(t *testing.T) {
	e, _ := tier.NewEmbedded(0)
	dead := deadBackend{Backend: e, entered: make(chan struct{}), once: new(sync.Once)}
	tr, err := tier.New(dead, tns(), tier.Options{Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys,
		Tier: &omnicache.TierConfig{Tier: tr, PublishQueue: 4, PublishBatch: 1, Publishers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	table := make([]int32, 8*tstride)
	for i := 0; i < 8; i++ {
		table[i*tstride] = int32(i)
		if _, err := tstep(t, c, table, []treq{{id: int64(100 + i), seq: int64(100 + i), row: int32(i), start: 0, count: 4, arrive: true}},
			map[int32]uint64{int32(i): thash(int64(100+i), 0)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	// A store is in flight before Close (on a loaded machine the publisher
	// may not have taken a block yet: Close would then drop all 8).
	select {
	case <-dead.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no store began within 10s: deadlock?")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.TierPublished != 0 || st.TierPublishPending != 0 || st.TierPublishErrors+st.TierPublishDropped != 8 || st.TierPublishErrors == 0 {
		t.Fatalf("stats %+v: want every one of the 8 blocks failed or dropped, none pending", st)
	}
}

// TestTierHungStoreFailsFast stops a Redis server (SIGSTOP: connections
// open, no answers). The first import runs out of its time and opens the
// tier's circuit; every later import and Lookup fails with
// tier.ErrCircuitOpen instead of waiting out its timeout (the engine's
// steps go on, the importing requests recompute), never a wrong row. Once
// the server answers again a probe closes the circuit and imports serve
// exact rows again.
func TestTierHungStoreFailsFast(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	b, err := tier.Open("redis://"+s.Addr, tier.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tier.New(b, tns(), tier.Options{Timeout: 100 * time.Millisecond, ProbeInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	a := newTierCache(t, tr, nil)
	c := newTierCache(t, tr, func(tc *omnicache.TierConfig) { tc.ImportTimeout = 100 * time.Millisecond })
	publishPrompt(t, a, 7)
	table := make([]int32, 8*tstride)
	for i := 0; i < 8; i++ {
		copy(table[i*tstride:], []int32{int32(10 + i), 3, 0, 1})
	}
	imp := func(id int64, row int32) (*omnicache.Result, error) {
		table[int(row)*tstride] = int32(8 + row) // a fresh local block per request
		return tstep(t, c, table, []treq{{id: id, seq: 7, row: row, start: 4, count: 1, arrive: true,
			hitBlocks: []int32{int32(8 + row)}, tierBlocks: 1}}, nil)
	}
	s.Pause(t)
	res, err := imp(100, 0)
	if !errors.Is(err, omnicache.ErrTierMiss) || !errors.Is(res.Err(0), tier.ErrUnavailable) {
		t.Fatalf("the import that meets the hung server: %v (%v); want ErrTierMiss, ErrUnavailable", err, res.Err(0))
	}
	if st := c.Stats(); st.TierCircuitOpens != 1 || st.TierCircuitOpen != 1 {
		t.Fatalf("stats %+v: want the circuit opened once and open", st)
	}
	for i := int64(1); i <= 3; i++ {
		res, err := imp(100+i, int32(i))
		if !errors.Is(err, omnicache.ErrTierMiss) || !errors.Is(res.Err(0), tier.ErrCircuitOpen) {
			t.Fatalf("import %d while the server hangs: %v (%v); want ErrTierMiss, ErrCircuitOpen (no wait)", i, err, res.Err(0))
		}
	}
	if _, err := c.Lookup(context.Background(), []uint64{thash(7, 0)}); !errors.Is(err, tier.ErrCircuitOpen) {
		t.Fatalf("Lookup while the server hangs: %v; want ErrCircuitOpen", err)
	}
	s.Resume(t)
	for i := 0; c.Stats().TierCircuitOpen != 0; i++ { // bounded: a hang detector, not a speed
		if i == 10000 {
			t.Fatal("the circuit stayed open 10s after the server answered again")
		}
		time.Sleep(time.Millisecond)
	}
	res, err = imp(200, 5)
	if err != nil {
		t.Fatalf("import after recovery: %v", err)
	}
	checkRows(t, res, 0, 7, 0)
}
