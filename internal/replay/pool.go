package replay

import (
	"math/bits"
	"sync"

	"github.com/omnicache/omnicache"
)

// bufSet is one step's output buffers, one per key.
type bufSet struct {
	b [][]byte
}

// bufPool hands out output buffers for the simulated forward.
//
// Owned mode (the default) gives every step its own buffers, marked Owned:
// the cache keeps them without a copy and hands each one back through
// Config.ReleaseHost once it no longer needs it (its rows landed and every
// step that could read it was consumed); the pool then reuses it, as an
// engine's buffer pool would. The pool is safe for that concurrent use.
//
// Non-owned mode reuses one engine buffer for every step (Owned false): the
// cache must copy what it keeps, and the next step overwrites the buffer
// before the previous step is consumed, so --verify also checks that
// results do not depend on the engine's live buffers.
type bufPool struct {
	rowBytes  []int
	maxTokens int
	owned     bool

	mu     sync.Mutex
	free   map[int][][]byte // by capacity class (a power of two of bytes)
	shared *bufSet
	Allocs int
}

// keyRowBytes lists the keys' row bytes, in key order.
func keyRowBytes(keys []omnicache.Key) []int {
	rb := make([]int, len(keys))
	for k, kk := range keys {
		rb[k] = kk.RowBytes
	}
	return rb
}

func newBufPool(rowBytes []int, maxTokens int, owned bool) *bufPool {
	return &bufPool{rowBytes: rowBytes, maxTokens: maxTokens, owned: owned, free: map[int][][]byte{}}
}

// class is the capacity class of n bytes.
func class(n int) int {
	if n <= 4096 {
		return 4096
	}
	return 1 << bits.Len(uint(n-1))
}

// buf returns a buffer of n bytes, reused when one of its class is free.
func (p *bufPool) buf(n int) []byte {
	c := class(n)
	p.mu.Lock()
	if l := p.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		p.free[c] = l[:len(l)-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.Allocs++
	p.mu.Unlock()
	return make([]byte, n, c)
}

// release takes back an owned buffer from the cache (Config.ReleaseHost).
func (p *bufPool) release(b []byte) {
	c := cap(b)
	p.mu.Lock()
	p.free[c] = append(p.free[c], b[:0])
	p.mu.Unlock()
}

// get returns buffers for a step of n tokens.
func (p *bufPool) get(n int) *bufSet {
	if !p.owned {
		if p.shared == nil {
			p.shared = &bufSet{b: make([][]byte, len(p.rowBytes))}
			for k, rb := range p.rowBytes {
				p.shared.b[k] = make([]byte, max(p.maxTokens, n)*rb)
			}
		}
		return p.shared
	}
	s := &bufSet{b: make([][]byte, len(p.rowBytes))}
	for k, rb := range p.rowBytes {
		s.b[k] = p.buf(n * rb)
	}
	return s
}

// slices sizes the set's buffers to n tokens.
func (s *bufSet) slices(n int, rowBytes []int) [][]byte {
	for k, rb := range rowBytes {
		s.b[k] = s.b[k][:cap(s.b[k])][:n*rb]
	}
	return s.b
}
