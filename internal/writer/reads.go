package writer

import "github.com/omnicache/omnicache/soa"

// The read path's side of the write path: what a hit read needs of the
// writes, behind a few calls (the read path's interface, reader.Writes).
// A read pins a snapshot of the slots it will read (Pin), runs in queue
// order on the committer when it is prefetched (PushRead), waits for the
// writes it joins (WaitSeq) and copies rows still in a write (ReadRows);
// it reads the mirrors and the slot tables itself (Parts).

// Snapshot is what a hit read of some blocks may find, as Pin took it.
type Snapshot struct {
	// LastID is the newest write handed over: a block a newer write owns
	// was claimed since (soa.Tenancy).
	LastID uint64
	// JoinSeq is the queue item a read of the blocks' immediate rows
	// waits for: the newest task handed over that lands rows in one of
	// them and had not finished (0: none).
	JoinSeq uint64
	// Deferred keys, per hit, per deferred key (Layout.Def order), per
	// slot of the hit's blocks: the slot's occupancy word and, for a row
	// in transit, the pending clone that holds it (pinned; nil when the
	// committer dropped it after a write failure) and its row there.
	Words  []uint64
	Clones []*Write
	Rows   []uint32
}

// Reset empties s, keeping its memory.
func (s *Snapshot) Reset() {
	s.LastID, s.JoinSeq = 0, 0
	s.Words = s.Words[:0]
	clear(s.Clones)
	s.Clones = s.Clones[:0]
	s.Rows = s.Rows[:0]
}

// Pin takes what a read of the hits' blocks (block ids, per hit) may find
// into s (emptied first): the newest write handed over, the queue item the
// read joins, and every deferred slot's word, with the clones of rows in
// transit pinned in pins (until Unpin). Engine goroutine: a hit is planned
// behind the writes handed over so far.
func (p *Path) Pin(hits [][]int32, pins *Refs, s *Snapshot) {
	s.Reset()
	s.LastID = p.nextID
	if len(hits) == 0 {
		return
	}
	if len(p.lay.Imm) > 0 {
		s.JoinSeq = p.joinSeq(hits)
	}
	if len(p.lay.Def) == 0 {
		return
	}
	bs := int32(p.lay.BlockSize)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, blocks := range hits {
		for _, k := range p.lay.Def {
			occ := p.occ[k]
			for _, b := range blocks {
				for sl := b * bs; sl < (b+1)*bs; sl++ {
					w := occ.Word(sl)
					var clone *Write
					var row uint32
					if st, owner := soa.Unpack(w); st == soa.InTransit {
						// pending deferred rows: the read copies them from
						// the device clone (gone only after a write failure:
						// the committer drops clones it could not write)
						if clone = p.clones[owner]; clone != nil {
							row = occ.Row(sl)
							p.pinLocked(pins, clone)
						}
					}
					s.Words = append(s.Words, w)
					s.Clones = append(s.Clones, clone)
					s.Rows = append(s.Rows, row)
				}
			}
		}
	}
}

// PushRead queues r to run on the committer in queue order (see InOrder)
// and returns its queue sequence. It is handed over lazily: a polling
// committer starts it within a poll, and a wait for it (WaitSeq) wakes the
// committer. Engine goroutine.
func (p *Path) PushRead(r InOrder) uint64 { return p.q.PushLazy(Task{R: r}) }

// ReadRows copies rows [r0, r0+cnt) of write w for key k into out: rows
// still in the write's page or owned host tensor, parked on the device (read
// from there while they are, else from the copy the flush staged), or a
// deferred clone's (read from the device). A device copy that fails fails
// the path (sticky). Any goroutine holding a pin on w.
func (p *Path) ReadRows(w *Write, k, r0, cnt int, out []byte) error {
	rb := p.lay.RowBytes[k]
	if w.Deferred {
		if err := p.dev.CopyDtoH(out[:cnt*rb], w.Buf, r0*rb); err != nil {
			return p.fail(err)
		}
		return p.waitCopies()
	}
	ki := p.lay.ImmIdx[k]
	nimm := len(p.lay.Imm)
	for cnt > 0 {
		j, i := r0/w.N, r0%w.N
		m := min(cnt, w.N-i)
		slot := j*nimm + ki
		if h := w.Host[slot]; h != nil { // host rows: staged by Save, or an owned host tensor
			// A prefill's rows are megabytes: split across the copy
			// workers, as the read path's prefix gathers are.
			p.parts.Workers.Copy(out[:m*rb], h[i*rb:(i+m)*rb])
		} else if err := p.readParked(w, slot, i, m, rb, out); err != nil {
			return err
		}
		out = out[m*rb:]
		r0 += m
		cnt -= m
	}
	return nil
}

// readParked reads rows of a decode-buffer step whose rows were parked on
// the device (or a direct write's): from the device while they are there,
// else from the staged copy the flush made (the committer releases the
// device rows once it is complete).
func (p *Path) readParked(w *Write, slot, i, m, rb int, out []byte) error {
	if !p.beginParkedRead(w) {
		p.parts.Workers.Copy(out[:m*rb], w.Staged[slot][i*rb:(i+m)*rb])
		return nil
	}
	err := p.dev.CopyDtoH(out[:m*rb], w.Dev[slot], i*rb)
	if err != nil {
		err = p.fail(err)
	} else {
		err = p.waitCopies()
	}
	p.endParkedRead(w)
	return err
}

// waitCopies waits (bounded) for the copies issued so far on the device.
func (p *Path) waitCopies() error {
	ev, err := p.dev.Record()
	if err != nil {
		return p.fail(err)
	}
	return p.waitDev(ev)
}
