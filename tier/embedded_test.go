package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

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
// (outside the Go heap, so they do not raise the collector's heap goal) as
// frames cut from a few huge-page regions, that a released frame's pages go
// back to the OS and the frame is reused, that a value larger than a frame
// takes a mapping of its own, unmapped on release, and that Close unmaps
// everything.
func TestEmbeddedChunksOffHeap(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(64 << 20)
	if e.frame != frameMax {
		t.Fatalf("frame of %d bytes in a 64 MiB store, want %d", e.frame, frameMax)
	}
	val := make([]byte, 10000)
	for i := range val {
		val[i] = byte(i%251 + 1)
	}
	var keys []string
	for i := range 5000 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for _, k := range keys {
		if errs := e.Set(ctx, []string{k}, [][]byte{val}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	big := make([]byte, 3<<20) // larger than a frame
	if errs := e.Set(ctx, []string{"big"}, [][]byte{big}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	inRegion := func(b []byte, r []byte) bool {
		p, lo := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&r[0]))
		return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(r))
	}
	var frames [][]byte
	var own []byte
	for _, c := range e.chunks {
		switch {
		case c.buf == nil:
		case c.region < 0:
			if own != nil || !hostmem.IsMapped(c.buf) {
				t.Fatalf("a value's own chunk of %d bytes: a second one, or not mapped", len(c.buf))
			}
			own = c.buf
		default:
			if len(c.buf) != e.frame || !inRegion(c.buf, e.regions[c.region]) {
				t.Fatalf("a frame of %d bytes outside its region", len(c.buf))
			}
			if hostmem.HugePages && uintptr(unsafe.Pointer(&c.buf[0]))%hostmem.HugePage != 0 {
				t.Fatalf("a frame at %p is not huge-page aligned", &c.buf[0])
			}
			frames = append(frames, c.buf)
		}
	}
	if own == nil || len(frames) < regionFrames+1 {
		t.Fatalf("%d frames and own chunk %v; want more than a region's frames and one", len(frames), own != nil)
	}
	if want := (len(frames) + regionFrames - 1) / regionFrames; len(e.regions) != want {
		t.Fatalf("%d regions for %d frames, want %d", len(e.regions), len(frames), want)
	}
	for i, r := range e.regions {
		if !hostmem.IsMapped(r) {
			t.Fatalf("region %d is not mapped memory", i)
		}
	}
	// Empty the store: the frames' pages are released (they read zeros),
	// the frames kept; the value's own mapping is unmapped.
	for _, k := range append(keys, "big") {
		e.Delete(context.Background(), []string{k})
	}
	e.mu.Lock()
	e.releaseEmpty()
	held, cold := e.held, len(e.cold)
	e.mu.Unlock()
	if held != 0 || cold != len(frames) {
		t.Fatalf("after every chunk was released: %d bytes held, %d frames released; want 0 and %d", held, cold, len(frames))
	}
	if hostmem.IsMapped(own) {
		t.Fatal("the value's own chunk is still mapped after its release")
	}
	if runtime.GOOS == "linux" {
		for i, f := range frames {
			if !bytes.Equal(f, make([]byte, len(f))) {
				t.Fatalf("frame %d kept its bytes after its release", i)
			}
		}
	}
	// Filled again: the released frames come back, no region is added.
	regions := len(e.regions)
	for _, k := range keys[:500] {
		e.Set(ctx, []string{k}, [][]byte{val})
	}
	if len(e.regions) != regions || len(e.cold) >= cold {
		t.Fatalf("refilling: %d regions (was %d), %d frames released (was %d); want the released frames reused", len(e.regions), regions, len(e.cold), cold)
	}
	if vals, errs := e.Get(ctx, keys[:1]); !bytes.Equal(vals[0], val) {
		t.Fatalf("Get after refilling = %d bytes, %v", len(vals[0]), errs[0])
	}
	// Closed: every region is unmapped.
	all := e.regions
	e.Close()
	for i, r := range all {
		if hostmem.IsMapped(r) {
			t.Fatalf("region %d still mapped after Close", i)
		}
	}
	if vals, errs := e.Get(ctx, keys[:1]); vals[0] != nil || !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("Get after Close = %v, %v; want ErrClosed", vals[0], errs[0])
	}
}

