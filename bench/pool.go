package bench

import "math/bits"

// bufSet is one step's output buffers, one per key.
type bufSet struct {
	b         [][]byte
	capTokens int
	step      int  // step that used it last
	pure      bool // that step was a pure decode step (may sit in the decode buffer)
}

// bufPool hands out output buffers for the simulated forward.
//
// Owned mode (the default) hands the cache a fresh set of buffers every step,
// marked Owned. The API says an owned tensor "must not be touched by the
// engine afterwards" and gives no signal when the cache lets go of it (the
// core keeps owned host rows as the write's source until the committer has
// scattered them, which can be after the step was consumed), so by default
// sets are never reused: the GC reclaims them once the cache drops them.
//
// With delay >= 0 a set is recycled once its step was consumed
// (Materialize/Discard), no parked decode-buffer row can still point into
// it (the step was not a pure decode step, or a later non-pure step has
// begun, or more than block_size steps were saved since), and delay more
// steps were saved. That is only safe if the cache has let go by then:
// --verify detects when it has not.
//
// Non-owned mode reuses one engine buffer for every step (Owned false): the
// cache must copy what it keeps, and the next step overwrites the buffer
// before the previous step is consumed, so --verify also checks that
// results do not depend on the engine's live buffers.
type bufPool struct {
	rowBytes  []int
	maxTokens int
	owned     bool
	bs        int
	delay     int

	free      []*bufSet
	pending   []*bufSet // consumed, waiting to be recyclable
	lastFlush int       // last non-pure step that passed Begin (flushes the decode buffer)
	shared    *bufSet
	Allocs    int
}

func newBufPool(rowBytes []int, maxTokens int, owned bool, bs, delay int) *bufPool {
	return &bufPool{rowBytes: rowBytes, maxTokens: maxTokens, owned: owned, bs: bs, delay: delay, lastFlush: -1}
}

func (p *bufPool) alloc(tokens int) *bufSet {
	capTokens := tokens
	if capTokens < 64 {
		capTokens = 64
	} else {
		capTokens = 1 << bits.Len(uint(capTokens-1))
	}
	capTokens = min(capTokens, max(p.maxTokens, tokens))
	s := &bufSet{capTokens: capTokens, b: make([][]byte, len(p.rowBytes))}
	for k, rb := range p.rowBytes {
		s.b[k] = make([]byte, capTokens*rb)
	}
	p.Allocs++
	return s
}

func (p *bufPool) allocExact(n, step int, pure bool) *bufSet {
	s := &bufSet{capTokens: n, b: make([][]byte, len(p.rowBytes)), step: step, pure: pure}
	for k, rb := range p.rowBytes {
		s.b[k] = make([]byte, n*rb)
	}
	return s
}

// get returns buffers for a step of n tokens.
func (p *bufPool) get(n int, step int, pure bool) *bufSet {
	if !p.owned {
		if p.shared == nil {
			p.shared = p.alloc(p.maxTokens)
		}
		return p.shared
	}
	if p.delay < 0 {
		p.Allocs++
		return p.allocExact(n, step, pure)
	}
	best := -1
	for i, s := range p.free {
		if s.capTokens >= n && (best < 0 || s.capTokens < p.free[best].capTokens) {
			best = i
		}
	}
	var s *bufSet
	if best >= 0 {
		s = p.free[best]
		p.free[best] = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	} else {
		s = p.alloc(n)
	}
	s.step, s.pure = step, pure
	return s
}

// consumed hands back a set whose step was materialized or discarded.
func (p *bufPool) consumed(s *bufSet) {
	if p.owned && p.delay >= 0 && s != nil {
		p.pending = append(p.pending, s)
	}
}

// begun reports that step (pure or not) has passed Begin and that saved
// steps have been saved; sets that became safe return to the free list.
func (p *bufPool) begun(step int, pure bool, saved int) {
	if !pure {
		p.lastFlush = step
	}
	k := 0
	for _, s := range p.pending {
		safe := saved > s.step+p.delay &&
			(!s.pure || p.lastFlush > s.step || saved > s.step+p.bs+p.delay)
		if safe {
			p.free = append(p.free, s)
		} else {
			p.pending[k] = s
			k++
		}
	}
	clear(p.pending[k:])
	p.pending = p.pending[:k]
	// Keep a bounded free list; extra sets go to the GC.
	const keep = 8
	if len(p.free) > keep {
		clear(p.free[keep:])
		p.free = p.free[:keep]
	}
}

// slices sizes the set's buffers to n tokens.
func (s *bufSet) slices(n int, rowBytes []int) [][]byte {
	for k, rb := range rowBytes {
		s.b[k] = s.b[k][:cap(s.b[k])][:n*rb]
	}
	return s.b
}
