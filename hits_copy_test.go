package omnicache_test

// Copies: rows stay exact whoever copies them, and when. Owned outputs
// are used without a defensive copy and non-owned ones are copied before
// Save returns, also on a device whose copies run later
// (cachetest.AsyncDevice); a large step's rows are copied out by Save;
// scatters and gathers split across the copy workers.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// Owned outputs are used without a defensive copy (ClonedBytes
// does not grow); non-owned outputs are copied (ClonedBytes grows by the
// bytes copied) and isolated from later overwrites of the engine's buffers
// (the harness overwrites every non-owned buffer right after Save).
func TestOwnedOutputs(t *testing.T) {
	const a, b = 1, 2
	rowBytes := int64(cachetest.KeyHidden.RowBytes + cachetest.KeyAux.RowBytes)
	for _, device := range []bool{false, true} {
		for _, owned := range []bool{true, false} {
			name := fmt.Sprintf("device=%v owned=%v", device, owned)
			t.Run(name, func(t *testing.T) {
				cfg := cachetest.Config()
				cfg.StagingDepth = 8 // five steps are consumed at the end
				h := cachetest.New(t, cfg)
				h.Device, h.Owned = device, owned
				d := cachetest.NewDecoder(h)
				h.Assign(a, 1, 2, 5)
				h.Assign(b, 3, 4)
				base := h.Stats().ClonedBytes
				s1 := h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 4), d.S(b, 2)}, Arrive: []cachetest.A{{ID: a}, {ID: b}}})
				cloned := h.Stats().ClonedBytes - base
				if owned {
					assert.Zero(t, cloned, "Stats.ClonedBytes after an owned step")
				} else {
					assert.Equal(t, 6*rowBytes, cloned, "Stats.ClonedBytes after a non-owned 6-token step")
				}
				var ids []omnicache.StepID
				for i := 0; i < 3; i++ { // pure decode: parked rows
					ids = append(ids, h.Step(d.Decode(a, b)))
				}
				ids = append(ids, h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 1)}}))
				cloned = h.Stats().ClonedBytes - base
				if owned {
					assert.Zero(t, cloned, "Stats.ClonedBytes after owned steps")
				} else {
					assert.GreaterOrEqual(t, cloned, (6+6+3)*rowBytes, "Stats.ClonedBytes after non-owned steps")
				}
				h.Mat(s1)
				for _, id := range ids {
					h.Mat(id)
				}
				h.CheckMirror()
			})
		}
	}
}

// A non-owned device tensor may be overwritten as soon as Save returns,
// even on a device whose copies run later: Save waits for its clones. The
// harness scribbles every non-owned output right after Save; a clone that
// ran after that would hand back the scribbles.
func TestNonOwnedDeviceTensorOverwrittenAfterSave(t *testing.T) {
	for _, buffer := range []bool{true, false} {
		t.Run(fmt.Sprintf("buffer=%v", buffer), func(t *testing.T) {
			cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes)
			cfg.Device = cachetest.NewAsyncDevice()
			cfg.DisableDecodeBuffer = !buffer
			h := cachetest.New(t, cfg)
			h.Device = true
			const a, b = 1, 2
			h.Assign(a, 1, 2, 3)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
			for pos := 8; pos < 12; pos++ { // pure decode steps (parked with the buffer on)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, int64(pos), 1}}}))
			}
			h.Assign(b, 1, 2, 4)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}, Finished: []int64{a}}))
			h.Mat(h.Step(cachetest.Step{Finished: []int64{b}}))
			h.Sync()
			h.CheckMirror(h.AllKeys()...)
		})
	}
}

