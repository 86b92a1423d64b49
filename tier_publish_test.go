package omnicache_test

// Tier publishing tests: the publish queue, batches, drops and the decode buffer.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/redistest"
	"github.com/omnicache/omnicache/tier"
)

// stuckBackend blocks every Set until released: the publisher is stuck.
type stuckBackend struct {
	tier.Backend
	release chan struct{}
	sets    chan struct{}
}

func (s *stuckBackend) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	select {
	case s.sets <- struct{}{}:
	default:
	}
	<-s.release
	return s.Backend.Set(ctx, keys, vals)
}

func TestTierPublishDropsUnderPressure(t *testing.T) {
	e, _ := tier.NewEmbedded(0)
	sb := &stuckBackend{Backend: e, release: make(chan struct{}), sets: make(chan struct{}, 1)}
	tr, err := tier.New(sb, tns(), tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys,
		Tier: &omnicache.TierConfig{Tier: tr, PublishQueue: 2, PublishBatch: 1, Publishers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	table := make([]int32, 8*tstride)
	// 8 prompts of one full block each, published while the backend is
	// stuck: one block in the stuck store, two queued, the rest dropped.
	// Every engine call returns (the test would hang otherwise).
	for i := 0; i < 8; i++ {
		table[i*tstride] = int32(i)
		res, err := tstep(t, c, table, []treq{{id: int64(100 + i), seq: int64(100 + i), row: int32(i), start: 0, count: 4, arrive: true}},
			map[int32]uint64{int32(i): thash(int64(100+i), 0)})
		if err != nil {
			t.Fatal(err)
		}
		checkRows(t, res, 0, int64(100+i), 0)
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			<-sb.sets // the publisher holds block 0 in the stuck store
		}
	}
	st := c.Stats()
	if st.TierPublishDropped != 5 {
		t.Fatalf("stats %+v: want 5 blocks dropped (1 storing, 2 queued)", st)
	}
	close(sb.release)
	for i := 0; i < 2000 && c.Stats().TierPublishPending > 0; i++ { // bounded: the publisher is asynchronous
		time.Sleep(time.Millisecond)
	}
	if st := c.Stats(); st.TierPublished != 3 || st.TierPublishPending != 0 {
		t.Fatalf("stats %+v; want the 3 blocks not dropped published", st)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestTierDecodeBufferPublishes: a block completed by buffered decode
// steps is published once its rows are written, with exactly its rows.
func TestTierDecodeBufferPublishes(t *testing.T) {
	tr, _ := embeddedTier(t)
	c := newTierCache(t, tr, nil)
	table := make([]int32, tstride)
	copy(table, []int32{6, 9})
	if _, err := tstep(t, c, table, []treq{{id: 1, seq: 3, row: 0, start: 0, count: 2, arrive: true}}, nil); err != nil {
		t.Fatal(err)
	}
	for pos := 2; pos < 7; pos++ {
		var full map[int32]uint64
		if pos == 3 {
			full = map[int32]uint64{6: thash(3, 0)} // the decode step that fills block 6
		}
		res, err := tstep(t, c, table, []treq{{id: 1, seq: 3, row: 0, start: pos, count: 1}}, full)
		if err != nil {
			t.Fatal(err)
		}
		checkRows(t, res, 0, 3, pos)
	}
	if st := c.Stats(); st.BufferedSteps == 0 {
		t.Fatalf("no decode step was buffered: %+v", st)
	}
	waitPublished(t, c, 1)
	checkTierBlock(t, tr, 3, 0)
}

// TestTierSyncBetweenBeginAndSave: a Sync between the Begin and the Save of
// a decode step that completes a block (the replay's pacing does this)
// must not publish the block before the step's own row is in: the slot
// still holds an older tenant's row.
func TestTierSyncBetweenBeginAndSave(t *testing.T) {
	tr, _ := embeddedTier(t)
	c := newTierCache(t, tr, nil)
	table := make([]int32, 2*tstride)
	table[0] = 6                         // request 50: block 6
	copy(table[tstride:], []int32{6, 9}) // request 1 gets block 6 once 50 finished
	if _, err := tstep(t, c, table, []treq{{id: 50, seq: 50, row: 0, start: 0, count: 4, arrive: true}}, nil); err != nil {
		t.Fatal(err)
	}
	p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{1}, Start: []int32{0}, Count: []int32{2}, Table: table, Stride: tstride,
		Arrivals: []int64{1}, HitTokens: []int32{0}, Finished: []int64{50}}
	step := func(p *omnicache.Plan, start, n int, syncFirst bool) {
		t.Helper()
		if err := c.Begin(p); err != nil {
			t.Fatal(err)
		}
		if syncFirst {
			if err := c.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		o := &omnicache.Outputs{Tokens: n, Padded: n}
		for k := range tkeys {
			o.Tensors = append(o.Tensors, omnicache.Tensor{Host: trows(3, k, start, n), Rows: n})
		}
		id, err := c.Save(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Discard(id); err != nil {
			t.Fatal(err)
		}
	}
	step(p, 0, 2, false)
	dec := func(pos int) *omnicache.Plan {
		return &omnicache.Plan{IDs: []int64{1}, Rows: []int32{1}, Start: []int32{int32(pos)}, Count: []int32{1}, Table: table, Stride: tstride}
	}
	step(dec(2), 2, 1, false) // parked
	full := dec(3)
	full.FullBlocks, full.FullHashes = []int32{6}, []uint64{thash(3, 0)}
	step(full, 3, 1, true) // completes block 6; Sync between its Begin and Save
	step(dec(4), 4, 1, false)
	waitPublished(t, c, 1)
	checkTierBlock(t, tr, 3, 0) // not another tenant's row
}

// checkTierBlock fails unless the tier holds prompt seq's block j, exactly.
func checkTierBlock(t *testing.T, tr *tier.Tier, seq int64, j int) {
	t.Helper()
	dst := [][]byte{make([]byte, tr.BlockBytes(0)), make([]byte, tr.BlockBytes(1))}
	if errs := tr.Get(context.Background(), []uint64{thash(seq, j)}, dst); errs[0] != nil {
		t.Fatal(errs[0])
	}
	for k := range tkeys {
		if string(dst[k]) != string(trows(seq, k, j*tbs, tbs)) {
			t.Fatalf("key %d: the tier holds wrong rows for prompt %d block %d", k, seq, j)
		}
	}
}

// sizedBackend records the keys of every Set (stuckBackend's gate first).
type sizedBackend struct {
	*stuckBackend
	mu    sync.Mutex
	sizes []int
}

func (s *sizedBackend) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(keys))
	s.mu.Unlock()
	return s.stuckBackend.Set(ctx, keys, vals)
}

// A step's full blocks go to the publishers in batches of PublishBatch
// blocks, PublishQueue bounds the blocks queued (batches in the queue and
// the one being filled), a publisher takes as many queued batches as fit
// one store and stores at most PublishBatch blocks at a time.
func TestTierPublishBatches(t *testing.T) {
	e, _ := tier.NewEmbedded(0)
	sb := &sizedBackend{stuckBackend: &stuckBackend{Backend: e, release: make(chan struct{}), sets: make(chan struct{}, 1)}}
	tr, err := tier.New(sb, tns(), tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys,
		Tier: &omnicache.TierConfig{Tier: tr, PublishQueue: 4, PublishBatch: 2, Publishers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	release := sync.OnceFunc(func() { close(sb.release) })
	defer release() // before Close: a failed check must not leave the publisher stuck
	table := make([]int32, 3*tstride)
	// prompt runs prompt seq (blocks of its own, on table row seq-1) and
	// names them full.
	block := int32(0)
	prompt := func(seq int64, blocks int) {
		t.Helper()
		row := int32(seq - 1)
		full := map[int32]uint64{}
		for j := 0; j < blocks; j++ {
			table[int(row)*tstride+j] = block
			full[block] = thash(seq, j)
			block++
		}
		res, err := tstep(t, c, table, []treq{{id: seq, seq: seq, row: row, start: 0, count: blocks * tbs, arrive: true}}, full)
		if err != nil {
			t.Fatal(err)
		}
		checkRows(t, res, 0, seq, 0)
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	prompt(1, 1)
	<-sb.sets // the publisher holds prompt 1's block in the stuck store
	// While the store is stuck: prompt 2's block is queued as a batch of
	// one; prompt 3's first 2 blocks as a batch of 2, its third fills the
	// queue's 4 blocks (in the batch being filled, queued at the step's
	// end), its last 2 are dropped.
	prompt(2, 1)
	prompt(3, 5)
	if st := c.Stats(); st.TierPublishDropped != 2 || st.TierPublishPending != 5 {
		t.Fatalf("stats %+v: want 2 blocks dropped, 5 pending (1 storing, 4 queued)", st)
	}
	release()
	for i := 0; i < 2000 && c.Stats().TierPublishPending > 0; i++ { // bounded: the publisher is asynchronous
		time.Sleep(time.Millisecond)
	}
	if st := c.Stats(); st.TierPublished != 5 || st.TierPublishPending != 0 {
		t.Fatalf("stats %+v: want the 5 blocks not dropped published", st)
	}
	// Stores: prompt 1's block; prompt 2's batch and prompt 3's first,
	// taken together (3 blocks) and stored as 2 + 1; prompt 3's third.
	sb.mu.Lock()
	sizes := fmt.Sprint(sb.sizes)
	sb.mu.Unlock()
	nk := len(tkeys)
	if want := fmt.Sprint([]int{1 * nk, 2 * nk, 1 * nk, 1 * nk}); sizes != want {
		t.Fatalf("stores of %v keys, want %v", sizes, want)
	}
	held := 0
	for seq, n := range map[int64]int{1: 1, 2: 1, 3: 5} {
		for j := 0; j < n; j++ {
			h, err := c.Lookup(context.Background(), []uint64{thash(seq, j)})
			if err != nil {
				t.Fatal(err)
			}
			held += h
		}
	}
	if held != 5 {
		t.Fatalf("the tier holds %d of the 7 blocks, want the 5 published", held)
	}
}

// A second cache computing a prompt the tier stored moments ago does not
// gather, checksum and store it again (counted); with the recent window
// off it does. Either way the blocks stay served exactly.
func TestTierPublishSkipsRecent(t *testing.T) {
	for _, window := range []time.Duration{time.Minute, -1} { // a minute: a loaded machine stays inside it
		t.Run(fmt.Sprintf("window=%v", window), func(t *testing.T) {
			e, _ := tier.NewEmbedded(0)
			tr, err := tier.New(e, tns(), tier.Options{RecentWindow: window})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close() })
			a := newTierCache(t, tr, nil)
			b := newTierCache(t, tr, nil)
			publishPrompt(t, a, 7)
			if st := a.Stats(); st.TierPublished != 3 || st.TierPublishRecent != 0 {
				t.Fatalf("cache a: %d published, %d recent; want 3, 0", st.TierPublished, st.TierPublishRecent)
			}
			puts := tr.Stats().Puts
			table := make([]int32, tstride)
			copy(table, []int32{1, 4, 6})
			res, err := tstep(t, b, table, []treq{{id: 1, seq: 7, row: 0, start: 0, count: 12, arrive: true}},
				map[int32]uint64{1: thash(7, 0), 4: thash(7, 1), 6: thash(7, 2)})
			if err != nil {
				t.Fatal(err)
			}
			checkRows(t, res, 0, 7, 0)
			if window < 0 {
				waitPublished(t, b, 3)
				if got := tr.Stats().Puts - puts; got != 3*int64(len(tkeys)) {
					t.Fatalf("window off: %d values stored again, want %d", got, 3*len(tkeys))
				}
			} else {
				if err := b.Sync(); err != nil {
					t.Fatal(err)
				}
				st := b.Stats()
				if st.TierPublishRecent != 3 || st.TierPublished != 0 || st.TierPublishPending != 0 || tr.Stats().Puts != puts {
					t.Fatalf("cache b: %d recent, %d published, %d pending, %d values stored; want 3, 0, 0, 0",
						st.TierPublishRecent, st.TierPublished, st.TierPublishPending, tr.Stats().Puts-puts)
				}
			}
			// The tier serves the prompt's blocks exactly to a third cache.
			d := newTierCache(t, tr, nil)
			if n, err := d.Lookup(context.Background(), []uint64{thash(7, 0), thash(7, 1), thash(7, 2)}); err != nil || n != 3 {
				t.Fatalf("Lookup = %d, %v; want 3", n, err)
			}
			copy(table, []int32{2, 5, 7, 8})
			res, err = tstep(t, d, table, []treq{{id: 9, seq: 7, row: 0, start: 12, count: 2, arrive: true,
				hitBlocks: []int32{2, 5, 7}, tierBlocks: 3}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkRows(t, res, 0, 7, 0)
		})
	}
}

// TestTierPublishBeforeBlockReuse: the rows of a full block go to the tier
// from the write that completed them, even when a write that reuses the
// block is queued behind it before the committer got to either (the
// committer's scan of newer writes must not make the first skip the rows
// its gather reads): the slots' older tenant's rows, or the newer
// request's, under the block's hash would be wrong rows served to every
// replica that imports it.
func TestTierPublishBeforeBlockReuse(t *testing.T) {
	tr, _ := embeddedTier(t)
	d := cachetest.NewGateDevice()
	c, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys, Device: d,
		Tier: &omnicache.TierConfig{Tier: tr}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Open()
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	table := make([]int32, 3*tstride)
	table[0], table[tstride], table[2*tstride] = 6, 6, 6 // three requests in turn in block 6
	step := func(p *omnicache.Plan, seq int64) {
		t.Helper()
		p.Table, p.Stride = table, tstride
		p.Arrivals, p.HitTokens = p.IDs, []int32{0}
		p.Start, p.Count = []int32{0}, []int32{tbs}
		if err := c.Begin(p); err != nil {
			t.Fatal(err)
		}
		o := &omnicache.Outputs{Tokens: tbs, Padded: tbs}
		for k := range tkeys {
			o.Tensors = append(o.Tensors, omnicache.Tensor{Host: trows(seq, k, 0, tbs), Rows: tbs})
		}
		id, err := c.Save(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Discard(id); err != nil {
			t.Fatal(err)
		}
	}
	// Request 50 leaves its rows in block 6 (not published), landed.
	step(&omnicache.Plan{IDs: []int64{50}, Rows: []int32{0}}, 50)
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	// Request 1 completes block 6; the committer holds its write.
	d.Arm()
	step(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{1}, Finished: []int64{50},
		FullBlocks: []int32{6}, FullHashes: []uint64{thash(1, 0)}}, 1)
	if !d.WaitEntered(cachetest.DeadlockTimeout) {
		t.Fatal("the committer did not wait for request 1's write")
	}
	// Request 2 gets block 6 and its write queues behind request 1's.
	step(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{2}, Finished: []int64{1}}, 2)
	d.Open()
	waitPublished(t, c, 1)
	checkTierBlock(t, tr, 1, 0)
}

// TestTierAdmitAfter: with AdmitAfter 2 a prompt's blocks are published
// the second time a cache (any cache of the tier: sightings are the
// tier's) computes them, not the first; a config out of range is refused.
func TestTierAdmitAfter(t *testing.T) {
	for _, backend := range []string{"embedded", "redis", "redis-cluster"} {
		t.Run("backend="+backend, func(t *testing.T) { testAdmitAfter(t, backend) })
	}
}

func testAdmitAfter(t *testing.T, backend string) {
	var tr *tier.Tier
	switch backend {
	case "embedded":
		tr, _ = embeddedTier(t)
	default:
		spec := ""
		if backend == "redis" {
			spec = "redis://" + redistest.Start(t, redistest.Options{}).Addr
		} else {
			spec = redistest.StartCluster(t, redistest.Options{}).Spec()
		}
		b, err := tier.Open(spec, tier.RedisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if tr, err = tier.New(b, tns(), tier.Options{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
	}
	admit2 := func(tc *omnicache.TierConfig) { tc.AdmitAfter = 2 }
	a := newTierCache(t, tr, admit2)
	b := newTierCache(t, tr, admit2)
	run := func(c *omnicache.Cache, seq int64) {
		t.Helper()
		table := make([]int32, tstride)
		copy(table, []int32{2, 5, 7})
		res, err := tstep(t, c, table, []treq{{id: seq, seq: seq, row: 0, start: 0, count: 12, arrive: true}},
			map[int32]uint64{2: thash(seq, 0), 5: thash(seq, 1), 7: thash(seq, 2)})
		if err != nil {
			t.Fatal(err)
		}
		checkRows(t, res, 0, seq, 0)
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	lookup := func(seq int64) int {
		n, err := tr.Lookup(context.Background(), []uint64{thash(seq, 0), thash(seq, 1), thash(seq, 2)})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	run(a, 7)
	if st := a.Stats(); st.TierPublishUnadmitted != 3 || st.TierPublished != 0 || st.TierPublishPending != 0 {
		t.Fatalf("first sighting: %+v; want 3 unadmitted, none published", st)
	}
	if n := lookup(7); n != 0 {
		t.Fatalf("tier holds %d blocks after one sighting, want 0", n)
	}
	run(b, 7) // the second sighting, by another cache of the tier
	waitPublished(t, b, 3)
	if n := lookup(7); n != 3 {
		t.Fatalf("tier holds %d blocks after two sightings, want 3", n)
	}
	if got := tr.Sightings().Count(thash(7, 0)); got != 2 {
		t.Fatalf("sketch counts %d sightings, want 2", got)
	}
	for _, bad := range []int{-1, omnicache.MaxAdmitAfter + 1} {
		_, err := omnicache.New(omnicache.Config{NumBlocks: tblocks, BlockSize: tbs, Keys: tkeys,
			Tier: &omnicache.TierConfig{Tier: tr, AdmitAfter: bad}})
		if !errors.Is(err, omnicache.ErrConfig) {
			t.Fatalf("AdmitAfter %d: %v, want ErrConfig", bad, err)
		}
	}
}
