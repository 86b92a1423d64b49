// The engine goroutine's state: the live request table, the begun step
// and Begin's scratch. Begin, Save, Sync, Reset and Close use it, on the
// engine goroutine only.

package omnicache

import (
	"unsafe"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// request flags (soa.Requests.Flags)
const (
	flagHitPending = 1
	// flagFloor: the request was preempted and has not yet been saved
	// past the length it had then (preemptLen): its steps may recompute rows
	// it already delivered, which Materialize leaves out.
	flagFloor = 2
)

// engineState is what the cache keeps on the engine goroutine: the live
// request table and the begun step, and Begin's scratch. Only Begin, Save,
// Abort, Sync, Reset and Close touch it.
type engineState struct {
	requests *soa.Requests
	begun    bool
	nextStep StepID

	// the begun step, batch order: request ids, handles, scheduled tokens
	// and first scheduled positions
	ids       []int64
	handles   []soa.Handle
	counts    []int32
	starts    []int32
	sameBatch bool // the batch is the previous step's

	// savedLen is, by handle, the positions each request's saved steps
	// cover (what a replace may cut back); decodeSteps decode steps over
	// decodeBatch (handles) are not in it yet (see noteSaved).
	savedLen    []int32
	decodeBatch []soa.Handle
	decodeSteps int32

	// delivered is, by handle, the live request's delivery (delivery.go);
	// batchDelivered the begun batch's, an array shared by the steps over
	// this batch (replaced, never reused, when the batch changes).
	// preemptLen is, by handle, the length a preempted request had
	// (flagFloor); floors counts those requests.
	delivered      []*delivery
	batchDelivered []*delivery
	preemptLen     []int32
	floors         int

	slots      []int32 // the begun step's slots, its tokens' in batch order
	tokens     int
	pureDecode bool         // every request decodes one token, nothing arrives or leaves
	hitPos     []int32      // positions in the batch of requests whose hit prefix is served this step
	added      []soa.Handle // requests this Begin added (removed again if the step fails)
	// finished are the handles of the requests this Begin finished (their
	// deferred rows go to the write path).
	finished []soa.Handle
	undo     undoLog // what this Begin changed (undo.go)

	prevIDs      []int64
	prevHandles  []soa.Handle // handles of prevIDs (handles aliases it while the ids stay the same)
	spareHandles []soa.Handle // spare for the next change of ids

	// checkIDs' scratch (duplicates, arrivals' starts)
	seen          []uint64 // per handle: the last Begin that saw it (seenGen)
	seenGen       uint64
	notLive       []int64      // batch ids not live
	liveHandles   []soa.Handle // per batch id: its handle (NoHandle: not live then)
	arrivalIDs    []int64
	notLiveStarts []idStart // batch requests not live, by id

	hits        []reader.Hit // the begun step's hits (planned at Begin)
	hitRec      *reader.Step // the begun step's record when made at Begin (a hit step, prefetch on)
	hitsPlanned bool         // hitRec's hits were planned (and their read queued) at Begin
	resultInto  [][]byte     // the begun step's Plan.ResultInto buffers
	into        [][]byte     // their regions for the step's own rows (intoForSave)
	resultDev   []gpu.Buffer // the begun step's Plan.ResultDev buffers (empty: none, or too small)
	devOff      []int32      // per request: its first own row in resultDev (saveDev's scratch)
	blockMark   []uint32     // scratch: per block, the blockGen of the last hitsOverlapStep
	blockGen    uint32
	// stepBlocks are the blocks the begun step writes, one per block a
	// request writes in, when the step is long (validate reads them off
	// the block table); nil for a short step (its slots are few).
	stepBlocks   []int32
	stepBlockBuf []int32 // stepBlocks' memory
}

type idStart struct {
	id    int64
	start int32
}

// markSeen records that gen saw handle h and returns the gen that saw it
// before.
func (e *engineState) markSeen(h soa.Handle, gen uint64) (was uint64) {
	e.seen = scratch.Extend(e.seen, int(h)+1)
	was, e.seen[h] = e.seen[h], gen
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