// A large step's non-owned device tensor: Save waits for its clone, and
// issues the copy out of the clone itself (behind it on the stream) before
// it hands the write over; the committer waits for that copy instead of
// issuing one. On a device whose copies run at the next wait, the step's
// own rows, the mirror and a later hit read the clone's rows, not the
// tensor scribbled after Save. A device→host copy failing there is the
// sticky write failure: Save fails, the pages and the budget come back.
func TestLargeClonedStepCopiedBySave(t *testing.T) {
	const rb, tok, bs = 128 << 10, 48, 16 // 6 MiB: above the lazy hand-over's 4 MiB
	newCfg := func(d gpu.Device) omnicache.Config {
		return omnicache.Config{NumBlocks: 8, BlockSize: bs, StagingCapacityTokens: 64,
			Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, DisableDecodeBuffer: true, Device: d}
	}
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	plan := func(id int64, start, count int32, hit int32, finished ...int64) *omnicache.Plan {
		p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{0}, Start: []int32{start}, Count: []int32{count},
			Table: table, Stride: len(table), Arrivals: []int64{id}, HitTokens: []int32{hit}, Finished: finished}
		if hit > 0 {
			p.HitBlocks = []int32{0, 1, 2}[:hit/bs]
		}
		return p
	}
	src := make([]byte, tok*rb)
	for i := range src {
		src[i] = byte(i*7 + i/rb)
	}

	t.Run("rows", func(t *testing.T) {
		d := cachetest.NewAsyncDevice()
		c, err := omnicache.New(newCfg(d))
		require.NoError(t, err)
		defer c.Close()
		tensor, err := d.Alloc(tok * rb)
		require.NoError(t, err)
		copy(tensor.Host, src)
		require.NoError(t, c.Begin(plan(1, 0, tok, 0)))
		id, err := c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
		require.NoError(t, err)
		for i := range tensor.Host {
			tensor.Host[i] = 0xEE // the engine reuses its tensor at once
		}
		var res omnicache.Result
		require.NoError(t, c.Materialize(id, nil, &res))
		require.True(t, bytes.Equal(res.Rows(0, 0), src), "the step's own rows")
		require.NoError(t, c.Sync())
		got := make([]byte, tok*rb)
		sl := make([]int32, tok)
		for i := range sl {
			sl[i] = int32(i)
		}
		require.NoError(t, c.Peek(0, sl, got))
		require.True(t, bytes.Equal(got, src), "the mirror's rows")

		// A new request hits the first 32 rows and computes 16 more.
		copy(tensor.Host, src[:16*rb])
		require.NoError(t, c.Begin(plan(2, 32, 16, 32, 1)))
		id, err = c.Save(&omnicache.Outputs{Tokens: 16, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: 16}}})
		require.NoError(t, err)
		require.NoError(t, c.Materialize(id, nil, &res))
		require.True(t, bytes.Equal(res.Rows(0, 0)[:32*rb], src[:32*rb]), "hit rows")
		st := c.Stats()
		require.Zero(t, st.RowsSkipped)
	})

	t.Run("copy fails", func(t *testing.T) {
		f := gputest.NewFaulty(gpu.NewHost())
		c, err := omnicache.New(newCfg(f))
		require.NoError(t, err)
		defer c.Close()
		tensor, err := f.Alloc(tok * rb)
		require.NoError(t, err)
		copy(tensor.Host, src)
		f.FailOpAfter(gputest.OpCopyDtoH, 0) // the clone succeeds, its copy out fails
		require.NoError(t, c.Begin(plan(1, 0, tok, 0)))
		_, err = c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
		require.ErrorIs(t, err, omnicache.ErrWriteFailed)
		st := c.Stats()
		require.Zero(t, st.PagesInUse, "the page came back")
		require.Zero(t, st.BudgetCharged, "the clone's budget came back")
		require.ErrorIs(t, c.Begin(plan(2, 0, 1, 0)), omnicache.ErrWriteFailed, "the failure is sticky")
	})
}

// copyRow is the content of key k's row at position pos of request id.
func copyRow(dst []byte, k int, id int64, pos int) {
	x := uint64(id)<<32 ^ uint64(pos)<<4 ^ uint64(k) ^ 0x9E3779B97F4A7C15
	for i := 0; i+8 <= len(dst); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(dst[i:], x)
	}
}

