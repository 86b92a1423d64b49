// Package reader is the cache core's read path: it plans the hit reads of
// a saved step (which rows a hit prefix comes from, and whose rows they must
// be) and executes them when the step is materialized, joined to the writes
// they come from.
//
//	plan (Save, engine goroutine)            read (Materialize, any goroutine)
//	─────────────────────────────            ────────────────────────────────────
//	immediate keys: the hit's block ids,     join the committer up to the last
//	  and the newest write id                write queued for a hit block;
//	  handed over (maxOwner)                 read a block's rows only if its
//	                                         owner is at most
//	                                         maxOwner and none of its slots is
//	                                         stale (a planned write skipped it),
//	                                         before and after the copy (else
//	                                         ErrReassigned); an optional key's
//	                                         absent bit (the last write omitted
//	                                         it) reads zeros
//	deferred keys: per prefix row the        committed: mirror row, occupancy
//	  slot's occupancy word, and the         word unchanged around the copy;
//	  pending clone (pinned) in transit      in transit: the clone's row
//
// A read therefore never returns rows its plan did not own: a write that
// skipped a slot (a newer write was queued) leaves it stale, a newer
// tenant's write makes its block's owner newer than the plan, and a
// committed deferred row replaced since planning changes its word.
//
// With prefetch (prefetch.go) the read is planned at Begin and run by the
// committer in queue order (writer.InOrder): no write after the plan has
// landed, so the checks above hold by construction and the rows go into
// Result-layout buffers that Materialize adopts. A step consumed before the
// committer started its read is read by the consumer as above, holding the
// committer at the read meanwhile (Reader.readAhead).
//
// Goroutines: Plan runs on the engine goroutine (in Begin, or in Save for
// a step not prefetched); a prefetch read on the committer (and the copy
// workers); Read on the goroutine that consumes the step (Materialize),
// one consumer per Step.
// The read path sees the write path through a few calls (Writes: pin a
// snapshot, queue a read in order, wait for a write, copy a write's rows)
// and reads the mirrors and slot tables itself (writer.Parts). Reads take
// the write path's state lock only through Pin and for parked-row
// bookkeeping (ReadRows), never across a copy.
package reader

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/internal/writer"
)

