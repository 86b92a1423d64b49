package reader

import "github.com/omnicache/omnicache/internal/writer"

// Writes is what the read path needs of the write path (writer.Path; the
// reader's tests run against a fake): pin a snapshot of the slots a read
// will find, queue a read to run in order with the writes, wait for the
// writes a read joins, and copy rows still in a write. The read path reads
// the mirrors and the slot tables themselves through writer.Parts, and
// watches the committer through Parts.Progress.
type Writes interface {
	// Pin takes what a read of the hits' blocks (block ids, per hit) may
	// find into s: the newest write handed over (a block a newer one owns
	// was claimed since), the queue item a read of immediate rows joins,
	// and per deferred slot its occupancy word, with the clone of a row in
	// transit pinned in pins. Engine goroutine, behind the writes handed
	// over so far.
	Pin(hits [][]int32, pins *writer.Refs, s *writer.Snapshot)
	// PushRead queues r to run on the committer in queue order: after
	// every write queued before it landed and before any queued after it
	// (writer.InOrder). It returns r's queue sequence. Engine goroutine.
	PushRead(r writer.InOrder) uint64
	// WaitSeq waits, bounded, until the committer processed queue item seq
	// and everything before it, and returns the sticky write failure (a
	// wait that runs out is one).
	WaitSeq(seq uint64) error
	// ReadRows copies rows [r0, r0+cnt) of key k of write w, which the
	// caller pins, into out; a device copy that fails is the sticky
	// failure. With a batch a device copy is only issued: out holds the
	// rows once FinishReads(b) returned.
	ReadRows(w *writer.Write, k, r0, cnt int, out []byte, b *writer.ReadBatch) error
	// FinishReads waits for the device copies of batch b and ends its
	// reads; every read that passed b to ReadRows calls it.
	FinishReads(b *writer.ReadBatch) error
	// Unpin drops the pins of r (releasing the writes nothing else
	// references). Any goroutine.
	Unpin(r *writer.Refs)
	// Err is the sticky write failure (nil while none). Any goroutine.
	Err() error
}
