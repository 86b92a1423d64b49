package writer

import (
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/gpu"
)

// Write is a pending write of rows into the mirror; write ids are never
// reused (they order writes and defeat ABA on slot reuse). It is one of:
//
//   - an immediate write: the rows of every immediate key of one step, or of
//     up to block_size pure-decode steps parked by the decode buffer. Row r
//     (step r/N) of immediate key ki is in Host[(r/N)*nimm+ki] (a staging
//     page region or an owned host tensor) or, for device rows parked by the
//     decode buffer, in Dev[...] until the flush copies them to Staged[...];
//   - a deferred clone: one step's rows of one deferred key, kept on the
//     device (Buf) until the requests that own runs of it finish.
//
// The cache fills a Write before publishing it under its state lock; after
// that the fields are read-only except those documented as guarded by the
// state lock. Owners counts pending writes of its rows (the cache's lookup
// entry lives while > 0); Pins counts step records and readers. It is
// released when both are 0, under the state lock. Pins changes under the
// lock too, with two exceptions that never let it reach 0 outside it: the
// engine pins the open decode buffer write (which the buffer owns, Owners
// 1, until the engine flushes it) in park, and Unpin drops a pin that is
// not the last with a compare-and-swap (unpinFast). A decode step then
// takes the lock neither to park nor to be discarded.
type Write struct {
	ID       uint64
	Seq      uint64 // committer queue sequence once handed over (immediate)
	Deferred bool
	Owners   int32        // state lock
	Pins     atomic.Int32 // state lock, but see above

	// immediate
	N      int // rows per parked step
	Steps  int // steps parked (1 for a plain step)
	Page   *Page
	Host   [][]byte
	Dev    []gpu.Buffer
	Staged [][]byte
	// Absent[(r/N)*nimm+ki]: that step omitted immediate key ki (nothing
	// staged; the committer records the slots absent). NAbsent counts
	// them: 0 lets the committer skip the column.
	Absent  []bool
	NAbsent int
	// Slots is the slot of every row: of an immediate write, parked step
	// j's rows are Slots[j*N : (j+1)*N] (at the same offsets in its staged
	// rows); of a deferred clone, its rows in clone order.
	Slots []int32
	// Reject marks the rows of rejected draft tokens (Step.Accepted) of
	// a one-step write: the committer writes them nowhere and their slots
	// turn stale. Empty: none.
	Reject []bool
	Owned  [][]byte // owned host tensors, handed back when the write is released
	Charge int64    // bytes released with the write
	// Pub are full blocks (their keys in PubKeys) whose rows are all
	// committed once this write landed: the committer gathers them then
	// (Config.Rider, Config.Gather).
	Pub     []int32
	PubKeys []uint64

	// Device rows (of a step, or parked by the decode buffer) are read by
	// Materialize from the device until the committer copied them to
	// Staged; it then releases them (and DevCharge, the bytes of the
	// cache's clones among them). Guarded by the state lock.
	DevLive    bool
	DevReads   int32
	DevRelease bool
	DevCharge  int64
	// CopyLate: the write has device rows; their device→host copies (Dev
	// into Staged) are the committer's to issue, not the engine
	// goroutine's (see Path.writeStep and Path.flushBuffer).
	CopyLate bool
	// Direct: a one-step write whose device rows the committer copies
	// straight into the mirror (Config.Direct), never into Staged: they
	// stay live on the device, where every read of the write's rows takes
	// them (Materialize, a hit read while the write is in flight), until
	// the write is released.
	Direct bool
	// lateEv is the event after the late copies once they were issued
	// ahead of the write's turn (lateIssued): by the committer
	// (issueAhead), or by Save before the hand-over for a large step whose
	// clones it waits for (writeStep); then the committer's only.
	lateEv     gpu.Event
	lateIssued bool
	lateT0     time.Time // when the late copies were issued (Hists on)

	// deferred clone
	Key int
	Buf gpu.Buffer
	Own bool // Buf is the engine's owned tensor
}

// Task is one unit of committer work: an immediate write (W; its device
// rows, if any, copied by the committer), deferred runs (Segs), or in-order
// work (R).
type Task struct {
	W    *Write
	Ev   gpu.Event // a write of host rows only: the event its Save recorded
	Segs []Seg
	R    InOrder
}

// InOrder is work the committer runs in queue order, after every write
// queued before it landed and before any write queued after it: a hit read
// that must find exactly the rows the earlier writes left (the read path's
// prefetch). A newer write's rows never make an older write skip slots
// across it (see Committer.scanQueued), so the rows it reads are the
// planned ones. failed reports the path's sticky failure (the work reports
// it instead of copying).
type InOrder interface {
	RunInOrder(failed bool)
}

// Seg is a run of a deferred clone's rows.
type Seg struct {
	W   *Write
	Off int32
	N   int32
}