// Step is a saved step until Materialize or Discard consumes it: its
// requests, where its own rows are (writer.Refs) and the plan of its hit
// reads. Reusable through Reset.
type Step struct {
	ID    uint64
	IDs   []int64 // per request, in batch order
	Count []int32 // per request: this step's tokens
	Start []int32 // per request: its first scheduled position
	// End is, per request, the position its delivered rows end at when
	// that is short of Start+Count (rejected draft tokens, a replaced
	// prompt); filled only when Trimmed. The cache sets them under its
	// lock while the step is unconsumed.
	End     []int32
	Trimmed bool
	// Floor lists the requests (step indices) that resumed after a
	// preemption and may recompute rows they already delivered.
	Floor []int32
	// FloorMax is, parallel to Floor, the length the request had when it
	// was preempted: rows past it are new to it, never left out.
	FloorMax []int32
	tokOff   []int32 // per request: first row in the step (see Offsets)
	prefix   []int32 // per request: hit prefix tokens (empty when no hit)
	writer.Refs

	// immediate-key hit plan: per hit its block ids; the read joins the
	// committer up to joinSeq, and a block whose owner is newer than
	// maxOwner was claimed by a write newer than the plan.
	immOff   []int32 // per request: its first block in immBlk (-1: no hit)
	immBlk   []int32
	joinSeq  uint64
	maxOwner uint64
	// immSlot is the read's scratch: request immReq-1's hit slots, expanded
	// from its blocks by hitSlots (the step's one reader at a time).
	immSlot []int32
	immReq  int
	// deferred-key hit plan: per (request, deferred key, prefix row) an
	// entry of snap (the slot's word, and the clone of a row in transit)
	// and what the read does with it.
	defOff []int32 // per request: first entry
	pKind  []uint8
	pSlot  []int32
	snap   writer.Snapshot
	// planPins pin the clones the plan reads (snap.Clones) until the read
	// is done: the prefetch's end, or the step's release.
	planPins writer.Refs

	lastQ int     // search hint for Find
	Qidx  []int32 // requests asked of Materialize, as step indices

	// prefetch (see prefetch.go): the hit read the committer runs in queue
	// order into result-layout buffers, while the engine runs its forward.
	rd       *Reader
	pf       [][]byte // per key: [prefix | step rows] per request, batch order
	pfOff    []int32  // per request: first row in pf
	pfSeq    uint64   // queue sequence of the read (0: not prefetched)
	pfErr    []error  // per request: its prefix could not be served
	pfFailed bool     // the committer skipped the read: the path had failed
	noBudget bool     // planned without read-ahead: the budget was exhausted
	// pfState: pfQueued until the committer takes the read's buffers
	// (pfAlloc) and starts the read (pfStarted), or the consumer gives it
	// up first (pfCancelled: Discard, Abort, a failed Save; the read is
	// skipped), or reads the rows itself (pfEngine while it does, holding
	// engMu; then pfTaken, or pfQueued again when it handed the read
	// back): see Reader.readAhead and "Cold buffers" in prefetch.go.
	pfState atomic.Int32
	engMu   sync.Mutex
	// into are the engine's buffers for the read (Plan.ResultInto, cut
	// to the step's rows; empty: the pool's). pfMu is held by the
	// committer from its claim of such a read until the read is done: the
	// consumer takes it (settle) before it gives the step up, so that no
	// read writes into the engine's memory once the call returned.
	into [][]byte
	pfMu sync.Mutex
	// resultInto are the plan's Plan.ResultInto buffers, whole, whether
	// or not a read or the step's Save used them (IntoClash).
	resultInto [][]byte
	// batch: the device copies of the consumer's read of the step's own
	// rows (Reader.Read waits for them once).
	batch writer.ReadBatch
	// pfCharge is the read-ahead charge still held: the bytes Charge
	// charged for pf (0: not prefetched) until given back, once, by
	// whichever of Cancel and the last Release is first.
	pfCharge atomic.Int64
	hold     atomic.Int32
	// device results (device.go): the step's device buffers for its
	// Result (Plan.ResultDev), the event of the committer's copy of the
	// hit rows up into them (devUp once issued) or its failure.
	dev    []gpu.Buffer
	devEv  gpu.Event
	devErr error
	devUp  bool
}

// Step.pfState values.
const (
	pfQueued = iota
	pfStarted
	pfCancelled
	pfEngine
	pfTaken
	pfAlloc
)

// plan entry kinds for deferred hit rows.
const (
	srcZero = iota
	srcAbsent
	srcMirror
	srcClone
	srcFailed // in transit for a write the committer dropped after a failure
)

// Reset empties s for a step of nkeys keys, keeping its buffers.
func (s *Step) Reset(nkeys int) {
	s.IDs = s.IDs[:0]
	s.Count = s.Count[:0]
	s.Start = s.Start[:0]
	s.End = s.End[:0]
	s.Trimmed = false
	s.Floor = s.Floor[:0]
	s.FloorMax = s.FloorMax[:0]
	s.tokOff = s.tokOff[:0]
	s.prefix = s.prefix[:0]
	s.Refs.Reset(nkeys)
	s.planPins.Reset(0)
	s.immOff = s.immOff[:0]
	s.immBlk = s.immBlk[:0]
	s.immSlot, s.immReq = s.immSlot[:0], 0
	s.joinSeq, s.maxOwner = 0, 0
	s.defOff = s.defOff[:0]
	s.pKind = s.pKind[:0]
	s.pSlot = s.pSlot[:0]
	s.snap.Reset()
	s.lastQ = 0
	s.Qidx = s.Qidx[:0]
	s.pf = s.pf[:0]
	s.into = scratch.Empty(s.into) // the engine's memory: not kept alive by a free record
	s.resultInto = scratch.Empty(s.resultInto)
	s.pfOff = s.pfOff[:0]
	s.pfSeq = 0
	clear(s.pfErr)
	s.pfErr = s.pfErr[:0]
	s.pfFailed, s.noBudget = false, false
	s.resetDev()
	// The record is not shared while it is reset: store only what changed
	// (an atomic store is an exchange on amd64).
	if s.pfState.Load() != pfQueued {
		s.pfState.Store(pfQueued)
	}
	if s.pfCharge.Load() != 0 {
		s.pfCharge.Store(0)
	}
	if s.hold.Load() != 1 {
		s.hold.Store(1) // the consumer's (Materialize or Discard, or the cancel)
	}
}

