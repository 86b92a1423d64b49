package omnicache

import (
	"fmt"
	"strings"
	"time"

	"github.com/omnicache/omnicache/internal/errs"
)

// Errors returned by the cache. Every one is wrapped with the details of the
// case (request id, key, step id, counts) via fmt.Errorf("...: %w"), so test
// with errors.Is. A call that returns any of them changes nothing, except
// ErrWriteFailed, which is sticky by design: once a write failed, every
// later call returns it (Close still releases everything).
var (
	// ErrConfig: a bad Config (zero blocks or block size, zero row bytes,
	// no keys, duplicate key names, negative sizes, or sizes beyond the
	// limits documented on Config).
	ErrConfig = errs.Config
	// ErrClosed: the cache was closed.
	ErrClosed = errs.Closed
	// ErrSequence: the engine contract's order was broken (Save without
	// Begin, Begin twice without Save).
	ErrSequence = errs.Sequence
	// ErrPlan: the step plan is inconsistent (slice lengths disagree, a
	// request scheduled twice, an arrival listed twice, a fresh arrival
	// scheduled from a position other than its hit length, a negative
	// position or count, a row outside the block table, a table narrower
	// than a scheduled position needs, a block id beyond NumBlocks).
	ErrPlan = errs.Plan
	// ErrUnalignedHit: an arrival's hit_tokens is not a multiple of the
	// block size.
	ErrUnalignedHit = errs.UnalignedHit
	// ErrHitBlocks: an arrival with hit_tokens > 0 does not carry
	// hit_tokens/block_size block ids (or block ids are left over).
	ErrHitBlocks = errs.HitBlocks
	// ErrTokenCount: the outputs' token count differs from the tokens the
	// plan scheduled.
	ErrTokenCount = errs.TokenCount
	// ErrOutputs: the outputs do not fit the begun step: nil outputs, a
	// tensor count other than the keys', a tensor too small for the step's
	// tokens (too few rows or bytes), a required key omitted, or accepted
	// counts of another length or outside [0, Count]; also a nil Result
	// (Materialize) or a buffer too small (Peek). The message names which.
	ErrOutputs = errs.Outputs
	// ErrStepTooLarge: a step schedules more tokens than one staging page
	// holds (Begin rejects it before sizing anything from it).
	ErrStepTooLarge = errs.StepTooLarge
	// ErrStagingTimeout: no staging page became free within
	// Config.StagingClaimTimeout. The error is a *StagingTimeoutError
	// naming the unconsumed step ids (errors.As).
	ErrStagingTimeout = errs.StagingTimeout
	// ErrUnknownStep: Materialize or Discard of a step id that was never
	// returned by Save or was already consumed.
	ErrUnknownStep = errs.UnknownStep
	// ErrNotInStep: Materialize named a request that the step did not save.
	ErrNotInStep = errs.NotInStep
	// ErrAbsentRequired: a hit covers rows of a required key that were
	// never written. Never served as a miss.
	ErrAbsentRequired = errs.AbsentRequired
	// ErrReassigned: a delayed read found that the hit's slots were given
	// to another tenant after the read was planned (or the write it
	// planned to read skipped them for a newer one). Never served as the
	// new tenant's rows. With prefetch (the default) only a step that did
	// not fit Config.ReadAheadBytes can meet it.
	ErrReassigned = errs.Reassigned
	// ErrReset: the step was saved before Cache.Reset dropped every row:
	// Materialize consumes it (its page and pins go back) and serves
	// nothing.
	ErrReset = errs.Reset
	// ErrBudget: a device reservation cannot be met: it is larger than the
	// whole device byte budget, or what is still charged after every pending
	// write was forced out is pinned by steps not consumed yet (a step keeps
	// the device clones its rows and hit reads come from until Materialize
	// or Discard, the hit a resume registered included when a later step
	// serves it; size the budget for the steps an engine leaves unconsumed).
	ErrBudget = errs.Budget
	// ErrWriteFailed: a device copy or write failed. Sticky.
	ErrWriteFailed = errs.WriteFailed
	// ErrDeviceTimeout: a wait on the committer ran past
	// Config.WaitTimeout (the device never completed a copy). Wrapped in
	// the sticky ErrWriteFailed; Close returns it when it could not stop
	// the committer or a call in flight in time.
	ErrDeviceTimeout = errs.DeviceTimeout
)

// StagingTimeoutError is the error of a Save that found no free staging
// page within Config.StagingClaimTimeout. errors.Is(err,
// ErrStagingTimeout) holds; errors.As gives the details.
type StagingTimeoutError struct {
	// Depth is the number of staging pages; Waited how long the Save
	// waited for one (0 with NoWait).
	Depth  int
	Waited time.Duration
	// Unconsumed are the saved step ids not yet materialized or discarded
	// when the Save gave up, oldest first: the engine must consume them.
	Unconsumed []StepID
}

func (e *StagingTimeoutError) Error() string {
	ids := make([]string, len(e.Unconsumed))
	for i, id := range e.Unconsumed {
		ids[i] = fmt.Sprint(uint64(id))
	}
	return fmt.Sprintf("%v: %d pages held after %v; unconsumed step ids: [%s]",
		ErrStagingTimeout, e.Depth, e.Waited, strings.Join(ids, " "))
}

// Unwrap makes errors.Is(err, ErrStagingTimeout) hold.
func (e *StagingTimeoutError) Unwrap() error { return ErrStagingTimeout }

// RequestError is the error of a Materialize that served some of the
// requests asked for and not others: the Result holds every request, the
// served ones' rows exact, the failed ones' rows zero with Result.Err
// naming the cause. The step is consumed. errors.Is matches each failed
// request's cause (ErrAbsentRequired, ErrReassigned).
type RequestError struct {
	Step StepID
	// IDs are the failed requests, Errs their causes.
	IDs  []int64
	Errs []error
}

func (e *RequestError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d: %d of the requests asked were not served", uint64(e.Step), len(e.IDs))
	for _, err := range e.Errs {
		b.WriteString("; ")
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap gives the failed requests' causes (errors.Is, errors.As).
func (e *RequestError) Unwrap() []error { return e.Errs }
