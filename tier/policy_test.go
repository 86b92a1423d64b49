package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestEmbeddedPolicyConfig(t *testing.T) {
	if _, err := NewEmbeddedPolicy(1<<20, "clock"); !errors.Is(err, ErrConfig) {
		t.Fatalf("unknown policy: %v, want ErrConfig", err)
	}
	e, err := NewEmbeddedPolicy(1<<20, "")
	if err != nil || e.Policy() != DefaultPolicy {
		t.Fatalf("default policy: %v, %v", e.Policy(), err)
	}
	e.Close()
}

// fillVal is a value of n bytes derived from k.
func fillVal(k string, n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = byte(len(k)*31 + i + int(k[len(k)-1]))
	}
	return v
}

// TestEmbeddedScanResistance: 40 values read again (a reused prefix), then
// a scan of 2000 values stored once (one-off prompts), in a store of room
// for about 100: S3-FIFO keeps every reused value, LRU none.
func TestEmbeddedScanResistance(t *testing.T) {
	ctx := context.Background()
	const n = 1000
	for _, pol := range []Policy{PolicyLRU, PolicyS3FIFO} {
		e, _ := NewEmbeddedPolicy(100*(n+8), pol)
		for i := 0; i < 40; i++ {
			k := fmt.Sprintf("hot%03d", i)
			e.Set(ctx, []string{k}, [][]byte{fillVal(k, n)})
		}
		// Read twice while the scan runs: reuse.
		for round := 0; round < 2; round++ {
			for i := 0; i < 40; i++ {
				e.Get(ctx, []string{fmt.Sprintf("hot%03d", i)})
			}
			for i := 0; i < 1000; i++ {
				k := fmt.Sprintf("scan%d.%04d", round, i)
				e.Set(ctx, []string{k}, [][]byte{fillVal(k, n)})
			}
		}
		held := 0
		for i := 0; i < 40; i++ {
			k := fmt.Sprintf("hot%03d", i)
			v, _ := e.Get(ctx, []string{k})
			if v[0] != nil {
				if !bytes.Equal(v[0], fillVal(k, n)) {
					t.Fatalf("%s: %s holds a wrong value", pol, k)
				}
				held++
			}
		}
		switch {
		case pol == PolicyS3FIFO && held != 40:
			t.Errorf("S3-FIFO kept %d of 40 reused values through the scan, want 40", held)
		case pol == PolicyLRU && held != 0:
			t.Errorf("LRU kept %d of 40 reused values through the scan, want 0", held)
		}
		e.Close()
	}
}

// TestEmbeddedGhost: a value S3-FIFO evicted from its small queue unread
// and stored again soon after enters the main queue.
func TestEmbeddedGhost(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbeddedPolicy(20*1008, PolicyS3FIFO)
	defer e.Close()
	e.Set(ctx, []string{"g"}, [][]byte{fillVal("g", 1000)})
	for i := 0; e.Len("g") > 0; i++ {
		k := fmt.Sprintf("o%03d", i)
		e.Set(ctx, []string{k}, [][]byte{fillVal(k, 1000)})
	}
	e.Set(ctx, []string{"g"}, [][]byte{fillVal("g", 1000)})
	e.mu.Lock()
	q := e.ents[e.find(e.hash("g"), "g")].q
	e.mu.Unlock()
	if q != qMain {
		t.Fatalf("a ghost's value stored again entered queue %d, want the main one", q)
	}
}

// Len is 1 when key is held, else 0 (tests).
func (e *Embedded) Len(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.find(e.hash(key), key) >= 0 {
		return 1
	}
	return 0
}

// checkQueues checks the queues' links and byte counts against used.
func checkQueues(t *testing.T, e *Embedded) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	var queued int64
	for _, q := range []uint8{qSmall, qMain} {
		l := &e.q[q]
		n, bytes, prev := 0, int64(0), int32(-1)
		for x := l.head; x >= 0; x = e.ents[x].next {
			en := &e.ents[x]
			if en.q != q || en.prev != prev || en.kept {
				t.Fatalf("queue %d: entry %d links q=%d prev=%d (want %d) kept=%v", q, x, en.q, en.prev, prev, en.kept)
			}
			n++
			bytes += int64(en.klen) + int64(en.vlen)
			prev = x
		}
		if l.tail != prev || n != l.n || bytes != l.bytes {
			t.Fatalf("queue %d: tail %d/%d, %d/%d entries, %d/%d bytes", q, l.tail, prev, n, l.n, bytes, l.bytes)
		}
		queued += bytes
	}
	if queued+e.pinned+e.reserved != e.used {
		t.Fatalf("%d queued + %d pinned + %d reserved != %d used", queued, e.pinned, e.reserved, e.used)
	}
}