// PlanPins are the pins of the step's hit plan (see Step.planPins), for
// Close.
func (s *Step) PlanPins() *writer.Refs { return &s.planPins }

// Offsets returns each request's first row within the step, computing them
// on first use (by the engine before the step is published, or by its one
// consumer after it was taken).
func (s *Step) Offsets() []int32 {
	if len(s.tokOff) != len(s.IDs) {
		s.tokOff = s.tokOff[:0]
		off := int32(0)
		for _, n := range s.Count {
			s.tokOff = append(s.tokOff, off)
			off += n
		}
	}
	return s.tokOff
}

// Trim makes request i's rows end at position end (not past
// Start+Count), filling End on first use.
func (s *Step) Trim(i int, end int32) {
	if !s.Trimmed {
		s.End = s.End[:0]
		for j := range s.Count {
			s.End = append(s.End, s.Start[j]+s.Count[j])
		}
		s.Trimmed = true
	}
	s.End[i] = min(s.End[i], end)
}

// Hi is the position request i's delivered rows end at: Start+Count, or
// End when trimmed.
func (s *Step) Hi(i int) int32 {
	if s.Trimmed {
		return s.End[i]
	}
	return s.Start[i] + s.Count[i]
}

// Prefix is request i's hit prefix (0 when the step served none).
func (s *Step) Prefix(i int) int32 {
	if len(s.prefix) == 0 {
		return 0
	}
	return s.prefix[i]
}

// Find returns the step index of request id (-1 when the step has none).
func (s *Step) Find(id int64) int {
	n := len(s.IDs)
	for k := 0; k < n; k++ {
		i := s.lastQ + k
		if i >= n {
			i -= n
		}
		if s.IDs[i] == id {
			s.lastQ = i + 1
			return i
		}
	}
	return -1
}

// hitSlots returns the slots of request i's first pre hit rows (block size
// bs), expanded from the planned block ids into the step's scratch. The
// plan only copies the block ids (on the engine goroutine); the slots are
// worked out here, by the step's one reader (the committer for a prefetch,
// else the consumer), once per request.
func (s *Step) hitSlots(i, pre, bs int) []int32 {
	if s.immReq == i+1 && len(s.immSlot) >= pre {
		return s.immSlot[:pre]
	}
	lo := int(s.immOff[i])
	sl := slices.Grow(s.immSlot[:0], pre)[:pre]
	for j, b := range s.immBlk[lo : lo+(pre+bs-1)/bs] {
		row := sl[j*bs : min(pre, (j+1)*bs)]
		base := int32(b) * int32(bs)
		for t := range row {
			row[t] = base + int32(t)
		}
	}
	s.immSlot, s.immReq = sl, i+1
	return sl
}

// ReadsInto reports whether the step's hits are read into the engine's
// buffers (Plan.ResultInto) rather than the cache's.
func (s *Step) ReadsInto() bool { return len(s.into) > 0 }

// SetResultInto records the plan's Plan.ResultInto buffers (per key) for
// IntoClash. Engine goroutine, before the step is saved.
func (s *Step) SetResultInto(bufs [][]byte) { s.resultInto = append(s.resultInto[:0], bufs...) }

// IntoClash reports whether Materialize buffers bufs (per key; all: the
// whole step, in batch order) overlap the step's ResultInto buffers
// other than as key k's own buffer from its first byte for the whole step,
// where each request's rows are read in place: any other overlap would
// write rows over rows (a prefetched prefix, or the step's own rows Save
// put there) not read yet.
func (s *Step) IntoClash(bufs [][]byte, all bool) bool {
	for k, b := range bufs {
		for j, in := range s.resultInto {
			if !overlap(b, in) {
				continue
			}
			if !all || j != k || &b[0] != &in[0] {
				return true
			}
		}
	}
	return false
}

// overlap reports whether a and b share memory.
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}
