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

// ReadBatch gathers the device copies of one read (ReadRows with a
// batch): they are waited for once, by FinishReads, rather than one device
// synchronization per request and key (a decode step of 16 requests and 2
// keys read from a CUDA device waited 32 times: 1.7 ms of its Materialize
// on an H100, python -m omnicache._bench --cuda). The zero ReadBatch is
// empty; one read's at a time.
type ReadBatch struct {
	copies bool     // device copies issued and not waited for yet
	parked []*Write // parked device rows read, ended once the copies completed
}

// ReadRows copies rows [r0, r0+cnt) of write w for key k into out: rows
// still in the write's page or owned host tensor, parked on the device (read
// from there while they are, else from the copy the flush staged), or a
// deferred clone's (read from the device). With a batch b, a device copy
// is only issued: out holds the rows once FinishReads(b) returned; without
// one (nil) ReadRows waits for it. A device copy that fails fails the path
// (sticky). Any goroutine holding a pin on w.
func (p *Path) ReadRows(w *Write, k, r0, cnt int, out []byte, b *ReadBatch) error {
	rb := p.lay.RowBytes[k]
	if w.Deferred {
		if err := p.dev.CopyDtoH(out[:cnt*rb], w.Buf, r0*rb); err != nil {
			return p.fail(err)
		}
		if b != nil {
			b.copies = true
			return nil
		}
		return p.waitCopies()
	}
	ki := p.lay.ImmIdx[k]
	nimm := len(p.lay.Imm)
	for cnt > 0 {
		j, i := r0/w.N, r0%w.N
		m := min(cnt, w.N-i)
		slot := j*nimm + ki
		if h := w.Host[slot]; h != nil { // host rows: staged by Save, an owned host tensor, or Step.Into
			// A prefill's rows are megabytes: split across the copy
			// workers, as the read path's prefix gathers are. Rows read
			// into the buffer Save copied them to are in place.
			if src := h[i*rb : (i+m)*rb]; &src[0] != &out[0] {
				p.parts.Workers.Copy(out[:m*rb], src)
			}
		} else if err := p.readParked(w, slot, i, m, rb, out, b); err != nil {
			return err
		}
		out = out[m*rb:]
		r0 += m
		cnt -= m
	}
	return nil
}

// FinishReads waits for the device copies ReadRows issued with b and ends
// its reads of parked device rows (the committer may then free them), and
// empties b. Every read that passed b to ReadRows calls it, failed or not.
func (p *Path) FinishReads(b *ReadBatch) error {
	var err error
	if b.copies {
		b.copies = false
		err = p.waitCopies()
	}
	for i, w := range b.parked {
		p.endParkedRead(w)
		b.parked[i] = nil
	}
	b.parked = b.parked[:0]
	return err
}

// readParked reads rows of a decode-buffer step whose rows were parked on
// the device (or a direct write's): from the device while they are there,
// else from the staged copy the flush made (the committer releases the
// device rows once it is complete). With a batch the copy is only issued,
// and the read ends in FinishReads.
func (p *Path) readParked(w *Write, slot, i, m, rb int, out []byte, b *ReadBatch) error {
	if !p.beginParkedRead(w) {
		p.parts.Workers.Copy(out[:m*rb], w.Staged[slot][i*rb:(i+m)*rb])
		return nil
	}
	err := p.dev.CopyDtoH(out[:m*rb], w.Dev[slot], i*rb)
	if b != nil {
		b.parked = append(b.parked, w)
		if err != nil {
			return p.fail(err)
		}
		b.copies = true
		return nil
	}
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
