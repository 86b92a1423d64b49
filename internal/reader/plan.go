package reader

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/internal/writer"
	"github.com/omnicache/omnicache/soa"
)

// Reader is the read path of one cache, over its write path's tables.
type Reader struct {
	// read by every call
	w      Writes
	lay    *writer.Layout
	st     *writer.Counters
	parts  *writer.Parts
	prog   *writer.Progress
	opt    Options
	wait   time.Duration // the consumer's wait for a working committer (DefaultAheadWait)
	joinBl [][]int32     // Plan's scratch: the hits' blocks (engine goroutine)
	stash  []*Step       // NewStep's free records (engine goroutine), a list of freed at a time
	// written by the committer's reads ahead too: kept off the lines above
	// (128 bytes: the adjacent-line prefetcher moves lines in pairs)
	_       [128]byte
	charged atomic.Int64 // read-ahead bytes held by unconsumed steps
	pool    bufPool
	_       [128]byte
	// freed holds the step records released (the consumer's Release or
	// Cancel, the committer's end of a read ahead) until NewStep takes them
	// back: the one pool of records, so a steady run allocates none. The
	// reader's own list, not a sync.Pool: a record is often freed on
	// another P than the engine's, and a pool then steals across Ps on
	// every Get; and one cache's records keep the sizes its steps need.
	freeMu sync.Mutex
	freed  []*Step
}

// maxFreeSteps bounds the step records kept for reuse (a burst of
// unconsumed steps leaves no more than this behind).
const maxFreeSteps = 64

// NewStep returns an empty record for a step of nkeys keys: a freed one
// when there is one. The engine goroutine takes the freed records a whole
// list at a time (one lock a list). Engine goroutine.
func (r *Reader) NewStep(nkeys int) *Step {
	if len(r.stash) == 0 {
		r.stash = r.takeFreed(r.stash)
	}
	s := scratch.Pop(&r.stash)
	s.Reset(nkeys)
	return s
}

// free recycles a record nothing references any more: its pins on the
// write path are dropped, then it waits in r.freed for NewStep. Any
// goroutine.
func (r *Reader) free(s *Step) {
	r.w.Unpin(&s.Refs)
	r.freeMu.Lock()
	if len(r.freed) < maxFreeSteps {
		r.freed = append(r.freed, s)
	}
	r.freeMu.Unlock()
}

// takeFreed hands over the records released since the last call, taking
// stash (emptied) as the next list's storage.
func (r *Reader) takeFreed(stash []*Step) []*Step {
	r.freeMu.Lock()
	out := r.freed
	r.freed = stash[:0]
	r.freeMu.Unlock()
	return out
}

// New returns the read path over the write path w and its parts.
func New(w Writes, parts *writer.Parts, opt Options) *Reader {
	r := &Reader{w: w, lay: parts.Layout, st: parts.Counters, parts: parts, prog: parts.Progress, opt: opt, wait: DefaultAheadWait}
	r.pool.max = opt.Budget
	r.pool.workers = parts.Workers.N()
	return r
}

// SetAheadWait replaces DefaultAheadWait for r (tests; not while a step is
// consumed; 0: no wait).
func (r *Reader) SetAheadWait(d time.Duration) { r.wait = max(d, 0) }

// Hit is a request whose hit prefix a step serves: its index in the step,
// its hit tokens and the hit's block ids (borrowed for Plan).
type Hit struct {
	Index  int32
	Tokens int32
	Blocks []int32
}

// Plan plans the prefix reads of the step's hits and, when Charge took
// the step's prefetch buffers, queues the read (see prefetch.go). It runs
// on the engine goroutine: in Begin for a prefetched step, once the decode
// buffer and the finished requests' rows were handed over (the rows a hit
// finds are those cached before the step); in Save otherwise, after the
// step's own writes (a hit on blocks the step writes reads its rows).
//
// Immediate keys: the hit's block ids (the read works out their slots:
// Step.hitSlots); the read joins the queue up to the newest task handed
// over that lands rows in a hit block (writer.Snapshot.JoinSeq: the rows
// the hit finds are those cached before the plan, and only writes to its
// blocks can have put them there), and finds the planned rows only where
// no write newer than the newest one handed over so far (maxOwner)
// touched the block and no planned write skipped the slot (see
// soa.Tenancy). Deferred keys: each row's occupancy word, and the clone
// (pinned) of a row still in transit. Writes.Pin takes them all.
func (r *Reader) Plan(s *Step, hits []Hit) {
	if len(hits) == 0 {
		return
	}
	n := len(s.IDs)
	s.prefix = scratch.Grow(s.prefix, n)
	clear(s.prefix)
	s.immOff = scratch.Grow(s.immOff, n)
	s.defOff = scratch.Grow(s.defOff, n)
	for i := range s.immOff {
		s.immOff[i], s.defOff[i] = -1, -1
	}
	if s.pfCharge.Load() > 0 { // charged by Charge just before: prefetch
		defer r.queue(s)
	}
	r.joinBl = r.joinBl[:0]
	for _, h := range hits {
		r.joinBl = append(r.joinBl, h.Blocks)
	}
	r.w.Pin(r.joinBl, &s.planPins, &s.snap)
	clear(r.joinBl) // the plan's block ids are borrowed
	s.maxOwner, s.joinSeq = s.snap.LastID, s.snap.JoinSeq
	for _, h := range hits {
		s.prefix[h.Index] = h.Tokens
		if len(r.lay.Imm) == 0 {
			continue
		}
		// the hit's block ids (copied: the engine's are borrowed); the read
		// expands them to slots on its own goroutine (Step.hitSlots)
		s.immOff[h.Index] = int32(len(s.immBlk))
		s.immBlk = append(s.immBlk, h.Blocks...)
	}
	if len(r.lay.Def) == 0 {
		return
	}
	bs := int32(r.lay.BlockSize)
	e := 0 // the snapshot's entries, in Pin's order
	for _, h := range hits {
		s.defOff[h.Index] = int32(len(s.pKind))
		for _, k := range r.lay.Def {
			opt := r.lay.Keys[k].Optional
			for _, b := range h.Blocks {
				for sl := b * bs; sl < (b+1)*bs; sl++ {
					kind := uint8(srcMirror)
					switch st, _ := soa.Unpack(s.snap.Words[e]); st {
					case soa.Absent:
						kind = srcAbsent
						if opt {
							kind = srcZero
						}
					case soa.InTransit:
						// pending deferred rows: read the device clone
						kind = srcClone
						if s.snap.Clones[e] == nil {
							// Only after a write failure: the committer
							// drops clones it could not write. The read
							// reports the failure.
							kind = srcFailed
						}
					}
					s.pKind = append(s.pKind, kind)
					s.pSlot = append(s.pSlot, sl)
					e++
				}
			}
		}
	}
}
