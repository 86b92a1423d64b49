// The embedded store's slabs: size classes, chunks cut from huge-page
// regions mapped outside the Go heap, and their release to the OS.

package tier

import (
	"fmt"
	"math/bits"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Slab geometry of the embedded store.
const (
	frameMax     = hostmem.HugePage // bytes of one chunk of slots at most (a larger value takes a chunk of its own)
	regionFrames = 16               // frames mapped at a time
	slackBytes   = 8 << 20
)

type chunk struct {
	buf    []byte // nil: released
	region int32  // the region buf is a frame of; -1: buf is a mapping of its own
	cl     *slabClass
	free   []int32 // free slots
	live   int
}

// coldFrame is a released frame and its region.
type coldFrame struct {
	buf    []byte
	region int32
}

type slabClass struct {
	size  int     // slot bytes
	per   int     // slots per chunk
	avail []int32 // chunks that may have a free slot (checked when taken)
}

// sizeClass rounds n up to its slot size: 64-byte steps up to 1 KiB, then
// steps of 1/16 of the next power of two.
func sizeClass(n int) int {
	if n <= 1024 {
		return (n + 63) &^ 63
	}
	step := 1 << (bits.Len(uint(n-1)) - 4)
	return (n + step - 1) / step * step
}

// alloc returns a free slot for n bytes (a chunk id and slot index),
// making room as the type's doc says; an error wrapping ErrNoRoom when none
// can be made (every value held is being stored: reserved by a Set, out of
// the LRU, or the OS refused a new chunk's memory).
func (e *Embedded) alloc(n int) (int32, int32, error) {
	size := sizeClass(n)
	cl := e.cls[size]
	if cl == nil {
		per := max(1, e.frame/size)
		cl = &slabClass{size: size, per: per}
		e.cls[size] = cl
	}
	for {
		for len(cl.avail) > 0 {
			ci := cl.avail[len(cl.avail)-1]
			c := &e.chunks[ci]
			if c.buf == nil || c.cl != cl || len(c.free) == 0 {
				cl.avail = cl.avail[:len(cl.avail)-1]
				continue
			}
			si := c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
			if len(c.free) == 0 {
				cl.avail = cl.avail[:len(cl.avail)-1]
			}
			if c.live == 0 {
				e.empty--
			}
			c.live++
			return ci, si, nil
		}
		bytes := int64(max(cl.size, e.frame))
		switch {
		case e.held+bytes <= e.limit || e.held == 0:
			if err := e.newChunk(cl); err != nil {
				return 0, 0, fmt.Errorf("%w: a slab of %d bytes: %w", ErrNoRoom, cl.size, err)
			}
		case e.empty > 0:
			e.releaseEmpty()
		case e.evictOne():
		default:
			return 0, 0, fmt.Errorf("%w: no slot of %d bytes: the slabs are held by values being stored or pinned", ErrNoRoom, size)
		}
	}
}

// newChunk makes a chunk of class cl, failing (and changing nothing) when
// the OS refuses its memory.
func (e *Embedded) newChunk(cl *slabClass) error {
	var buf []byte
	region := int32(-1)
	if cl.size <= e.frame {
		var err error
		if buf, region, err = e.newFrame(); err != nil {
			return err
		}
	} else {
		var err error
		if buf, err = hostmem.AllocHuge(cl.size); err != nil {
			return err
		}
	}
	var ci int32
	if n := len(e.gone); n > 0 {
		ci, e.gone = e.gone[n-1], e.gone[:n-1]
	} else {
		ci = int32(len(e.chunks))
		e.chunks = append(e.chunks, chunk{})
	}
	c := &e.chunks[ci]
	*c = chunk{cl: cl, free: make([]int32, cl.per), region: region, buf: buf}
	for i := range c.free {
		c.free[i] = int32(cl.per - 1 - i) // slot 0 first
	}
	cl.avail = append(cl.avail, ci)
	e.held += int64(len(c.buf))
	e.empty++
	return nil
}

// newFrame hands out a released frame, else the next frame of the last
// region, mapping a region when it has none left.
func (e *Embedded) newFrame() ([]byte, int32, error) {
	if n := len(e.cold); n > 0 {
		f := e.cold[n-1]
		e.cold = e.cold[:n-1]
		return f.buf, f.region, nil
	}
	if len(e.regions) == 0 || e.carved == len(e.regions[len(e.regions)-1]) {
		// At most the frames the bound allows, so that a small store does
		// not reserve 16 frames' addresses for a few.
		n := min(regionFrames, int((e.limit+int64(e.frame)-1)/int64(e.frame)))
		r, err := hostmem.AllocHuge(n * e.frame)
		if err != nil {
			return nil, -1, err
		}
		e.regions, e.carved = append(e.regions, r), 0
	}
	ri := int32(len(e.regions) - 1)
	r := e.regions[ri]
	f := r[e.carved : e.carved+e.frame : e.carved+e.frame]
	e.carved += e.frame
	return f, ri, nil
}

// releaseEmpty gives the chunks holding no value back to the OS.
func (e *Embedded) releaseEmpty() {
	for ci := range e.chunks {
		c := &e.chunks[ci]
		if c.buf != nil && c.live == 0 {
			e.held -= int64(len(c.buf))
			e.freeChunk(c)
			e.gone = append(e.gone, int32(ci))
		}
	}
	e.empty = 0
}

// freeChunk gives a chunk's memory back to the OS and clears it: a frame's
// pages are released and the frame waits for a later chunk; a mapping of
// its own is unmapped. Every access to a slot holds e.mu, as this does: no
// copy is in flight.
func (e *Embedded) freeChunk(c *chunk) {
	if c.region >= 0 {
		// Releasing whole pages of a mapping this store made does not fail
		// (madvise fails only on a bad range).
		_ = hostmem.Release(e.regions[c.region], c.buf)
		e.cold = append(e.cold, coldFrame{c.buf, c.region})
	} else {
		// Unmapping a whole mapping this store made does not fail (munmap
		// fails only on a range it would have to split, or a bad address).
		_ = hostmem.Free(c.buf)
	}
	*c = chunk{region: -1}
}

// unreserve frees slot si of chunk ci (alloc's).
func (e *Embedded) unreserve(ci, si int32) {
	c := &e.chunks[ci]
	c.free = append(c.free, si)
	if len(c.free) == 1 {
		c.cl.avail = append(c.cl.avail, ci)
	}
	if c.live--; c.live == 0 {
		e.empty++
	}
}
