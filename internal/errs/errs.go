// Package errs owns the cache's error values: the sentinels the root
// package re-exports (omnicache.ErrX is errs.X, the same value, so
// errors.Is matches either). The
// write path (writer) and the read path (read) return them without
// importing the root package.
package errs

import "errors"

// Sentinels; the root package documents each one.
var (
	Config         = errors.New("omnicache: bad config")
	Closed         = errors.New("omnicache: cache closed")
	Sequence       = errors.New("omnicache: call out of sequence")
	Plan           = errors.New("omnicache: inconsistent step plan")
	UnalignedHit   = errors.New("omnicache: hit not block aligned")
	HitBlocks      = errors.New("omnicache: hit without its block ids")
	TokenCount     = errors.New("omnicache: slot count differs from scheduled tokens")
	Outputs        = errors.New("omnicache: bad outputs")
	StepTooLarge   = errors.New("omnicache: step larger than a staging page")
	StagingTimeout = errors.New("omnicache: timed out waiting for a staging page")
	UnknownStep    = errors.New("omnicache: unknown or already consumed step id")
	NotInStep      = errors.New("omnicache: request outside the step's snapshot")
	AbsentRequired = errors.New("omnicache: hit over absent rows of a required key")
	Reassigned     = errors.New("omnicache: hit slots reassigned before the read")
	Reset          = errors.New("omnicache: the step was saved before a Reset dropped its rows")
	Budget         = errors.New("omnicache: reservation larger than the device byte budget")
	WriteFailed    = errors.New("omnicache: write failed")
	DeviceTimeout  = errors.New("omnicache: device work did not complete within the wait bound")
)
