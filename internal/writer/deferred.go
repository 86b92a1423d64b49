package writer

import (
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// saveDeferred clones this step's deferred rows (one clone per key, shared
// by the step's requests) and appends each request's run to its pending
// deferred write. Save reserved defNeed bytes for the clones; each clone
// takes its share, and what no clone took is released on failure.
//
// A key the step omitted is cloned and charged nothing: its slots turn
// Absent at once, in write order with the claims of the steps before and
// after (an older clone still in transit loses them, as to a newer claim).
func (p *Path) saveDeferred(s *Step, refs *Refs, defNeed int64) error {
	n := len(s.Slots)
	if n == 0 || len(p.lay.Def) == 0 {
		return nil
	}
	for _, k := range p.lay.Def {
		t := &s.Out[k]
		if t.Omitted() {
			p.mu.Lock()
			p.occ[k].MarkAbsent(s.Slots)
			refs.Omit[k] = true
			p.mu.Unlock()
			continue
		}
		nb := n * p.lay.RowBytes[k]
		w := &Write{ID: p.newID(), Deferred: true, Key: k, Charge: int64(nb)}
		defNeed -= int64(nb) // the write owns its share from here on
		switch {
		case t.Owned && t.Host != nil:
			w.Buf, w.Own = gpu.HostBuffer(t.Host[:nb:nb]), true
			w.Owned = append(w.Owned, t.Host)
		case t.Owned:
			w.Buf, w.Own = t.Dev, true
		case t.Host == nil:
			w.Buf = p.takePre(k) // cloned by preClone
		default:
			// A host→device copy returns once the host bytes were taken
			// (staged by the driver for pageable memory): the engine may
			// overwrite them once Save returns.
			b, err := p.dev.Alloc(nb)
			if err != nil {
				p.budget.Release(int64(nb) + defNeed)
				return p.fail(err)
			}
			if err := p.dev.CopyHtoD(b, 0, t.Host[:nb]); err != nil {
				p.dev.Free(b)
				p.budget.Release(int64(nb) + defNeed)
				return p.fail(err)
			}
			w.Buf = b
			p.st.Cloned.Add(int64(nb))
		}
		w.Slots = append([]int32(nil), s.Slots...)
		owners := int32(0)
		for i, h := range s.Handles {
			cnt := s.Count[i]
			if s.Accepted != nil {
				cnt = s.Accepted[i] // rejected rows are never written (marked absent below)
			}
			if cnt == 0 {
				continue
			}
			p.openDeferred(h)
			p.segs.Push(h, w, s.TokOff[i], cnt)
			owners++
		}
		p.mu.Lock()
		p.occ[k].Claim(w.Slots, w.ID, 0)
		if s.Accepted != nil {
			for i, acc := range s.Accepted {
				if acc < s.Count[i] {
					off := s.TokOff[i]
					p.occ[k].MarkAbsent(w.Slots[off+acc : off+s.Count[i]])
				}
			}
		}
		w.Owners = owners
		if owners > 0 {
			p.clones[w.ID] = w
		}
		refs.Src[k], refs.SrcOff[k] = w, 0
		p.pinLocked(refs, w)
		p.mu.Unlock()
	}
	return nil
}

// openDeferred notes that h has a pending deferred write (oldest first for
// budget pressure).
func (p *Path) openDeferred(h soa.Handle) {
	p.defOpen = scratch.Extend(p.defOpen, int(h)+1)
	if p.defOpen[h] == 0 {
		p.defSeq++
		p.defOpen[h] = p.defSeq
		p.defFIFO = append(p.defFIFO, openRef{h: h, seq: p.defSeq})
	}
}

// finish collects the pending deferred rows of request h (finished or
// aborted) for the next deferred task; its open writes still land. Engine
// goroutine.
func (p *Path) finish(h soa.Handle) {
	if int(h) < len(p.defOpen) {
		p.defOpen[h] = 0
	}
	p.segs.Take(h)
}

// flushFinished hands the collected deferred rows to the committer as one
// task and returns its queue sequence (0 when there was nothing). Engine
// goroutine.
func (p *Path) flushFinished() uint64 {
	if len(p.segs.Out) == 0 {
		return 0
	}
	segs := append([]Seg(nil), p.segs.Out...)
	clear(p.segs.Out)
	p.segs.Out = p.segs.Out[:0]
	p.st.DeferredWrites.Add(1)
	p.st.Tasks.Add(1)
	return p.q.PushLazy(Task{Segs: segs}) // a wait for them wakes the committer
}

// forceOldestDeferred writes the oldest open deferred write and waits
// (bounded) for it to land; it reports whether there was one (reserve
// checks the sticky failure after it).
func (p *Path) forceOldestDeferred() bool {
	for len(p.defFIFO) > 0 {
		r := p.defFIFO[0]
		p.defFIFO = p.defFIFO[1:]
		if int(r.h) < len(p.defOpen) && p.defOpen[r.h] == r.seq {
			p.finish(r.h)
			_ = p.WaitSeq(p.flushFinished())
			return true
		}
	}
	return false
}
