package fuzz

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/omnicache/omnicache/tier"
)

// content is the rows a namespace's block holds for key k: a function of
// everything that addresses them, so that rows read at any other address
// differ.
func content(ns tier.Namespace, hash uint64, k int) []byte {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%v/%d/%d", ns.Model, ns.BlockSize, ns.Keys, hash, k)
	x := h.Sum64()
	b := make([]byte, ns.BlockSize*ns.Keys[k].RowBytes)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// FuzzTierValue runs stores, raw copies of values between any two
// addresses of four namespaces sharing one backend (other models, other
// key layouts, one sealed with a secret), byte flips and reads: every
// block a tier serves holds exactly its own namespace's rows for its
// address, whatever was copied where.
//
// Input: per operation a byte op (op%4: put, copy, flip, get) then its
// parameters: tier indexes, block indexes, a key index and an offset.
func FuzzTierValue(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 0, 1, 0, 0, 0, 3, 1, 0})
	f.Add([]byte{0, 2, 3, 1, 2, 0, 3, 0, 1, 0, 3, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := context.Background()
		e, err := tier.NewEmbedded(1 << 22)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		layouts := [][]tier.Key{
			{{Name: "hidden", RowBytes: 16}, {Name: "aux", RowBytes: 4}},
			{{Name: "hidden", RowBytes: 16}, {Name: "aux", RowBytes: 4}, {Name: "codes", RowBytes: 4}},
		}
		var tiers []*tier.Tier
		for i, c := range []struct {
			model  string
			layout int
			secret string
		}{{"model-a", 0, ""}, {"model-b", 0, ""}, {"model-a", 1, ""}, {"model-a", 0, "a secret of 16 bytes"}} {
			tr, err := tier.New(e, tier.Namespace{Model: c.model, BlockSize: 4, Keys: layouts[c.layout]}, tier.Options{Secret: []byte(c.secret)})
			if err != nil {
				t.Fatalf("tier %d: %v", i, err)
			}
			tiers = append(tiers, tr)
		}
		at := 0
		next := func() int {
			if at >= len(data) {
				return 0
			}
			at++
			return int(data[at-1])
		}
		hash := func(b int) uint64 { return uint64(b%8)*0x9e3779b97f4a7c15 + 1 }
		for ops := 0; at < len(data) && ops < 64; ops++ {
			switch next() % 4 {
			case 0: // put
				tr := tiers[next()%len(tiers)]
				h := hash(next())
				ns := tr.Namespace()
				blk := tier.Block{Hash: h}
				for k := range ns.Keys {
					blk.Rows = append(blk.Rows, content(ns, h, k))
				}
				if _, err := tr.Put(ctx, []tier.Block{blk}); err != nil {
					t.Fatal(err)
				}
			case 1: // copy a raw value from one address to another
				from, to := tiers[next()%len(tiers)], tiers[next()%len(tiers)]
				hf, ht := hash(next()), hash(next())
				k := next()
				kf, kt := k%len(from.Namespace().Keys), (k>>4)%len(to.Namespace().Keys)
				vals, _ := e.Get(ctx, []string{from.Addr(hf, kf)})
				if vals[0] != nil {
					e.Set(ctx, []string{to.Addr(ht, kt)}, vals)
				}
			case 2: // flip a byte of a stored value
				tr := tiers[next()%len(tiers)]
				h, k, off := hash(next()), next(), next()
				addr := tr.Addr(h, k%len(tr.Namespace().Keys))
				vals, _ := e.Get(ctx, []string{addr})
				if v := vals[0]; v != nil {
					i := (off * 7) % len(v)
					v[i] ^= byte(1 + off%255)
					e.Set(ctx, []string{addr}, [][]byte{v})
				}
			case 3: // read: every served block is exactly the namespace's own
				tr := tiers[next()%len(tiers)]
				hs := []uint64{hash(next()), hash(next())}
				ns := tr.Namespace()
				rows, errs := tr.Fetch(ctx, hs)
				for j, h := range hs {
					if errs[j] != nil {
						if !errors.Is(errs[j], tier.ErrMiss) {
							t.Fatalf("block %x: %v does not match ErrMiss", h, errs[j])
						}
						continue
					}
					for k := range ns.Keys {
						if !bytes.Equal(rows[j*len(ns.Keys)+k], content(ns, h, k)) {
							t.Fatalf("tier %q/%d keys served wrong rows for block %x key %d", ns.Model, len(ns.Keys), h, k)
						}
					}
				}
			}
		}
	})
}
