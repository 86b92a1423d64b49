package tier

// The embedded store against its specification: random operations
// against an exact LRU (refLRU), and Lookup against every key's Exists.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// refLRU is the embedded store's specification: exact LRU by key+value
// bytes.
type refLRU struct {
	max, used int64
	order     []string // least recently used first
	vals      map[string][]byte
	evicts    int64
}

// unlist takes k out of the LRU order and reports whether it was there.
func (r *refLRU) unlist(k string) bool {
	i := slices.Index(r.order, k)
	if i >= 0 {
		r.order = slices.Delete(r.order, i, i+1)
	}
	return i >= 0
}

func (r *refLRU) drop(k string) {
	r.unlist(k)
	r.used -= int64(len(k) + len(r.vals[k]))
	delete(r.vals, k)
}

func (r *refLRU) touch(k string) {
	if r.unlist(k) {
		r.order = append(r.order, k)
	}
}

func (r *refLRU) set(k string, v []byte) bool {
	size := int64(len(k) + len(v))
	if size > r.max {
		return false
	}
	if _, ok := r.vals[k]; ok {
		r.drop(k)
	}
	for r.used+size > r.max {
		r.drop(r.order[0])
		r.evicts++
	}
	r.vals[k] = append([]byte(nil), v...)
	r.order = append(r.order, k)
	r.used += size
	return true
}

// TestEmbeddedModel runs random Sets, Gets, Exists and Deletes (values of
// several size classes, keys whose hashes collide, callers reusing their
// buffers) against an exact LRU: every answer, every eviction count and the
// bytes held agree, and the slab memory stays within its bound.
func TestEmbeddedModel(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		max     int64
		sizes   []int
		collide bool
	}{
		{"one-class", 64 << 10, []int{1100}, false},
		{"mixed", 256 << 10, []int{40, 300, 1100, 5000, 70000}, false},
		{"collisions", 32 << 10, []int{100, 700}, true},
		{"tiny", 3000, []int{100, 900, 2000}, false},
		{"slab-pressure", 256 << 10, []int{40, 300, 1100, 5000, 70000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			e, _ := NewEmbeddedPolicy(tc.max, PolicyLRU) // the reference is exact LRU
			if tc.collide {
				e.hashFn = func(k string) uint64 { return uint64(len(k) % 3) }
			}
			// Under slab pressure (no slack over the bound) a value's class
			// may find no slot: the store evicts beyond the exact LRU, so
			// the reference is only "the last value set, if any".
			exact := tc.name != "slab-pressure"
			if !exact {
				e.limit = tc.max + tc.max/16
			}
			ref := &refLRU{max: tc.max, vals: map[string][]byte{}}
			last := map[string][]byte{}
			key := func() string { return fmt.Sprintf("k%d", rng.IntN(300)) }
			buf := make([]byte, 0, 70016) // the caller's buffer, reused for every Set
			for op := 0; op < 20000; op++ {
				// Phases shift the size mix so that classes grow and shrink.
				phase := (op / 2500) % len(tc.sizes)
				switch r := rng.IntN(10); {
				case r < 5:
					k := key()
					n := tc.sizes[(phase+rng.IntN(2))%len(tc.sizes)] + rng.IntN(8)
					buf = buf[:n]
					for i := range buf {
						buf[i] = byte(rng.Uint32())
					}
					errs := e.Set(ctx, []string{k}, [][]byte{buf})
					last[k] = append([]byte(nil), buf...)
					if !exact {
						if errs[0] != nil {
							t.Fatalf("op %d: Set(%s, %d bytes): %v", op, k, n, errs[0])
						}
						break
					}
					if ok := ref.set(k, buf); ok != (errs[0] == nil) {
						t.Fatalf("op %d: Set(%s, %d bytes) = %v, reference stored %v", op, k, n, errs[0], ok)
					}
					clear(buf) // the store kept a copy
				case r < 8:
					ks := []string{key(), key(), key()}
					vals, errs := e.Get(ctx, ks)
					for i, k := range ks {
						if !exact {
							if errs[i] != nil || (vals[i] != nil && !bytes.Equal(vals[i], last[k])) {
								t.Fatalf("op %d: Get(%s) = %d bytes, %v: not the last value set", op, k, len(vals[i]), errs[i])
							}
							continue
						}
						want, ok := ref.vals[k]
						if errs[i] != nil || (vals[i] != nil) != ok || !bytes.Equal(vals[i], want) {
							t.Fatalf("op %d: Get(%s) = %d bytes, %v; want %d bytes (held %v)", op, k, len(vals[i]), errs[i], len(want), ok)
						}
						if ok {
							ref.touch(k)
						}
					}
				case r < 9:
					k := key()
					held, _ := e.Exists(ctx, []string{k})
					if !exact {
						break
					}
					// Held keys are always found; an absent key counts as
					// held only when a held key shares its hash (forced in
					// "collisions", next to impossible otherwise).
					_, ok := ref.vals[k]
					shared := false
					for k2 := range ref.vals {
						shared = shared || e.hash(k2) == e.hash(k)
					}
					if held[0] != ok && !(held[0] && shared) {
						t.Fatalf("op %d: Exists(%s) = %v, want %v (a held key shares its hash: %v)", op, k, held[0], ok, shared)
					}
				default:
					k := key()
					e.Delete(context.Background(), []string{k})
					delete(last, k)
					if _, ok := ref.vals[k]; ok {
						ref.drop(k)
						ref.evicts++
					}
				}
				used, max, evicted := e.Usage()
				if used > max {
					t.Fatalf("op %d: %d bytes used, bound %d", op, used, max)
				}
				if exact && (used != ref.used || evicted != ref.evicts) {
					t.Fatalf("op %d: used %d, %d evicted; reference %d, %d", op, used, evicted, ref.used, ref.evicts)
				}
				if held, limit := e.slabBytes(); held > limit {
					t.Fatalf("op %d: slabs hold %d bytes, bound %d", op, held, limit)
				}
			}
			if _, _, ev := e.Usage(); ev == 0 {
				t.Fatal("the run never evicted: it does not test the bound")
			}
		})
	}
}

