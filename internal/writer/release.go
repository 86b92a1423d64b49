package writer

import (
	"slices"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/scratch"
)

// Refs are a saved step's references into the write path: per key the
// write holding the step's rows (Src, at row SrcOff) or Omit when the step
// did not emit the key (its rows read as zeros), and the writes the step
// pins (its own, and those its hit reads come from) until it is consumed
// (Unpin).
type Refs struct {
	Src    []*Write
	SrcOff []int32
	Omit   []bool
	Pins   []*Write
}

// Reset empties r for nkeys keys, keeping its capacity.
func (r *Refs) Reset(nkeys int) {
	clear(r.Pins)
	r.Pins = r.Pins[:0]
	r.Src = scratch.Grow(r.Src, nkeys)
	clear(r.Src)
	r.SrcOff = scratch.Grow(r.SrcOff, nkeys)
	r.Omit = scratch.Grow(r.Omit, nkeys)
	clear(r.Omit)
}

// pinLocked pins w for r once. A pinned deferred clone's charge cannot be
// forced out of the budget (see reserve). Caller holds the state lock.
func (p *Path) pinLocked(r *Refs, w *Write) {
	if slices.Contains(r.Pins, w) {
		return
	}
	if w.Pins.Add(1) == 1 && w.Deferred {
		p.pinnedCharge += w.Charge
	}
	r.Pins = append(r.Pins, w)
}

// pinOpen pins the open decode buffer write w for r, without the state
// lock: the buffer owns w until the engine flushes it, so it cannot be
// released meanwhile, and it is immediate (no pinned charge). Engine
// goroutine.
func pinOpen(r *Refs, w *Write) {
	if slices.Contains(r.Pins, w) {
		return
	}
	w.Pins.Add(1)
	r.Pins = append(r.Pins, w)
}

// maxFreeWrites bounds the released writes a path keeps for reuse.
const maxFreeWrites = 256

// newWrite takes a recycled write (and its slices), so steady-state steps
// allocate none. Released writes go to the path's own lists, on whichever
// goroutine drops the last reference: wfreeMu when it holds the state lock
// (a consumed step's Unpin), else wfree (putWrite); the engine goroutine
// takes a whole list at once into its stash: wfreeMu under the lock a
// step's write takes anyway (writeStep), wfree here when the stash is
// still dry, then wfreeMu under the lock (a decode buffer's writes are
// opened here, outside writeStep). Not a sync.Pool: the engine goroutine
// parks on back-pressure and wakes on another P, where a pool's per-P
// cache is empty and every Get steals. Engine goroutine.
func (p *Path) newWrite(pg *Page, n int) *Write {
	if len(p.wstash) == 0 {
		p.wmu.Lock()
		p.wstash, p.wfree = p.wfree, p.wstash
		p.wmu.Unlock()
	}
	if len(p.wstash) == 0 {
		p.mu.Lock()
		p.refillWrites()
		p.mu.Unlock()
	}
	w := scratch.Pop(&p.wstash)
	host, dev, staged, absent, slots, owned := w.Host[:0], w.Dev[:0], w.Staged[:0], w.Absent[:0], w.Slots[:0], w.Owned[:0]
	pub, pubKeys, reject := w.Pub[:0], w.PubKeys[:0], w.Reject[:0]
	*w = Write{ID: p.newID(), Page: pg, N: n, Host: host, Dev: dev, Staged: staged, Absent: absent, Slots: slots, Owned: owned,
		Pub: pub, PubKeys: pubKeys, Reject: reject}
	return w
}

// release frees what a write holds once nothing references it; locked
// says the caller holds the state lock, so owned host buffers are queued
// for handBack instead of handed back now.
func (p *Path) release(w *Write, locked bool) {
	if w.Page != nil {
		p.pages.Release(w.Page)
		w.Page = nil
	}
	p.freeDev(w)
	// A deferred clone's buffer is the cache's, or an owned device tensor
	// (freed too: it was handed over); an owned host tensor goes back
	// through ReleaseHost below.
	if w.Deferred && !w.Buf.IsZero() && !(w.Own && len(w.Owned) > 0) {
		p.dev.Free(w.Buf)
	}
	w.Buf = gpu.Buffer{}
	p.budget.Release(w.Charge)
	w.Charge = 0
	if p.cfg.ReleaseHost != nil && len(w.Owned) > 0 {
		if locked {
			p.handback = append(p.handback, w.Owned...)
		} else {
			for _, b := range w.Owned {
				p.cfg.ReleaseHost(b)
			}
		}
	}
	clear(w.Owned)
	w.Owned = w.Owned[:0]
	if !w.Deferred {
		clear(w.Host)
		clear(w.Staged)
		if !locked {
			p.putWrite(w)
		} else if len(p.wfreeMu) < maxFreeWrites {
			p.wfreeMu = append(p.wfreeMu, w)
		}
	}
}

// refillWrites takes the writes released under the state lock into the
// engine's stash when it is dry. Engine goroutine, holding the state lock.
func (p *Path) refillWrites() {
	if len(p.wstash) == 0 {
		p.wstash, p.wfreeMu = p.wfreeMu, p.wstash
	}
}

// putWrite recycles a released immediate write. Any goroutine.
func (p *Path) putWrite(w *Write) {
	p.wmu.Lock()
	if len(p.wfree) < maxFreeWrites {
		p.wfree = append(p.wfree, w)
	}
	p.wmu.Unlock()
}

