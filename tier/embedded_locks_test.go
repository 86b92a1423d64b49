package tier

// The embedded store's locking: copies run outside its lock, values are
// pinned while a Get copies them, and concurrent callers never read a mix.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

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
