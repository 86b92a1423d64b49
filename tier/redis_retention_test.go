package tier

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/omnicache/omnicache/internal/redistest"
)

// pttl is key's remaining expiry in ms on the server (-1: none, -2: no key).
func pttl(t *testing.T, r *Redis, key string) int64 {
	t.Helper()
	n, err := r.c.Do(context.Background(), r.c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkRetention runs the TTL and pin story on a Redis backend opened from
// spec (with ?ttl=1h): values carry the TTL, a pinned block none, a store
// again keeps the pin, Unpin gives the TTL back, a pin of a block not held
// is ErrMiss and pins nothing, Delete removes a pinned block.
func checkRetention(t *testing.T, spec string) {
	ctx := context.Background()
	b, err := Open(spec+"?ttl=1h", RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := b.(*Redis) // the test reads expiries through its client
	tr := newTier(t, b)
	hs := hashes(0, 24)
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(testNS, h))
	}
	if _, err := tr.Put(ctx, blocks); err != nil {
		t.Fatal(err)
	}
	// expiring reports whether block h's values expire (every key alike).
	expiring := func(h uint64) bool {
		t.Helper()
		exp := false
		for k := range testNS.Keys {
			ms := pttl(t, r, tr.Addr(h, k))
			if ms == -2 {
				t.Fatalf("block %016x key %d not held", h, k)
			}
			if k > 0 && (ms > 0) != exp {
				t.Fatalf("block %016x: its keys disagree on expiry", h)
			}
			exp = ms > 0 && ms <= time.Hour.Milliseconds()
		}
		return exp
	}
	for _, h := range hs {
		if !expiring(h) {
			t.Fatalf("block %016x stored without the TTL", h)
		}
	}
	missing := hashes(1000, 1)[0]
	if err := tr.Pin(ctx, []uint64{hs[0], missing}); !errors.Is(err, ErrMiss) {
		t.Fatalf("Pin with a block not held: %v, want ErrMiss", err)
	}
	if !expiring(hs[0]) {
		t.Fatal("a failed Pin pinned a block")
	}
	if err := tr.Pin(ctx, hs[:4]); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs[:4] {
		if expiring(h) {
			t.Fatalf("pinned block %016x still expires", h)
		}
	}
	if _, err := tr.Put(ctx, blocks[:8]); err != nil { // stored again: pins kept, others get the TTL afresh
		t.Fatal(err)
	}
	for i, h := range hs[:8] {
		if expiring(h) != (i >= 4) {
			t.Fatalf("block %d after a store again: expiring %v", i, expiring(h))
		}
	}
	dst := dstFor(tr, 4)
	if n := checkServed(t, tr, hs[:4], dst, tr.Get(ctx, hs[:4], dst)); n != 4 {
		t.Fatalf("%d of 4 pinned blocks served", n)
	}
	if err := tr.Unpin(ctx, hs[:2]); err != nil {
		t.Fatal(err)
	}
	if !expiring(hs[0]) || !expiring(hs[1]) || expiring(hs[2]) {
		t.Fatal("Unpin did not give the TTL back to exactly the blocks named")
	}
	if err := tr.Unpin(ctx, []uint64{missing}); err != nil {
		t.Fatalf("Unpin of a block not held: %v", err)
	}
	if err := tr.Delete(ctx, hs[2:3]); err != nil {
		t.Fatal(err)
	}
	if n, _ := tr.Lookup(ctx, hs[2:3]); n != 0 {
		t.Fatal("a deleted pinned block is still held")
	}
	// Histograms over this backend (a second tier on it; the first one's
	// cleanup closes the backend).
	ht, err := New(b, testNS, Options{Histograms: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ht.Put(ctx, blocks[10:12]); err != nil {
		t.Fatal(err)
	}
	ht.Get(ctx, hs[10:12], dstFor(ht, 2))
	ht.Lookup(ctx, hs[10:12])
	for _, h := range ht.Histograms() {
		if h.Count != 1 || (h.Name == "tier_get_bytes" || h.Name == "tier_set_bytes") && h.Sum == 0 {
			t.Errorf("%s: %d observations (sum %v), want 1", h.Name, h.Count, h.Sum)
		}
	}
}

func TestRedisRetention(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	checkRetention(t, "redis://"+s.Addr)
}

func TestRedisClusterRetention(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{})
	checkRetention(t, c.Spec())
}

// TestRedisPinnedNotEvicted: under maxmemory-policy volatile-lru, with a
// TTL on every other value, the server evicts values but never a pinned
// block.
func TestRedisPinnedNotEvicted(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru"}})
	tr := redisTier(t, RedisOptions{Addrs: []string{s.Addr}, TTL: time.Hour})
	ctx := context.Background()
	big := Namespace{Model: "evict", BlockSize: 16, Keys: []Key{{"hidden", 4096}}}
	btr, err := New(tr.Backend(), big, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pinned := hashes(0, 4)
	var blocks []Block
	for _, h := range pinned {
		blocks = append(blocks, block(big, h))
	}
	if _, err := btr.Put(ctx, blocks); err != nil {
		t.Fatal(err)
	}
	if err := btr.Pin(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ { // 20 × 16 blocks × 64 KiB: far over 3 MB
		var more []Block
		for _, h := range hashes(100+16*i, 16) {
			more = append(more, block(big, h))
		}
		btr.Put(ctx, more) // an OOM answer for some is fine: the server is full
	}
	if n, err := btr.Lookup(ctx, hashes(100, 16)); err != nil || n == 16 {
		t.Fatalf("the server evicted nothing (%d of the first 16 held, %v): the test does not test eviction", n, err)
	}
	dst := make([][]byte, len(pinned))
	for i := range dst {
		dst[i] = make([]byte, btr.BlockBytes(0))
	}
	for i, err := range btr.Get(ctx, pinned, dst) {
		if err != nil {
			t.Fatalf("pinned block %d: %v", i, err)
		}
	}
}

func TestRedisTTLConfig(t *testing.T) {
	for _, spec := range []string{"redis://h:1?ttl=0s", "redis://h:1?ttl=x", "redis://h:1?ttl=-1h", "redis://h:1?mode=x"} {
		if _, err := parseSpec(spec, RedisOptions{}); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", spec, err)
		}
	}
	opt, err := parseSpec("redis://u:p@h:1/2?ttl=90m", RedisOptions{})
	if err != nil || opt.TTL != 90*time.Minute || opt.DB != 2 || opt.Addrs[0] != "h:1" {
		t.Fatalf("parsed %+v, %v", opt, err)
	}
	for _, ttl := range []time.Duration{-time.Second, time.Microsecond, MaxRedisTTL + time.Hour} {
		if _, err := NewRedis(RedisOptions{Addrs: []string{"127.0.0.1:1"}, TTL: ttl}); !errors.Is(err, ErrConfig) {
			t.Errorf("TTL %v: %v, want ErrConfig", ttl, err)
		}
	}
}
