package tier

import (
	"context"
	"errors"
	"testing"
	"time"
)

// failKey fails the Set of one address and passes the rest to Backend.
type failKey struct {
	Backend
	bad string
}

func (f *failKey) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	errs := f.Backend.Set(ctx, keys, vals)
	for i, k := range keys {
		if k == f.bad {
			errs[i] = errors.New("injected set failure")
		}
	}
	return errs
}

func putBlocks(t *testing.T, tr *Tier, hs []uint64) error {
	t.Helper()
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(testNS, h))
	}
	_, err := tr.Put(context.Background(), blocks)
	return err
}

func TestStoredRecently(t *testing.T) {
	e, _ := NewEmbedded(0)
	tr := newTier(t, e)
	hs := hashes(0, 8)
	for _, h := range hs {
		if tr.StoredRecently(h) {
			t.Fatalf("block %x held before any put", h)
		}
	}
	if err := putBlocks(t, tr, hs[:6]); err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if got := tr.StoredRecently(h); got != (i < 6) {
			t.Fatalf("block %d: StoredRecently %v after putting blocks 0..5", i, got)
		}
	}
	// PutValues (the publishers' path) notes its blocks as well.
	vals := [][]byte{}
	for k := range testNS.Keys {
		v, r := tr.NewValue(hs[6], k)
		copy(r, rows(testNS, hs[6], k))
		vals = append(vals, v)
	}
	if _, err := tr.PutValues(context.Background(), hs[6:7], vals); err != nil {
		t.Fatal(err)
	}
	if !tr.StoredRecently(hs[6]) || tr.StoredRecently(hs[7]) {
		t.Fatal("PutValues: block 6 not noted, or block 7 noted")
	}
}

func TestStoredRecentlyFailedKey(t *testing.T) {
	e, _ := NewEmbedded(0)
	hs := hashes(100, 3)
	probe := newTier(t, e) // for the address only
	tr, err := New(&failKey{Backend: e, bad: probe.Addr(hs[1], 1)}, testNS, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := putBlocks(t, tr, hs); err == nil {
		t.Fatal("a failed key put no error")
	}
	// Block 1's second key failed: the block is not held, and a publisher
	// must store it again; the others are.
	for i, h := range hs {
		if got := tr.StoredRecently(h); got != (i != 1) {
			t.Fatalf("block %d: StoredRecently %v", i, got)
		}
	}
}

func TestStoredRecentlyWindow(t *testing.T) {
	e, _ := NewEmbedded(0)
	never, err := New(e, testNS, Options{RecentWindow: -1})
	if err != nil {
		t.Fatal(err)
	}
	hs := hashes(200, 2)
	if err := putBlocks(t, never, hs); err != nil {
		t.Fatal(err)
	}
	if never.StoredRecently(hs[0]) {
		t.Fatal("a negative window remembered a block")
	}
	short, err := New(e, testNS, Options{RecentWindow: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := putBlocks(t, short, hs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // ≥ 19 ticks of ~1.05 ms: past a one-tick window
	if short.StoredRecently(hs[0]) || short.StoredRecently(hs[1]) {
		t.Fatal("a block stored 20ms ago held in a 1ms window")
	}
	if _, err := New(e, testNS, Options{RecentWindow: MaxRecentWindow + time.Second}); !errors.Is(err, ErrConfig) {
		t.Fatalf("window over MaxRecentWindow: %v, want ErrConfig", err)
	}
}

// Two blocks of one slot: the later pushes the earlier out (stored again
// later: only a cost), and neither is taken for the other.
func TestRecentSlotSharing(t *testing.T) {
	r := newRecent(time.Minute)
	slot := func(h uint64) uint64 { return mixHash(h) >> (64 - recentBits) }
	a := uint64(12345)
	b := a + 1
	for slot(b) != slot(a) {
		b++
	}
	now := nowTick()
	r.note(a, now)
	if !r.held(a, now) || r.held(b, now) {
		t.Fatal("a noted: held(a) false or held(b) true")
	}
	r.note(b, now)
	if r.held(a, now) || !r.held(b, now) {
		t.Fatal("b noted over a: held(a) true or held(b) false")
	}
	// A note half a wrap of the ticks (~9 min) old is out of a minute's
	// window.
	if r.held(b, now+tickMask/2) {
		t.Fatal("a note half a wrap old held")
	}
}
