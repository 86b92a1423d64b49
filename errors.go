package omnicache

import "errors"

// Errors returned by the cache. Every one is wrapped with the details of the
// case (request id, key, step id, counts) via fmt.Errorf("...: %w"), so test
// with errors.Is. All of them leave the cache usable except ErrWriteFailed,
// which is sticky by design: once a write failed, every later call returns it.
var (
	// ErrConfig: a bad Config (zero blocks or block size, zero row bytes,
	// no keys, duplicate key names, negative sizes).
	ErrConfig = errors.New("omnicache: bad config")
	// ErrClosed: the cache was closed.
	ErrClosed = errors.New("omnicache: cache closed")
	// ErrSequence: the engine contract's order was broken (Save without
	// Begin, Begin twice without Save).
	ErrSequence = errors.New("omnicache: call out of sequence")
	// ErrPlan: the step plan is inconsistent (slice lengths disagree, a
	// request scheduled twice, a negative position, a row outside the block
	// table, a table narrower than a scheduled position needs).
	ErrPlan = errors.New("omnicache: inconsistent step plan")
	// ErrUnalignedHit: an arrival's hit_tokens is not a multiple of the
	// block size.
	ErrUnalignedHit = errors.New("omnicache: hit not block aligned")
	// ErrHitBlocks: an arrival with hit_tokens > 0 does not carry
	// hit_tokens/block_size block ids (or block ids are left over).
	ErrHitBlocks = errors.New("omnicache: hit without its block ids")
	// ErrTokenCount: the outputs' token count differs from the tokens the
	// plan scheduled.
	ErrTokenCount = errors.New("omnicache: slot count differs from scheduled tokens")
	// ErrOutputs: an output tensor has fewer rows than the step's tokens,
	// is too short for its rows, or the tensor count differs from the keys.
	ErrOutputs = errors.New("omnicache: output tensor too small")
	// ErrStepTooLarge: a step has more tokens than one staging page holds.
	ErrStepTooLarge = errors.New("omnicache: step larger than a staging page")
	// ErrStagingTimeout: no staging page became free within
	// Config.StagingClaimTimeout; the error names the unconsumed step ids.
	ErrStagingTimeout = errors.New("omnicache: timed out waiting for a staging page")
	// ErrUnknownStep: Materialize or Discard of a step id that was never
	// returned by Save or was already consumed.
	ErrUnknownStep = errors.New("omnicache: unknown or already consumed step id")
	// ErrNotInStep: Materialize named a request that the step did not save.
	ErrNotInStep = errors.New("omnicache: request outside the step's snapshot")
	// ErrAbsentRequired: a hit covers rows of a required key that were
	// never written. Never served as a miss.
	ErrAbsentRequired = errors.New("omnicache: hit over absent rows of a required key")
	// ErrReassigned: a delayed read found that the hit's slots were given
	// to another tenant after the read was planned.
	ErrReassigned = errors.New("omnicache: hit slots reassigned before the read")
	// ErrBudget: a device reservation cannot be met: it is larger than the
	// whole device byte budget, or what is still charged after every pending
	// write was forced out is pinned by steps not consumed yet (a step keeps
	// the device clones its rows and hit reads come from until Materialize
	// or Discard; size the budget for the steps an engine leaves unconsumed).
	ErrBudget = errors.New("omnicache: reservation larger than the device byte budget")
	// ErrWriteFailed: a device copy or write failed. Sticky.
	ErrWriteFailed = errors.New("omnicache: write failed")
)