// TestEmbeddedCopyOutsideLock: a Set's copy runs outside the store's lock.
// While one is in flight, Exists and Get answer (the value being stored is
// not held yet), another Set that finds the bytes all reserved fails with
// ErrNoRoom and changes nothing, and Close waits for the copy before it
// unmaps the slabs; the Set in flight then reports ErrClosed.
func TestEmbeddedCopyOutsideLock(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(64 << 10)
	if errs := e.Set(ctx, []string{"old"}, [][]byte{make([]byte, 100)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	inCopy, release := make(chan bool), make(chan bool)
	e.copied = func() {
		inCopy <- true
		<-release
	}
	big := make([]byte, 60<<10)
	setDone := make(chan []error)
	go func() { setDone <- e.Set(ctx, []string{"a"}, [][]byte{big}) }()
	<-inCopy
	e.copied = nil // written before the Set below reads it: the first Set is parked in copied
	answered := make(chan string)
	go func() {
		held, errs := e.Exists(ctx, []string{"a", "old"})
		vals, gerrs := e.Get(ctx, []string{"a"})
		answered <- fmt.Sprint(held, errs, vals[0] == nil, gerrs)
	}()
	select {
	case got := <-answered:
		if want := "[false true] [<nil> <nil>] true [<nil>]"; got != want {
			t.Fatalf("Exists and Get during the copy: %s, want %s (the value in flight not held yet, the old one held)", got, want)
		}
	case <-time.After(10 * time.Second): // a hang, not a speed: the copy holds the lock
		t.Fatal("Exists and Get waited for a Set's copy")
	}
	used0, _, ev0 := e.Usage()
	if errs := e.Set(ctx, []string{"b"}, [][]byte{make([]byte, 10<<10)}); !errors.Is(errs[0], ErrNoRoom) {
		t.Fatalf("Set beside a copy holding the store's bytes: %v, want ErrNoRoom", errs[0])
	}
	if used, _, ev := e.Usage(); used != used0 || ev != ev0 {
		t.Fatalf("the refused Set changed the store: used %d → %d, evicted %d → %d", used0, used, ev0, ev)
	}
	closed := make(chan bool)
	go func() {
		e.Close()
		closed <- true
	}()
	for { // Close has marked the store and waits for the copy
		e.mu.Lock()
		c := e.closed
		e.mu.Unlock()
		if c {
			break
		}
		runtime.Gosched()
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a Set was copying into its slabs")
	default:
	}
	close(release)
	if errs := <-setDone; !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("the Set that Close overtook: %v, want ErrClosed", errs[0])
	}
	<-closed
	if e.regions != nil || e.held != 0 {
		t.Fatalf("after Close: %d regions, %d bytes held", len(e.regions), e.held)
	}
}

// TestEmbeddedConcurrent runs Sets, Gets, Exists and Deletes of shared
// keys from several goroutines (under -race in CI): every value read is
// exactly one that was set for its key, never a mix or another key's, and
// the bytes held stay within the bound.
func TestEmbeddedConcurrent(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(256 << 10)
	value := func(k string, gen, n int) []byte {
		v := make([]byte, n)
		for i := range v {
			v[i] = byte(len(k)*31 + gen*7 + i)
		}
		v[0] = byte(gen) // the generation, to check the rest against
		return v
	}
	var wg sync.WaitGroup
	fail := make(chan string, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for op := range 3000 {
				k := fmt.Sprintf("key-%d", rng.IntN(64))
				switch rng.IntN(4) {
				case 0, 1:
					gen := op % 251
					n := []int{100, 3000, 20000}[rng.IntN(3)]
					// A batch of two keys at times, as the publishers store.
					keys, vals := []string{k}, [][]byte{value(k, gen, n)}
					if rng.IntN(2) == 0 {
						k2 := k + "-x"
						keys, vals = append(keys, k2), append(vals, value(k2, gen, n))
					}
					for i, err := range e.Set(ctx, keys, vals) {
						if err != nil && !errors.Is(err, ErrNoRoom) {
							fail <- fmt.Sprintf("Set(%s): %v", keys[i], err)
							return
						}
					}
				case 2:
					if rng.IntN(2) == 0 {
						k += "-x"
					}
					vals, _ := e.Get(ctx, []string{k})
					if v := vals[0]; v != nil && !bytes.Equal(v, value(k, int(v[0]), len(v))) {
						fail <- fmt.Sprintf("Get(%s) returned %d bytes that no Set of it stored", k, len(v))
						return
					}
				default:
					if rng.IntN(8) == 0 {
						e.Delete(context.Background(), []string{k})
					} else {
						e.Exists(ctx, []string{k})
					}
				}
			}
		}()
	}
	wg.Wait()
	close(fail)
	for f := range fail {
		t.Fatal(f)
	}
	if held, limit := e.slabBytes(); held > limit {
		t.Fatalf("slabs hold %d bytes, bound %d", held, limit)
	}
	if used, max, _ := e.Usage(); used > max {
		t.Fatalf("%d bytes used, bound %d", used, max)
	}
}