// freeDev frees the device rows parked in w and releases their charge.
func (p *Path) freeDev(w *Write) {
	for i, b := range w.Dev {
		if !b.IsZero() {
			p.dev.Free(b)
		}
		w.Dev[i] = gpu.Buffer{}
	}
	p.budget.Release(w.DevCharge)
	w.DevCharge = 0
	w.DevLive = false
}

// unrefLocked drops pins (and owner refs) and reports whether nothing
// references w any more. Caller holds the state lock.
func (p *Path) unrefLocked(w *Write, pins, owners int32) (release bool) {
	// Decide on the count the decrement returns, not on an earlier load:
	// unpinFast may drop another pin lock-free between the two, and the
	// charge would then never be released (TestUnpinPinnedChargeRace).
	n := w.Pins.Add(-pins)
	if pins > 0 && w.Deferred && n == 0 {
		p.pinnedCharge -= w.Charge
	}
	w.Owners -= owners
	if owners > 0 && w.Owners == 0 {
		delete(p.clones, w.ID)
	}
	if n < 0 || w.Owners < 0 {
		panic("omnicache: write reference count below zero")
	}
	return n == 0 && w.Owners == 0
}

// unpinFast drops one pin of w without the state lock when it is not the
// last one (the last is dropped under the lock, where w may be released).
func unpinFast(w *Write) bool {
	// The first read is an atomic add of zero, not a load: the count's
	// line was last written by another goroutine (the committer dropping
	// its own pin), and a load would fetch it shared, only for the
	// decrement here or under the lock to fetch it again, exclusive.
	n := w.Pins.Add(0)
	for {
		if n <= 1 {
			return false
		}
		if w.Pins.CompareAndSwap(n, n-1) {
			return true
		}
		n = w.Pins.Load()
	}
}

// Unpin drops a consumed (or failed) step's pins and releases the writes
// nothing references any more. Any goroutine.
func (p *Path) Unpin(r *Refs) {
	if len(r.Pins) == 0 {
		// Nothing pinned (a step without hits has no plan pins): no lock,
		// and nothing released to hand back.
		clear(r.Src)
		return
	}
	locked := false
	for _, w := range r.Pins {
		if unpinFast(w) {
			continue // not the last pin: nothing can be released
		}
		if !locked {
			p.mu.Lock()
			locked = true
		}
		if p.unrefLocked(w, 1, 0) {
			p.release(w, true)
		}
	}
	clear(r.Pins)
	r.Pins = r.Pins[:0]
	clear(r.Src)
	if locked {
		p.mu.Unlock()
		p.handBack()
	}
}

// handBack calls Config.ReleaseHost for the owned host buffers released
// under the state lock. Call it without the lock.
func (p *Path) handBack() {
	if p.cfg.ReleaseHost == nil {
		return
	}
	p.mu.Lock()
	if len(p.handback) == 0 {
		p.mu.Unlock()
		return
	}
	bufs := p.handback
	p.handback = nil
	p.mu.Unlock()
	for _, b := range bufs {
		p.cfg.ReleaseHost(b)
	}
}

// beginParkedRead reports whether w's parked device rows are still live
// and, if so, registers a reader that must call endParkedRead. Otherwise
// the rows are in w.Staged. Any goroutine.
func (p *Path) beginParkedRead(w *Write) bool {
	p.mu.Lock()
	live := w.DevLive
	if live {
		w.DevReads++
	}
	p.mu.Unlock()
	return live
}

// endParkedRead ends a read registered by beginParkedRead, freeing the
// device rows when the committer left them to the last reader.
func (p *Path) endParkedRead(w *Write) {
	p.mu.Lock()
	w.DevReads--
	if w.DevReads == 0 && w.DevRelease {
		w.DevRelease = false
		p.freeDev(w)
	}
	p.mu.Unlock()
}

// committerOwner is the path's side of the committer (Owner).
type committerOwner struct{ p *Path }

func (o committerOwner) Failed() bool   { return o.p.failed.Load() != nil }
func (o committerOwner) Fail(err error) { o.p.fail(err) }

// Staged releases the device copies a write held until its rows were
// host-ready: step clones, and parked device rows (or leaves those to the
// last reader still copying from them).
func (o committerOwner) Staged(w *Write) {
	if !w.DevLive {
		// Host rows only: nothing to free. Only the engine goroutine sets
		// DevLive, before the hand-over; after it only the committer clears
		// it (release does too, but only once the committer landed the
		// write): its read needs no lock, and the write's commit takes no
		// state lock (the line the engine goroutine's next Save takes it on).
		return
	}
	p := o.p
	p.mu.Lock() // readers register on parked rows under it (beginParkedRead)
	if w.DevReads == 0 {
		p.freeDev(w)
	} else {
		w.DevLive, w.DevRelease = false, true
	}
	p.mu.Unlock()
}

// Landed drops the references a finished task held and releases the
// writes nothing references any more.
func (o committerOwner) Landed(t Task) {
	p := o.p
	rel := p.landed[:0] // committer-only scratch
	p.mu.Lock()
	if t.W != nil && p.unrefLocked(t.W, 0, 1) {
		rel = append(rel, t.W)
	}
	for _, s := range t.Segs {
		if p.unrefLocked(s.W, 0, 1) {
			rel = append(rel, s.W)
		}
	}
	p.mu.Unlock()
	for _, w := range rel {
		p.release(w, false)
	}
	clear(rel)
	p.landed = rel[:0]
}
