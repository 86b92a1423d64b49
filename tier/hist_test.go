package tier

import (
	"context"
	"testing"
)

// TestTierHistograms: with Options.Histograms every batch is observed
// once, its bytes too; without, Histograms is nil.
func TestTierHistograms(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	off, err := New(e, testNS, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if off.Histograms() != nil {
		t.Fatal("histograms without Options.Histograms")
	}
	tr, err := New(e, testNS, Options{Histograms: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	hs := hashes(0, 3)
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(testNS, h))
	}
	stored, err := tr.Put(ctx, blocks)
	if err != nil {
		t.Fatal(err)
	}
	dst := dstFor(tr, 3)
	tr.Get(ctx, hs, dst)
	tr.Lookup(ctx, hs)
	tr.Lookup(ctx, hs[:1])
	got := map[string]Histogram{}
	for _, h := range tr.Histograms() {
		got[h.Name] = h
		if len(h.Bounds) != len(h.Counts) || h.Counts[len(h.Counts)-1] > h.Count {
			t.Fatalf("%s: %d bounds, %d counts, last %d of %d", h.Name, len(h.Bounds), len(h.Counts), h.Counts[len(h.Counts)-1], h.Count)
		}
	}
	for name, want := range map[string]uint64{"tier_lookup_seconds": 2, "tier_get_seconds": 1, "tier_set_seconds": 1, "tier_get_bytes": 1, "tier_set_bytes": 1} {
		if got[name].Count != want {
			t.Errorf("%s counted %d, want %d", name, got[name].Count, want)
		}
	}
	if s := got["tier_set_bytes"].Sum; s != float64(stored) {
		t.Errorf("tier_set_bytes sum %v, want the %d bytes stored", s, stored)
	}
	if s := got["tier_get_bytes"].Sum; s != float64(stored) {
		t.Errorf("tier_get_bytes sum %v, want %d (every value read back)", s, stored)
	}
	if b := got["tier_get_seconds"].Bounds[0]; b != 1e-6 {
		t.Errorf("first bound %v, want 1µs", b)
	}
}
