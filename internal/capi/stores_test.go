package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// Caches naming one "embedded://NAME" store share it until the last
// closes it; another name is another store.
func TestSharedEmbeddedStore(t *testing.T) {
	a, err := openBackend("embedded://pd-a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := openBackend("embedded://pd-a")
	c, _ := openBackend("embedded://pd-b")
	if a.(*sharedStore).Embedded != b.(*sharedStore).Embedded || a.(*sharedStore).Embedded == c.(*sharedStore).Embedded {
		t.Fatal("one name, one store; two names, two stores")
	}
	if errs := a.Set(context.Background(), []string{"k"}, [][]byte{[]byte("v")}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if vals, _ := b.Get(context.Background(), []string{"k"}); string(vals[0]) != "v" {
		t.Fatalf("the second cache's view of the store: %q", vals[0])
	}
	for _, s := range []tier.Backend{a, c} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if sharedStores["pd-a"] == nil || sharedStores["pd-b"] != nil {
		t.Fatal("a store closed before its last cache, or kept after it")
	}
	if vals, _ := b.Get(context.Background(), []string{"k"}); string(vals[0]) != "v" {
		t.Fatal("the store lost its value when one of its caches closed")
	}
	b.Close()
	if len(sharedStores) != 0 {
		t.Fatalf("%d stores left", len(sharedStores))
	}
	if _, err := openBackend("embedded://"); !errors.Is(err, omnicache.ErrConfig) {
		t.Fatalf("a spec naming no store: %v", err)
	}
}

// heldSets is a store whose sets wait until released: published blocks
// stay pending.
type heldSets struct {
	tier.Backend
	release chan struct{}
}

func (h *heldSets) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	<-h.release
	return h.Backend.Set(ctx, keys, vals)
}

// omnicache_wait_published's bound: blocks still being stored when it
// runs out answer OMNICACHE_ERR_WAIT_TIMEOUT (108), a block never noted
// OMNICACHE_ERR_NOT_PUBLISHED (25); once stored, 0.
func TestWaitPublishedCodes(t *testing.T) {
	const bs = 4
	e, _ := tier.NewEmbedded(0)
	held := &heldSets{Backend: e, release: make(chan struct{})}
	tr, err := tier.New(held, tier.Namespace{Model: "m", BlockSize: bs, Keys: []tier.Key{{Name: "h", RowBytes: 8}}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: bs, Keys: []omnicache.Key{{Name: "h", RowBytes: 8}},
		Tier: &omnicache.TierConfig{Tier: tr, PublishBarrier: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{2 * bs}, Table: []int32{3, 5}, Stride: 2,
		Arrivals: []int64{1}, HitTokens: []int32{0}, FullBlocks: []int32{3, 5}, FullHashes: []uint64{71, 72}}
	if err := c.Begin(p); err != nil {
		t.Fatal(err)
	}
	id, err := c.Save(&omnicache.Outputs{Tokens: 2 * bs, Tensors: []omnicache.Tensor{{Host: make([]byte, 2*bs*8), Rows: 2 * bs}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Discard(id); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, 20 * time.Millisecond} {
		if err := waitPublished(c, []uint64{71, 72}, d); code(err) != 108 {
			t.Fatalf("blocks held in a set, wait %v: %v (code %d), want 108", d, err, code(err))
		}
	}
	if err := waitPublished(c, []uint64{99}, time.Second); code(err) != 25 {
		t.Fatalf("a block never noted: %v (code %d), want 25", err, code(err))
	}
	close(held.release)
	if err := waitPublished(c, []uint64{71, 72}, 10*time.Second); err != nil {
		t.Fatalf("once stored: %v", err)
	}
}