// Lookup on the embedded store (Embedded.Leading: a group of keys at a time,
// stopping at the first missing one) against the answer from every key's
// Exists: random prefixes of 300 blocks of two keys, some blocks held
// whole, some with one key deleted, some never stored. A long namespace (addresses longer
// than its stack buffer) and hash collisions (every key one hash: presence
// is by hash, as Exists answers) too. Closed: ErrClosed, nothing counted.
// A Lookup of a held prefix allocates nothing.
func TestEmbeddedLookup(t *testing.T) {
	long := testNS
	long.Model = strings.Repeat("a-long-model-name/", 20)
	for _, tc := range []struct {
		name    string
		ns      Namespace
		collide bool
	}{{"short", testNS, false}, {"long", long, false}, {"collide", testNS, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e, err := NewEmbedded(64 << 20)
			if err != nil {
				t.Fatal(err)
			}
			if tc.collide {
				e.hashFn = func(string) uint64 { return 42 }
			}
			tr, err := New(e, tc.ns, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			rng := rand.New(rand.NewPCG(3, uint64(len(tc.name))))
			hs := hashes(0, 300)
			for _, h := range hs {
				switch rng.IntN(10) {
				case 0: // never stored
				case 1, 2: // one key gone
					if _, err := tr.Put(ctx, []Block{block(tc.ns, h)}); err != nil {
						t.Fatal(err)
					}
					e.Delete(context.Background(), []string{tr.addrs([]uint64{h})[rng.IntN(2)]})
				default:
					if _, err := tr.Put(ctx, []Block{block(tc.ns, h)}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for it := 0; it < 400; it++ {
				lo := rng.IntN(len(hs))
				probe := hs[lo : lo+rng.IntN(len(hs)-lo+1)]
				want := 0
				if len(probe) > 0 {
					held, errs := e.Exists(ctx, tr.addrs(probe))
					for want < len(probe) && held[2*want] && held[2*want+1] && errs[2*want] == nil && errs[2*want+1] == nil {
						want++
					}
				}
				if got, err := tr.Lookup(ctx, probe); err != nil || got != want {
					t.Fatalf("Lookup of blocks %d..%d = %d, %v; want %d", lo, lo+len(probe), got, err, want)
				}
			}
			// A held run of 100 blocks with one missing block put in at
			// every place.
			run := hashes(1000, 100)
			for _, h := range run {
				if _, err := tr.Put(ctx, []Block{block(tc.ns, h)}); err != nil {
					t.Fatal(err)
				}
			}
			miss := hashes(5000, 1)[0]
			for cut := 0; cut <= len(run); cut++ {
				probe := append(append(append([]uint64(nil), run[:cut]...), miss), run[cut:]...)
				want := cut
				if tc.collide {
					want = len(probe) // presence is by hash: every key is "held"
				}
				if got, err := tr.Lookup(ctx, probe); err != nil || got != want {
					t.Fatalf("Lookup with the gap at %d = %d, %v; want %d", cut, got, err, want)
				}
			}
			// Nothing allocated; an address longer than the stack buffer
			// grows it once. (The collision hook copies every address.)
			wantAllocs := 0.0
			if tr.addrLen(0) > 256 {
				wantAllocs = 1
			}
			if a := testing.AllocsPerRun(20, func() {
				if n, err := tr.Lookup(ctx, run); err != nil || n != len(run) {
					t.Fatalf("Lookup = %d, %v; want %d", n, err, len(run))
				}
			}); a != wantAllocs && !tc.collide {
				t.Fatalf("a Lookup of %d held blocks allocated %.0f times, want %.0f", len(run), a, wantAllocs)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if n, err := tr.Lookup(ctx, hs); !errors.Is(err, ErrClosed) || n != 0 {
				t.Fatalf("Lookup after Close = %d, %v; want 0, ErrClosed", n, err)
			}
		})
	}
}

// FetchInto copies an embedded store's values into the caller's buffer
// when it is large enough (the same memory, every row exact, the old
// contents overwritten), allocates a larger one otherwise, and returns no
// buffer when nothing was found.
func TestEmbeddedFetchIntoReusesBuffer(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	tr := newTier(t, e)
	hs := hashes(0, 8)
	var blocks []Block
	for _, h := range hs {
		blocks = append(blocks, block(testNS, h))
	}
	if _, err := tr.Put(ctx, blocks); err != nil {
		t.Fatal(err)
	}
	check := func(hs []uint64, rows [][]byte, errs []error) {
		t.Helper()
		dst := dstFor(tr, len(hs))
		for i := range dst {
			if errs[i/len(testNS.Keys)] == nil {
				copy(dst[i], rows[i])
			}
		}
		if n := checkServed(t, tr, hs, dst, errs); n != len(hs) {
			t.Fatalf("%d of %d blocks served: %v", n, len(hs), errors.Join(errs...))
		}
	}
	rows, errs, small := tr.FetchInto(ctx, hs[:2], nil)
	check(hs[:2], rows, errs)
	rows, errs, big := tr.FetchInto(ctx, hs, small)
	check(hs, rows, errs)
	if cap(big) <= cap(small) {
		t.Fatalf("a buffer of %d bytes was used for 8 blocks (2 took %d)", cap(big), cap(small))
	}
	for i := range big[:cap(big)] {
		big[:cap(big)][i] = 0xa5 // the next fetch must overwrite every byte it serves
	}
	rows, errs, again := tr.FetchInto(ctx, hs[4:], big)
	check(hs[4:], rows, errs)
	if &again[:1][0] != &big[:1][0] {
		t.Fatal("a large enough buffer was not reused")
	}
	if _, errs, none := tr.FetchInto(ctx, hashes(100, 2), big); none != nil || !errors.Is(errs[0], ErrMiss) {
		t.Fatalf("fetch of blocks never stored: buffer %d bytes, %v", len(none), errs[0])
	}
}
