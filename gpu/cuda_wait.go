//go:build cuda

package gpu

/*
#include <stdint.h>
#include <cuda.h>

static CUresult omni_stream_wait_event(void *stream, uintptr_t ev) {
	return cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0);
}

// Records ev on the caller's stream other, then makes stream wait for it.
static CUresult omni_stream_wait_stream(void *stream, uintptr_t other, uintptr_t ev) {
	CUresult r = cuEventRecord((CUevent)ev, (CUstream)other);
	if (r != CUDA_SUCCESS)
		return r;
	return cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// WaitExternal makes the device's stream wait for ev, a CUevent (its
// handle as an integer) that the caller recorded on its own stream after
// the work producing a tensor it hands to the cache: everything issued on
// the device's stream afterwards (a Save's clones and copies of that
// tensor) starts once ev completed. The host does not wait. The event must
// belong to the device's context (the primary context, as PyTorch's
// events do). 0 waits for nothing. The C ABI calls it before Save for
// every CUDA tensor that carries an event.
func (d *CUDA) WaitExternal(ev uintptr) error {
	if ev == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: wait for an external event: %w", ErrCopy, err)
	}
	defer d.leave()
	if r := C.omni_stream_wait_event(streamPtr(d.stream), C.uintptr_t(ev)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("%w: cuStreamWaitEvent: %w", ErrCopy, cuError(int(r)))
	}
	return nil
}

// WaitStream makes the device's stream wait for the work issued so far on
// stream, a CUstream of the caller's in the device's context (its handle
// as an integer; 0 is the NULL stream): everything issued on the device's
// stream afterwards starts once that work completed. The host does not
// wait. It records one of the device's events on stream for it: a
// stream's wait takes the event's state when it is enqueued, so the event
// is reused.
func (d *CUDA) WaitStream(stream uintptr) error {
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: wait for a stream: %w", ErrCopy, err)
	}
	defer d.leave()
	d.evMu.Lock()
	defer d.evMu.Unlock()
	if d.streamEv == nil {
		ev, err := eventCreate()
		if err != nil {
			return fmt.Errorf("%w: cuEventCreate: %w", ErrCopy, err)
		}
		d.streamEv = ev
	}
	if r := C.omni_stream_wait_stream(streamPtr(d.stream), C.uintptr_t(stream), C.uintptr_t(uintptr(unsafe.Pointer(d.streamEv)))); r != C.CUDA_SUCCESS {
		return fmt.Errorf("%w: waiting for stream %#x: %w", ErrCopy, stream, cuError(int(r)))
	}
	return nil
}