// TestEmbeddedPoliciesRandom: random Sets, Gets, Deletes, Pins and Unpins
// of mixed sizes under both policies: the bound holds, a value read is
// the last one set, a pinned value is never evicted, the queues add up.
func TestEmbeddedPoliciesRandom(t *testing.T) {
	ctx := context.Background()
	for _, pol := range []Policy{PolicyLRU, PolicyS3FIFO} {
		t.Run(string(pol), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 9))
			e, _ := NewEmbeddedPolicy(256<<10, pol)
			defer e.Close()
			last := map[string][]byte{}
			pinned := map[string]bool{}
			key := func() string { return fmt.Sprintf("k%d", rng.IntN(400)) }
			for op := 0; op < 20000; op++ {
				switch r := rng.IntN(20); {
				case r < 10:
					k := key()
					v := fillVal(k, []int{100, 1100, 5000}[rng.IntN(3)]+rng.IntN(50))
					v[0] = byte(op)
					if err := e.Set(ctx, []string{k}, [][]byte{v})[0]; err != nil {
						if !errors.Is(err, ErrNoRoom) {
							t.Fatalf("op %d: Set: %v", op, err)
						}
						break
					}
					last[k] = v
				case r < 16:
					k := key()
					v, _ := e.Get(ctx, []string{k})
					if v[0] != nil && !bytes.Equal(v[0], last[k]) {
						t.Fatalf("op %d: Get(%s): not the last value set", op, k)
					}
					if v[0] == nil && pinned[k] {
						t.Fatalf("op %d: pinned %s evicted", op, k)
					}
				case r < 17:
					k := key()
					e.Delete(ctx, []string{k})
					delete(last, k)
					delete(pinned, k)
				case r < 19 && len(pinned) < 10:
					k := key()
					err := e.Pin(ctx, []string{k})[0]
					if held := e.Len(k) == 1; held != (err == nil) || (err != nil && !errors.Is(err, ErrMiss)) {
						t.Fatalf("op %d: Pin(%s) = %v, held %v", op, k, err, held)
					}
					if err == nil {
						pinned[k] = true
					}
				default:
					for k := range pinned {
						e.Unpin(ctx, []string{k})
						delete(pinned, k)
						break
					}
				}
				if used, max, _ := e.Usage(); used > max {
					t.Fatalf("op %d: %d bytes used, bound %d", op, used, max)
				}
				if op%97 == 0 {
					checkQueues(t, e)
				}
			}
			if _, _, ev := e.Usage(); ev == 0 {
				t.Fatal("never evicted")
			}
			checkQueues(t, e)
		})
	}
}

// TestEmbeddedPin: pinned values survive any stream of others, a pin of
// a key not held pins nothing (ErrMiss), a Set over a pinned key keeps it
// pinned, Unpin makes it evictable, Delete removes it, and pinned bytes
// leave no room: ErrNoRoom, nothing evicted.
func TestEmbeddedPin(t *testing.T) {
	ctx := context.Background()
	for _, pol := range []Policy{PolicyLRU, PolicyS3FIFO} {
		e, _ := NewEmbeddedPolicy(20*1008, pol)
		e.Set(ctx, []string{"p1", "p2"}, [][]byte{fillVal("p1", 1000), fillVal("p2", 1000)})
		errs := e.Pin(ctx, []string{"p1", "nope"})
		if errs[0] != nil || !errors.Is(errs[1], ErrMiss) || e.Pinned() != 0 {
			t.Fatalf("%s: Pin with a key not held: %v, %d bytes pinned; want ErrMiss and none", pol, errs, e.Pinned())
		}
		if errs := e.Pin(ctx, []string{"p1", "p2"}); errs[0] != nil || errs[1] != nil {
			t.Fatal(errs)
		}
		e.Set(ctx, []string{"p2"}, [][]byte{fillVal("p2", 900)}) // replaced: still pinned
		for i := 0; i < 200; i++ {
			k := fmt.Sprintf("o%03d", i)
			e.Set(ctx, []string{k}, [][]byte{fillVal(k, 1000)})
		}
		if e.Len("p1") != 1 || e.Len("p2") != 1 || e.Pinned() != 2+1000+2+900 {
			t.Fatalf("%s: pinned values evicted (%d bytes pinned)", pol, e.Pinned())
		}
		checkQueues(t, e)
		e.Unpin(ctx, []string{"p1", "never"})
		for i := 0; i < 200; i++ { // each read once: S3-FIFO moves them to its main queue
			k := fmt.Sprintf("n%03d", i)
			e.Set(ctx, []string{k}, [][]byte{fillVal(k, 1000)})
			e.Get(ctx, []string{k})
		}
		if e.Len("p1") != 0 || e.Len("p2") != 1 {
			t.Fatalf("%s: after Unpin(p1): p1 held %d, p2 held %d; want 0, 1", pol, e.Len("p1"), e.Len("p2"))
		}
		e.Delete(ctx, []string{"p2"})
		if e.Len("p2") != 0 || e.Pinned() != 0 {
			t.Fatalf("%s: Delete of a pinned value left it (%d bytes pinned)", pol, e.Pinned())
		}
		checkQueues(t, e)
		e.Close()

		// Pinned bytes fill the store: a Set fails, evicting nothing.
		e, _ = NewEmbeddedPolicy(2*1001+1000, pol) // d (1001 bytes) does not fit beside a and b
		e.Set(ctx, []string{"a", "b"}, [][]byte{fillVal("a", 1000), fillVal("b", 1000)})
		e.Pin(ctx, []string{"a", "b"})
		e.Set(ctx, []string{"c"}, [][]byte{fillVal("c", 900)})
		if err := e.Set(ctx, []string{"d"}, [][]byte{fillVal("d", 1000)})[0]; !errors.Is(err, ErrNoRoom) {
			t.Fatalf("%s: Set beside pinned bytes: %v, want ErrNoRoom", pol, err)
		}
		if e.Len("c") != 1 {
			t.Fatalf("%s: the failed Set evicted c", pol)
		}
		e.Close()
	}
}

