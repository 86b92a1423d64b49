package omnicache_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/redistest"
	"github.com/omnicache/omnicache/tier"
)

// BenchmarkTierImport compares, on a local Redis, a cache's import of a
// hit's blocks into its mirror (Begin of an arrival naming them, Save,
// Materialize: the fetch, checks, scatter and the hit read) with the same
// rueidis client fetching the same values directly (one DoMulti of GETs).
// Both report the row bytes moved per second (SetBytes).
func BenchmarkTierImport(b *testing.B) {
	const bs, rowBytes, nb = 16, 4096, 64 // 64 blocks of 64 KiB: a 1024-token prefix of a 2048-wide bf16 hidden state
	s := redistest.Start(b, redistest.Options{})
	be, err := tier.Open("redis://"+s.Addr, tier.RedisOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ns := tier.Namespace{Model: "bench", BlockSize: bs, Keys: []tier.Key{{Name: "hidden", RowBytes: rowBytes}}}
	tr, err := tier.New(be, ns, tier.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	hashes := make([]uint64, nb)
	var blocks []tier.Block
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
		rows := make([]byte, bs*rowBytes)
		for j := range rows {
			rows[j] = byte(i + j)
		}
		blocks = append(blocks, tier.Block{Hash: hashes[i], Rows: [][]byte{rows}})
	}
	if _, err := tr.Put(context.Background(), blocks); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, nb)
	for i, h := range hashes {
		keys[i] = tr.Addr(h, 0)
	}
	b.Run("path=direct", func(b *testing.B) {
		b.SetBytes(nb * bs * rowBytes)
		for b.Loop() {
			vals, errs := be.Get(context.Background(), keys)
			for i := range vals {
				if errs[i] != nil || vals[i] == nil {
					b.Fatalf("get %s: %v", keys[i], errs[i])
				}
			}
		}
	})
	b.Run("path=import", func(b *testing.B) {
		c, err := omnicache.New(omnicache.Config{NumBlocks: 2*nb + 2, BlockSize: bs, StagingCapacityTokens: 64,
			Keys: []omnicache.Key{{Name: "hidden", RowBytes: rowBytes}}, Tier: &omnicache.TierConfig{Tier: tr}})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		stride := nb + 1
		table := make([]int32, 2*stride)
		for i := 0; i < stride; i++ {
			table[i], table[stride+i] = int32(i), int32(stride+i)
		}
		out := make([]byte, rowBytes)
		var res omnicache.Result
		b.SetBytes(nb * bs * rowBytes)
		id := int64(0)
		for b.Loop() {
			id++
			row := int32(id % 2) // alternate halves of the pool: the previous request finishes
			p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{row}, Start: []int32{nb * bs}, Count: []int32{1},
				Table: table, Stride: stride, Arrivals: []int64{id}, HitTokens: []int32{nb * bs},
				HitBlocks: table[int(row)*stride : int(row)*stride+nb], TierBlocks: []int32{nb}, TierHashes: hashes}
			if id > 1 {
				p.Finished = []int64{id - 1}
			}
			if err := c.Begin(p); err != nil {
				b.Fatal(err)
			}
			sid, err := c.Save(&omnicache.Outputs{Tokens: 1, Padded: 1, Tensors: []omnicache.Tensor{{Host: out, Rows: 1}}})
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Materialize(sid, nil, &res); err != nil {
				b.Fatal(err)
			}
		}
		if st := c.Stats(); st.TierImportFailed != 0 {
			b.Fatal(fmt.Sprintf("%d blocks failed", st.TierImportFailed))
		}
	})
}

// BenchmarkTierStep is the engine goroutine's cost (Begin + Save +
// Discard) of a prefill step that completes 4 blocks and arrives with a
// hit, without a tier and with one (embedded; the step's full blocks
// published, no import). The committer and publishers run beside it.
func BenchmarkTierStep(b *testing.B) {
	const bs, rowBytes, nb = 16, 1024, 64
	for _, withTier := range []bool{false, true} {
		b.Run(fmt.Sprintf("tier=%v", withTier), func(b *testing.B) {
			cfg := omnicache.Config{NumBlocks: nb, BlockSize: bs, Keys: []omnicache.Key{{Name: "hidden", RowBytes: rowBytes}}}
			if withTier {
				e, _ := tier.NewEmbedded(64 << 20)
				tr, err := tier.New(e, tier.Namespace{Model: "b", BlockSize: bs, Keys: []tier.Key{{Name: "hidden", RowBytes: rowBytes}}}, tier.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Close()
				cfg.Tier = &omnicache.TierConfig{Tier: tr}
			}
			c, err := omnicache.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const stride = 8
			table := make([]int32, 2*stride)
			out := make([]byte, 4*bs*rowBytes)
			full := make([]int32, 4)
			hashes := make([]uint64, 4)
			id := int64(0)
			for b.Loop() {
				id++
				row := int32(id % 2)
				base := int32(id%8) * 4 // blocks cycle through the pool
				for j := range full {
					full[j] = base + int32(j)
					table[int(row)*stride+j] = full[j]
					hashes[j] = uint64(id)<<8 | uint64(j)
				}
				p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{row}, Start: []int32{0}, Count: []int32{4 * bs},
					Table: table, Stride: stride, Arrivals: []int64{id}, HitTokens: []int32{0}, FullBlocks: full, FullHashes: hashes}
				if id > 1 {
					p.Finished = []int64{id - 1}
				}
				if err := c.Begin(p); err != nil {
					b.Fatal(err)
				}
				sid, err := c.Save(&omnicache.Outputs{Tokens: 4 * bs, Padded: 4 * bs, Tensors: []omnicache.Tensor{{Host: out, Rows: 4 * bs}}})
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Discard(sid); err != nil {
					b.Fatal(err)
				}
				if id%64 == 0 {
					b.StopTimer()
					c.Sync() // the committer keeps up, as a forward would let it
					b.StartTimer()
				}
			}
		})
	}
}
