package omnicache_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

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
