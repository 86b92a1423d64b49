// The ABI's error codes: one per Go sentinel, and the message buffer.

package main

/*
#include <stdint.h>
#include "omnicache.h"

void ocgo_c_set_steps(const uint64_t *ids, int64_t n); // abi.c
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/tier"
)

// ---- errors ----

var (
	errArgument    = errors.New("omnicache: bad argument")
	errShortBuffer = errors.New("omnicache: result buffers too small")
	errUnsupported = errors.New("omnicache: not supported by this build")
	errPanic       = errors.New("omnicache: panic in the library")
)

// codes maps every error the ABI returns to its stable code; the first
// match wins (a sticky write failure before the device timeout it wraps).
var codes = []struct {
	err  error
	code C.int
}{
	{omnicache.ErrWriteFailed, C.OMNICACHE_ERR_WRITE_FAILED},
	{omnicache.ErrConfig, C.OMNICACHE_ERR_CONFIG},
	{omnicache.ErrClosed, C.OMNICACHE_ERR_CLOSED},
	{omnicache.ErrSequence, C.OMNICACHE_ERR_SEQUENCE},
	{omnicache.ErrPlan, C.OMNICACHE_ERR_PLAN},
	{omnicache.ErrUnalignedHit, C.OMNICACHE_ERR_UNALIGNED_HIT},
	{omnicache.ErrHitBlocks, C.OMNICACHE_ERR_HIT_BLOCKS},
	{omnicache.ErrTokenCount, C.OMNICACHE_ERR_TOKEN_COUNT},
	{omnicache.ErrOutputs, C.OMNICACHE_ERR_OUTPUTS},
	{omnicache.ErrStepTooLarge, C.OMNICACHE_ERR_STEP_TOO_LARGE},
	{omnicache.ErrStagingTimeout, C.OMNICACHE_ERR_STAGING_TIMEOUT},
	{omnicache.ErrUnknownStep, C.OMNICACHE_ERR_UNKNOWN_STEP},
	{omnicache.ErrNotInStep, C.OMNICACHE_ERR_NOT_IN_STEP},
	{omnicache.ErrAbsentRequired, C.OMNICACHE_ERR_ABSENT_REQUIRED},
	{omnicache.ErrReassigned, C.OMNICACHE_ERR_REASSIGNED},
	{omnicache.ErrBudget, C.OMNICACHE_ERR_BUDGET},
	{omnicache.ErrDeviceTimeout, C.OMNICACHE_ERR_DEVICE_TIMEOUT},
	{omnicache.ErrTierMiss, C.OMNICACHE_ERR_TIER_MISS},
	{omnicache.ErrReset, C.OMNICACHE_ERR_RESET},
	{omnicache.ErrNotPublished, C.OMNICACHE_ERR_NOT_PUBLISHED}, // before the store's error it may wrap
	{tier.ErrCircuitOpen, C.OMNICACHE_ERR_TIER_CIRCUIT_OPEN},   // before ErrUnavailable, which it wraps
	{tier.ErrUnavailable, C.OMNICACHE_ERR_TIER_UNAVAILABLE},
	{tier.ErrAuth, C.OMNICACHE_ERR_TIER_AUTH},
	{tier.ErrConfig, C.OMNICACHE_ERR_TIER_CONFIG},
	{tier.ErrClosed, C.OMNICACHE_ERR_TIER_CLOSED},
	{tier.ErrMiss, C.OMNICACHE_ERR_TIER_MISS},
	{tier.ErrCorrupt, C.OMNICACHE_ERR_TIER_MISS}, // a corrupt value is a miss
	{errArgument, C.OMNICACHE_ERR_ARGUMENT},
	{errBadHandle, C.OMNICACHE_ERR_BAD_HANDLE},
	{errShortBuffer, C.OMNICACHE_ERR_SHORT_BUFFER},
	{errPanic, C.OMNICACHE_ERR_PANIC},
	{errUnsupported, C.OMNICACHE_ERR_UNSUPPORTED},
	{gpu.ErrNoCUDA, C.OMNICACHE_ERR_UNSUPPORTED},
	{gpu.ErrNoDevice, C.OMNICACHE_ERR_NO_DEVICE},
	{context.DeadlineExceeded, C.OMNICACHE_ERR_WAIT_TIMEOUT}, // a call's own bound (omnicache_wait_published)
}

func code(err error) C.int {
	if err == nil {
		return C.OMNICACHE_OK
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return C.OMNICACHE_ERR_INTERNAL
}

// msgBuf is the calling thread's message buffer (abi.c).
type msgBuf struct {
	p   *C.char
	cap C.int64_t
	n   *C.int64_t
}

// fail stores err's message and its step ids (a staging timeout's
// unconsumed steps, omnicache_last_error_steps) and returns its code.
func (m msgBuf) fail(err error) C.int {
	if err == nil {
		return C.OMNICACHE_OK
	}
	setSteps(err)
	s := err.Error()
	if m.p != nil && m.cap > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(m.p)), int(m.cap))
		n := copy(dst[:len(dst)-1], s)
		dst[n] = 0
	}
	if m.n != nil {
		*m.n = C.int64_t(len(s))
	}
	return code(err)
}

// setSteps stores the step ids err names as the calling thread's last
// error's (none for an error that names none). Called on the thread of the
// failing call (a call from C runs on its caller's thread).
func setSteps(err error) {
	var te *omnicache.StagingTimeoutError
	if !errors.As(err, &te) || len(te.Unconsumed) == 0 {
		C.ocgo_c_set_steps(nil, 0)
		return
	}
	ids := make([]uint64, len(te.Unconsumed))
	for i, id := range te.Unconsumed {
		ids[i] = uint64(id)
	}
	C.ocgo_c_set_steps((*C.uint64_t)(unsafe.Pointer(&ids[0])), C.int64_t(len(ids)))
}

// recoverInto turns a panic into OMNICACHE_ERR_PANIC (deferred by every
// export).
func (m msgBuf) recoverInto(rc *C.int) {
	if r := recover(); r != nil {
		*rc = m.fail(fmt.Errorf("%w: %v", errPanic, r))
	}
}