// With the split forced on every copy (split size 1, three copy
// goroutines), scatters of immediate and deferred rows and the gathers of
// hits give exact rows, while steps are materialized on another goroutine,
// late, concurrently with the engine's next steps and the committer.
func TestCopyWorkersSplitExact(t *testing.T) {
	defer omnicache.SetSplitBytes(1)()
	const (
		bs, prompt, perRound, rounds = 16, 96, 4, 40
		blocksPer                    = prompt / bs
		ring                         = 8 * perRound * blocksPer
	)
	keys := []omnicache.Key{
		{Name: "hidden", RowBytes: 1024},
		{Name: "aux", RowBytes: 512, Optional: true},
		{Name: "mm", RowBytes: 768, Deferred: true},
	}
	for _, workers := range []int{1, 3} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			c, err := omnicache.New(omnicache.Config{
				NumBlocks: ring, BlockSize: bs, Keys: keys, CopyWorkers: workers,
				StagingCapacityTokens: perRound * prompt,
			})
			require.NoError(t, err)
			defer c.Close()

			type want struct {
				sid    omnicache.StepID
				ids    []int64
				hitOf  []int64 // per request: whose rows its prefix holds (0: none)
				hits   []int
				starts []int
			}
			// A hit's rows belong to whoever wrote them: the request it hit,
			// or further back when that one hit too.
			var mu sync.Mutex
			hitOf, hitLen := map[int64]int64{}, map[int64]int{}
			ownerOf := func(id int64, pos int) int64 {
				mu.Lock()
				defer mu.Unlock()
				for pos < hitLen[id] {
					id = hitOf[id]
				}
				return id
			}
			work := make(chan want, 2)
			errs := make(chan error, 1)
			var wg sync.WaitGroup
			wg.Go(func() {
				var res omnicache.Result
				var bad error
				for w := range work {
					if bad != nil {
						c.Discard(w.sid)
						continue
					}
					if err := c.Materialize(w.sid, nil, &res); err != nil {
						bad = err
						continue
					}
					for i, id := range w.ids {
						if res.Prefix(i) != w.hits[i] || res.Tokens(i) != prompt-w.starts[i]+w.hits[i] {
							bad = fmt.Errorf("request %d: prefix %d of %d rows, want %d of %d", id, res.Prefix(i), res.Tokens(i), w.hits[i], prompt-w.starts[i]+w.hits[i])
							break
						}
						for k, key := range keys {
							rows := res.Rows(i, k)
							exp := make([]byte, key.RowBytes)
							for p := 0; p < res.Tokens(i) && bad == nil; p++ {
								pos := w.starts[i] - w.hits[i] + p
								owner := ownerOf(id, pos)
								copyRow(exp, k, owner, pos)
								if !bytes.Equal(rows[p*key.RowBytes:(p+1)*key.RowBytes], exp) {
									bad = fmt.Errorf("request %d key %s position %d: wrong row (owner %d)", id, key.Name, pos, owner)
								}
							}
						}
					}
				}
				errs <- bad
			})

			table := make([]int32, perRound*2*blocksPer) // rows: this round's requests
			stride := blocksPer
			nextBlk := int32(0)
			fresh := func() int32 { b := nextBlk; nextBlk = (nextBlk + 1) % ring; return b }
			blocks := map[int64][]int32{}
			var prev []int64
			var id int64
			bufs := make([][]byte, len(keys))
			for r := 0; r < rounds; r++ {
				p := omnicache.Plan{Table: table, Stride: stride, Finished: prev}
				w := want{}
				tokens := 0
				for i := 0; i < perRound; i++ {
					id++
					hit, of := 0, int64(0)
					if r >= 2 && i%2 == 0 {
						of = id - 2*perRound + 1 // finished a round ago, no hit itself
						hit = bs * (2 + 2*(r%2))
					}
					bl := make([]int32, blocksPer)
					for j := range bl {
						if j < hit/bs {
							bl[j] = blocks[of][j]
						} else {
							bl[j] = fresh()
						}
					}
					blocks[id] = bl
					mu.Lock()
					hitOf[id], hitLen[id] = of, hit
					mu.Unlock()
					copy(table[i*stride:], bl)
					p.IDs = append(p.IDs, id)
					p.Rows = append(p.Rows, int32(i))
					p.Start = append(p.Start, int32(hit))
					p.Count = append(p.Count, int32(prompt-hit))
					p.Arrivals = append(p.Arrivals, id)
					p.HitTokens = append(p.HitTokens, int32(hit))
					p.HitBlocks = append(p.HitBlocks, bl[:hit/bs]...)
					w.ids = append(w.ids, id)
					w.hitOf = append(w.hitOf, of)
					w.hits = append(w.hits, hit)
					w.starts = append(w.starts, hit)
					tokens += prompt - hit
				}
				require.NoError(t, c.Begin(&p))
				outs := omnicache.Outputs{Tokens: tokens}
				for k, key := range keys {
					bufs[k] = make([]byte, tokens*key.RowBytes)
					off := 0
					for i, rid := range w.ids {
						for pos := w.starts[i]; pos < prompt; pos++ {
							copyRow(bufs[k][off:off+key.RowBytes], k, rid, pos)
							off += key.RowBytes
						}
					}
					outs.Tensors = append(outs.Tensors, omnicache.Tensor{Host: bufs[k], Rows: tokens})
				}
				w.sid, err = c.Save(&outs)
				require.NoError(t, err)
				work <- w
				prev = w.ids
			}
			close(work)
			wg.Wait()
			require.NoError(t, <-errs)
			require.NoError(t, c.Sync())
			if workers > 1 {
				require.Positive(t, omnicache.CopySplits(c))
			} else {
				require.Zero(t, omnicache.CopySplits(c))
			}
		})
	}
}

// CopyWorkers outside [0, MaxCopyWorkers] is a configuration error.
func TestCopyWorkersConfig(t *testing.T) {
	for _, n := range []int{-1, omnicache.MaxCopyWorkers + 1} {
		_, err := omnicache.New(omnicache.Config{NumBlocks: 4, BlockSize: 16, Keys: []omnicache.Key{{Name: "h", RowBytes: 64}}, CopyWorkers: n})
		require.ErrorIs(t, err, omnicache.ErrConfig, "CopyWorkers %d", n)
	}
	c, err := omnicache.New(omnicache.Config{NumBlocks: 4, BlockSize: 16, Keys: []omnicache.Key{{Name: "h", RowBytes: 64}}, CopyWorkers: 1})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestDefaultCopyWorkers: the default leaves one P to the engine goroutine
// (at least one copier, at most 16).
func TestDefaultCopyWorkers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 2, 16: 15, 17: 16, 64: 16} {
		runtime.GOMAXPROCS(procs)
		require.Equal(t, want, omnicache.DefaultCopyWorkers(), "GOMAXPROCS %d", procs)
	}
}
