package writer

import (
	"sync"
	"sync/atomic"
)

// Progress is the committer's progress as other goroutines watch it: how
// far it got in its queue, whether it sleeps, and whether it is scattering
// immediate rows into the mirror. The scatter epoch is odd from the first
// row a scatter overwrites until its tenancy is published: a reader that
// copied mirror rows and saw the epoch move (or odd) checks the owners
// again once it is even (EvenEpoch). Any goroutine; BeginScatter and
// EndScatter are the committer's only (or a fake write path's).
type Progress struct {
	q     *Queue[Task]
	epoch atomic.Uint64
	mu    sync.Mutex
	even  *sync.Cond // broadcast when the epoch turns even
}

// NewProgress returns the progress of the committer that runs q's tasks.
func NewProgress(q *Queue[Task]) *Progress {
	p := &Progress{q: q}
	p.even = sync.NewCond(&p.mu)
	return p
}

// Reached reports, without a lock, whether queue item seq was processed
// (a false answer may be stale: the caller waits then).
func (p *Progress) Reached(seq uint64) bool { return p.q.Reached(seq) }

// Asleep reports whether the committer sleeps (polling or for good; not
// spinning): an item pushed now waits for a poll or a wake.
func (p *Progress) Asleep() bool { return p.q.Asleep() }

// Kick wakes the committer if it sleeps with work queued, for a goroutine
// about to wait for its progress other than through Path.WaitSeq (a wait
// for an import, say).
func (p *Progress) Kick() { p.q.Kick() }

// Epoch is the scatter counter (odd while scattering).
func (p *Progress) Epoch() uint64 { return p.epoch.Load() }

// EvenEpoch waits until no scatter of immediate rows is in progress and
// returns the epoch.
func (p *Progress) EvenEpoch() uint64 {
	if e := p.epoch.Load(); e&1 == 0 {
		return e
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if e := p.epoch.Load(); e&1 == 0 {
			return e
		}
		p.even.Wait()
	}
}

// BeginScatter makes the epoch odd: rows are about to be overwritten.
func (p *Progress) BeginScatter() { p.epoch.Add(1) }

// EndScatter makes the epoch even again (the scatter's tenancy is
// published) and wakes the readers waiting for it.
func (p *Progress) EndScatter() {
	p.mu.Lock()
	p.epoch.Add(1)
	p.even.Broadcast()
	p.mu.Unlock()
}