// TestEmbeddedGetOutsideLock: a Get copies outside the store's lock with
// its values pinned. While one is parked before its copy, Exists answers,
// and the value it reads may be replaced, deleted and its room refilled:
// its slot is not reused, so the Get still returns the value it found; the
// last unpin frees the slot (every slot in use is then a held value's).
func TestEmbeddedGetOutsideLock(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(64 << 10)
	val := func(b byte) []byte { return bytes.Repeat([]byte{b}, 12<<10) }
	if errs := e.Set(ctx, []string{"k"}, [][]byte{val('A')}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	parked, release := make(chan bool), make(chan bool)
	e.fetching = func() {
		parked <- true
		<-release
	}
	got := make(chan []byte)
	go func() {
		vals, _ := e.Get(ctx, []string{"k"})
		got <- vals[0]
	}()
	<-parked
	e.fetching = nil
	answered := make(chan bool)
	go func() {
		held, _ := e.Exists(ctx, []string{"k"})
		answered <- held[0]
	}()
	select {
	case h := <-answered:
		if !h {
			t.Fatal("Exists during a Get's copy: k not held")
		}
	case <-time.After(10 * time.Second): // a hang, not a speed: the copy holds the lock
		t.Fatal("Exists waited for a Get's copy")
	}
	// Replace k, delete it, and fill the store with values of its size.
	if errs := e.Set(ctx, []string{"k"}, [][]byte{val('B')}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	e.Delete(context.Background(), []string{"k"})
	for i := range 12 {
		e.Set(ctx, []string{fmt.Sprintf("f%d", i)}, [][]byte{val(byte('a' + i))})
	}
	close(release)
	if v := <-got; !bytes.Equal(v, val('A')) {
		t.Fatalf("the parked Get returned %d bytes, not the value it found", len(v))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	linked, live := 0, 0
	for _, q := range []uint8{qSmall, qMain} {
		for x := e.q[q].head; x >= 0; x = e.ents[x].next {
			linked++
		}
	}
	for _, c := range e.chunks {
		live += c.live
	}
	if linked != live || e.inflight != 0 {
		t.Fatalf("after the Get: %d values held, %d slots in use, %d copies in flight", linked, live, e.inflight)
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

// TestEmbeddedRefusedMapping: a slab whose memory the OS refuses fails
// that value's Set with ErrNoRoom (naming the refusal) and stores nothing
// of it; a value that fits memory already mapped is stored, what is
// stored stays, and once memory is there again Sets store.
func TestEmbeddedRefusedMapping(t *testing.T) {
	ctx := context.Background()
	e, err := NewEmbedded(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	small := bytes.Repeat([]byte{7}, 100)
	if errs := e.Set(ctx, []string{"a"}, [][]byte{small}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	undo := hostmem.RefuseFrom(1)
	big := bytes.Repeat([]byte{9}, 5<<20) // a chunk of its own
	mid := bytes.Repeat([]byte{3}, 3000)  // a frame of the region mapped already
	errs := e.Set(ctx, []string{"b", "c"}, [][]byte{big, mid})
	undo()
	if !errors.Is(errs[0], ErrNoRoom) || !strings.Contains(errs[0].Error(), "refused") || errs[1] != nil {
		t.Fatalf("Sets with mappings refused: %v, want ErrNoRoom naming the refusal, then nil", errs)
	}
	vals, gerrs := e.Get(ctx, []string{"a", "b", "c"})
	if errors.Join(gerrs...) != nil || !bytes.Equal(vals[0], small) || vals[1] != nil || !bytes.Equal(vals[2], mid) {
		t.Fatalf("after the refused Set: %d, %d, %d bytes, %v", len(vals[0]), len(vals[1]), len(vals[2]), gerrs)
	}
	if errs := e.Set(ctx, []string{"b"}, [][]byte{big}); errs[0] != nil {
		t.Fatalf("Set once memory is back: %v", errs[0])
	}
}
