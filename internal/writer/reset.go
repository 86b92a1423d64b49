package writer

// resetTask drops every row on the committer, in queue order: after every
// write queued before it landed, before any queued after it. Immediate
// keys' tenancy gets a new owner id for every block (so a read planned
// before the reset fails rather than finding rows) and every slot reads as
// never written; deferred keys' slots turn Absent.
type resetTask struct {
	p    *Path
	id   uint64
	done chan struct{}
}

func (t *resetTask) RunInOrder(failed bool) {
	defer close(t.done)
	if failed {
		return
	}
	p := t.p
	p.com.prog.BeginScatter() // odd: a reader that overlapped re-checks the owners
	if p.ten != nil {
		p.ten.Reset(t.id)
	}
	p.mu.Lock() // deferred occupancy changes under the state lock
	for _, o := range p.occ {
		if o != nil {
			o.ResetAll()
		}
	}
	p.mu.Unlock()
	p.com.prog.EndScatter()
}

// Reset writes out the decode buffer, waits until every write handed over
// has landed (bounded by the wait timeout), and then drops every row the
// mirror holds: a hit planned afterwards finds them absent, a read
// planned before fails as over reassigned slots. The mirror's memory is
// kept (a read still copying from it must find it mapped). No request may
// hold deferred rows in transit (the caller checks that none is live).
// Engine goroutine.
func (p *Path) Reset() error {
	if err := p.Sync(); err != nil {
		return err
	}
	t := &resetTask{p: p, id: p.newID(), done: make(chan struct{})}
	seq := p.q.Push(Task{R: t})
	if err := p.waitSeqSpin(seq, 0); err != nil {
		return err
	}
	<-t.done // Done follows RunInOrder: already closed
	return p.Err()
}
