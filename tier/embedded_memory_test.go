package tier

// The embedded store's memory: slabs reused, mapped off the Go heap and
// given back to the OS, and a mapping the OS refuses.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/omnicache/omnicache/internal/hostmem"
)

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