// TestTierPin: Tier.Pin and Unpin by block hash over the embedded store,
// ErrMiss for a block not held, ErrUnsupported for a backend that cannot.
func TestTierPin(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbeddedPolicy(64<<10, PolicyS3FIFO)
	tr, err := New(e, testNS, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Put(ctx, []Block{block(testNS, 1), block(testNS, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Pin(ctx, []uint64{1, 3}); !errors.Is(err, ErrMiss) || e.Pinned() != 0 {
		t.Fatalf("Pin of a block not held: %v, %d bytes pinned; want ErrMiss, none", err, e.Pinned())
	}
	if err := tr.Pin(ctx, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	for h := uint64(100); h < 400; h++ {
		tr.Put(ctx, []Block{block(testNS, h)})
	}
	dst := dstFor(tr, 1)
	if errs := tr.Get(ctx, []uint64{1}, dst); checkServed(t, tr, []uint64{1}, dst, errs) != 1 {
		t.Fatalf("pinned block evicted: %v", errs)
	}
	if err := tr.Unpin(ctx, []uint64{1}); err != nil || e.Pinned() != 0 {
		t.Fatalf("Unpin: %v, %d bytes pinned", err, e.Pinned())
	}
	if err := tr.Delete(ctx, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if n, _ := tr.Lookup(ctx, []uint64{1}); n != 0 {
		t.Fatal("deleted block still held")
	}
	bare, err := New(bareBackend{e}, testNS, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"pin": bare.Pin(ctx, []uint64{1}), "unpin": bare.Unpin(ctx, []uint64{1}), "delete": bare.Delete(ctx, []uint64{1})} {
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s on a backend without it: %v, want ErrUnsupported", name, err)
		}
	}
}

// bareBackend hides every optional capability of its backend.
type bareBackend struct{ b Backend }

func (b bareBackend) Get(ctx context.Context, keys []string) ([][]byte, []error) {
	return b.b.Get(ctx, keys)
}
func (b bareBackend) Set(ctx context.Context, keys []string, vals [][]byte) []error {
	return b.b.Set(ctx, keys, vals)
}
func (b bareBackend) Exists(ctx context.Context, keys []string) ([]bool, []error) {
	return b.b.Exists(ctx, keys)
}
func (b bareBackend) Close() error   { return nil }
func (b bareBackend) String() string { return "bare" }

// TestEmbeddedPinDuringSet: a value pinned while another Set of its key
// copies outside the lock stays pinned when that Set links its value.
func TestEmbeddedPinDuringSet(t *testing.T) {
	ctx := context.Background()
	for _, pol := range []Policy{PolicyLRU, PolicyS3FIFO} {
		e, _ := NewEmbeddedPolicy(1<<20, pol)
		once := false
		e.copied = func() { // runs outside the lock, v2 copied, not linked yet
			if once {
				return
			}
			once = true
			if err := e.Set(ctx, []string{"k"}, [][]byte{fillVal("k", 300)})[0]; err != nil {
				t.Error(err)
			}
			if err := e.Pin(ctx, []string{"k"})[0]; err != nil {
				t.Error(err)
			}
		}
		v2 := fillVal("k", 200)
		if err := e.Set(ctx, []string{"k"}, [][]byte{v2})[0]; err != nil {
			t.Fatal(err)
		}
		got, _ := e.Get(ctx, []string{"k"})
		if !bytes.Equal(got[0], v2) || e.Pinned() != 1+200 {
			t.Fatalf("%s: k holds %d bytes, %d pinned; want the last value linked (200 bytes), pinned", pol, len(got[0]), e.Pinned())
		}
		checkQueues(t, e)
		e.Close()
	}
}
