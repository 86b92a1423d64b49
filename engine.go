// The engine goroutine's state: the live request table, the begun step
// and Begin's scratch. Begin, Save, Sync, Reset and Close use it, on the
// engine goroutine only.

package omnicache

import (
	"unsafe"

	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// request flags (soa.Requests.Flags)
const (
	flagHitPending = 1
	// flagFloor: the request was preempted and has not yet been saved
	// past the length it had then (preLen): its steps may recompute rows
	// it already delivered, which Materialize leaves out.
	flagFloor = 2
)

// engine is the engine goroutine's view of the step: the live request
// table and the begun step. Only Begin, Save, Sync and Close touch it.
type engine struct {
	reqs     *soa.Requests
	begun    bool
	nextStep StepID

	// the begun step
	ids   []int64
	h     []soa.Handle
	count []int32
	start []int32
	same  bool // the batch is the previous step's

	// lens are, by handle, the positions each request's saved steps cover
	// (what a replace may cut back); lenPending decode steps over the
	// batch lenH are not in them yet (see noteSaved).
	lens       []int32
	lenH       []soa.Handle
	lenPending int32

	// dlp is, by handle, the live request's delivery state (delivery.go);
	// batchD the begun batch's, an array shared by the records of the
	// steps over this batch (replaced, never reused, when the batch
	// changes). preLen is, by handle, the length a preempted request had
	// (flagFloor); nFloor counts those requests.
	dlp    []*delivery
	batchD []*delivery
	preLen []int32
	nFloor int
	slots  []int32
	ntok   int
	pure   bool
	hitReq []int32      // positions in the batch of requests whose hit prefix is served this step
	fresh  []soa.Handle // requests this Begin added (removed again if the step fails)
	// finished are the handles of the requests this Begin finished (their
	// deferred rows go to the write path).
	finished []soa.Handle
	undo     undoLog // what this Begin changed (undo.go)

	prevIDs   []int64
	prevH     []soa.Handle // handles of prevIDs (h aliases it while the ids stay the same)
	hbuf      []soa.Handle // spare for the next change of ids
	stamp     []uint64     // per handle: last Begin that marked it (duplicate check)
	stampGen  uint64
	unknown   []int64      // scratch: batch ids not live (duplicate check)
	chk       []soa.Handle // scratch: checkIDs' handle per batch id (NoHandle: not live then)
	arrived   []int64      // scratch: arrival ids (duplicate check)
	starts    []idStart    // scratch: fresh batch requests by id
	hits      []reader.Hit // the begun step's hits (planned at Begin)
	rec       *reader.Step // the begun step's record when made at Begin (a hit step, prefetch on)
	planned   bool         // rec's hits were planned (and their read queued) at Begin
	blockMark []uint32     // scratch: per block, the markGen of the last hitsOverlapStep
	markGen   uint32
	// blocks are the blocks the begun step writes, one per block a request
	// writes in, when the step is long (validate reads them off the block
	// table); nil for a short step (its slots are few).
	blocks []int32
	blkBuf []int32 // blocks' memory
}

type idStart struct {
	id    int64
	start int32
}

func (e *engine) mark(h soa.Handle, gen uint64) (was uint64) {
	e.stamp = scratch.Extend(e.stamp, int(h)+1)
	was, e.stamp[h] = e.stamp[h], gen
	return was
}

// equalIDs is slices.Equal for request ids, as one memequal over the
// bytes (the runtime's vectorised compare: a decode batch of hundreds of
// ids is compared every step).
func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	ab := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), len(a)*8)
	bb := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b)*8)
	return string(ab) == string(bb) // no conversion: compared in place
}
