package fuzz

import (
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// extremes are the values a config field takes besides small ones: the
// edges where products and sums wrap.
var extremes = []int64{0, -1, 1, 2, 16, 1 << 10, 1 << 20, 1<<20 + 1, 1<<30 - 1, 1 << 30, 1<<31 - 1, 1 << 31, 1<<32 + 1,
	1 << 40, 1 << 46, 1 << 50, 1<<62 + 1, math.MaxInt64 / 2, math.MaxInt64/2 + 1, math.MaxInt64 - 1, math.MaxInt64, math.MinInt64}

// pick reads field i of the input: an extreme, or a small value.
func pick(data []byte, i int) int64 {
	var b [2]byte
	if 2*i+1 < len(data) {
		b = [2]byte{data[2*i], data[2*i+1]}
	}
	v := binary.LittleEndian.Uint16(b[:])
	if v&1 == 0 {
		return extremes[int(v>>1)%len(extremes)]
	}
	return int64(v >> 1 % 64)
}

// FuzzConfig feeds New configs whose sizes and durations sit on the edges
// where products and sums wrap (cache and tier fields): New either refuses
// the config with ErrConfig or returns a cache that then runs a step and
// closes; it never panics. Valid configs too large for this machine are
// built only when the slot space and the staging page stay small.
func FuzzConfig(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x22, 0, 0x0c, 0}) // NumBlocks MaxInt64/2, BlockSize 1<<20: the product wraps
	f.Add([]byte{3, 0, 9, 0, 0, 0, 0x1a, 0, 0x02, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		field := func(i int) int64 { return pick(data, i) }
		asInt := func(v int64) int { return int(v) } // 64-bit: no loss
		nb, bs := field(0), field(1)
		rb1, rb2 := field(2), field(3)
		cfg := omnicache.Config{
			NumBlocks: asInt(nb), BlockSize: asInt(bs),
			Keys:                  []omnicache.Key{{Name: "hidden", RowBytes: asInt(rb1)}, {Name: "aux", RowBytes: asInt(rb2), Optional: true}},
			StagingDepth:          asInt(field(4)),
			StagingCapacityTokens: asInt(field(5)),
			StagingClaimTimeout:   time.Duration(field(6)),
			DeviceBudgetBytes:     field(7),
			DeferredChunkBytes:    field(8),
			WaitTimeout:           time.Duration(field(9)),
			ReadAheadBytes:        field(10),
			CopyWorkers:           asInt(field(11)) % 4,
		}
		withTier := len(data) > 24 && data[24]&1 == 1
		if withTier {
			keys := []tier.Key{{Name: "hidden", RowBytes: max(1, asInt(rb1))}, {Name: "aux", RowBytes: max(1, asInt(rb2))}}
			e, err := tier.NewEmbedded(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := tier.New(e, tier.Namespace{Model: "fuzz", BlockSize: max(1, asInt(bs)), Keys: keys}, tier.Options{})
			if err != nil {
				if !errors.Is(err, tier.ErrConfig) {
					t.Fatalf("tier.New: %v, want ErrConfig", err)
				}
				e.Close()
				withTier = false
			} else {
				defer tr.Close()
				cfg.Tier = &omnicache.TierConfig{Tier: tr, ImportTimeout: time.Duration(field(12)), PublishQueue: asInt(field(13)),
					PublishBatch: asInt(field(14)), Importers: asInt(field(15)) % 300, Publishers: asInt(field(16)) % 300}
			}
		}
		// The true slot count and page size, without wrapping.
		slots := new(big.Int).Mul(big.NewInt(nb), big.NewInt(bs))
		capTok := cfg.StagingCapacityTokens
		if capTok == 0 {
			capTok = omnicache.DefaultStagingCapacityTokens
		}
		small := nb > 0 && bs > 0 && slots.Cmp(big.NewInt(1<<20)) <= 0 && capTok <= 1<<16 &&
			cfg.StagingDepth <= 64 && rb1 <= 1<<16 && rb2 <= 1<<16
		valid := nb > 0 && bs > 0 && bs <= omnicache.MaxBlockSize && slots.Cmp(big.NewInt(omnicache.MaxSlots)) <= 0
		if valid && !small {
			return // a valid config this machine cannot hold: not what this target checks
		}
		c, err := omnicache.New(cfg)
		if err != nil {
			if !errors.Is(err, omnicache.ErrConfig) {
				t.Fatalf("New: %v, want nil or ErrConfig", err)
			}
			if c != nil {
				t.Fatal("New returned a cache with its error")
			}
			return
		}
		if !valid {
			t.Fatalf("New accepted %d blocks of %d tokens (%v slots)", nb, bs, slots)
		}
		// A wait bound this short may run out on a loaded machine: that is
		// a failed write (sticky) or a Close that leaves memory, by design.
		shortWait := cfg.WaitTimeout > 0 && cfg.WaitTimeout < time.Second
		timedOut := func(err error) bool {
			return shortWait && (errors.Is(err, omnicache.ErrWriteFailed) || errors.Is(err, omnicache.ErrDeviceTimeout))
		}
		defer func() {
			if err := c.Close(); err != nil && !timedOut(err) {
				t.Fatal(err)
			}
		}()
		// One step of a request over the first block.
		n := int32(min(int64(capTok), bs, 4))
		table := []int32{0}
		p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{n}, Table: table, Stride: 1,
			Arrivals: []int64{1}, HitTokens: []int32{0}}
		if err := c.Begin(p); err != nil {
			t.Fatalf("Begin on an accepted config: %v", err)
		}
		o := &omnicache.Outputs{Tokens: int(n), Padded: int(n), Tensors: []omnicache.Tensor{
			{Host: make([]byte, int(n)*int(rb1)), Rows: int(n)}, {Host: make([]byte, int(n)*int(rb2)), Rows: int(n)}}}
		id, err := c.Save(o)
		if err != nil {
			if errors.Is(err, omnicache.ErrBudget) || errors.Is(err, omnicache.ErrStagingTimeout) || timedOut(err) {
				return // a budget or a claim timeout this small is the config's choice
			}
			t.Fatalf("Save on an accepted config: %v", err)
		}
		var res omnicache.Result
		if err := c.Materialize(id, nil, &res); err != nil && !timedOut(err) {
			t.Fatalf("Materialize on an accepted config: %v", err)
		}
	})
}
