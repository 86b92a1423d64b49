package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/omnicache/omnicache/internal/hostmem"
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
			e, _ := NewEmbedded(tc.max)
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
					e.Delete(k)
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

// TestEmbeddedSlabReuse: a steady stream of one value size allocates no
// new slab memory once the store is full (freed slots are reused), and a
// shift to another size gives the old size's memory back.
func TestEmbeddedSlabReuse(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(8 << 20)
	v := make([]byte, 1100)
	put := func(from, n int, v []byte) {
		for i := from; i < from+n; i++ {
			if errs := e.Set(ctx, []string{fmt.Sprintf("key-%08d", i)}, [][]byte{v}); errs[0] != nil {
				t.Fatal(errs[0])
			}
		}
	}
	put(0, 20000, v)
	full, limit := e.slabBytes()
	put(20000, 50000, v)
	if held, _ := e.slabBytes(); held != full {
		t.Fatalf("slabs grew from %d to %d bytes on a steady stream", full, held)
	}
	big := make([]byte, 9000)
	put(100000, 5000, big)
	if held, _ := e.slabBytes(); held > limit {
		t.Fatalf("after the size shift: %d bytes held, bound %d", held, limit)
	}
	used, max, _ := e.Usage()
	if used > max || used < max-int64(len(big))-20 {
		t.Fatalf("after the size shift: %d of %d bytes used; want the store full of the new size", used, max)
	}
}

// TestEmbeddedChunksOffHeap checks that the slabs are mapped from the OS
// (outside the Go heap, so they do not raise the collector's heap goal) and
// unmapped when released: chunks left empty, and every chunk at Close.
func TestEmbeddedChunksOffHeap(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(8 << 20)
	val := make([]byte, 1000)
	var keys []string
	for i := range 3000 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for _, k := range keys {
		if errs := e.Set(ctx, []string{k}, [][]byte{val}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	var bufs [][]byte
	for _, c := range e.chunks {
		if c.buf == nil {
			continue
		}
		if !hostmem.IsMapped(c.buf) {
			t.Fatalf("a chunk of %d bytes is not mapped memory", len(c.buf))
		}
		bufs = append(bufs, c.buf)
	}
	if len(bufs) < 2 {
		t.Fatalf("%d chunks, want several", len(bufs))
	}
	// Empty the store: its chunks are released and unmapped.
	for _, k := range keys {
		e.Delete(k)
	}
	e.mu.Lock()
	e.releaseEmpty()
	held := e.held
	e.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d slab bytes held after every chunk was released", held)
	}
	for i, b := range bufs {
		if hostmem.IsMapped(b) {
			t.Fatalf("chunk %d still mapped after its release", i)
		}
	}
	// Filled again, then closed: every chunk is unmapped.
	for _, k := range keys[:500] {
		e.Set(ctx, []string{k}, [][]byte{val})
	}
	bufs = bufs[:0]
	for _, c := range e.chunks {
		if c.buf != nil {
			bufs = append(bufs, c.buf)
		}
	}
	if len(bufs) == 0 {
		t.Fatal("no chunk after refilling")
	}
	e.Close()
	for i, b := range bufs {
		if hostmem.IsMapped(b) {
			t.Fatalf("chunk %d still mapped after Close", i)
		}
	}
	if vals, errs := e.Get(ctx, keys[:1]); vals[0] != nil || !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("Get after Close = %v, %v; want ErrClosed", vals[0], errs[0])
	}
}
