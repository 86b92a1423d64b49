//go:build cuda

package gpu

/*
#include <stdint.h>
#include <cuda.h>

static CUresult omni_stream_wait_event(void *stream, uintptr_t ev) {
	return cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0);
}
*/
import "C"

import "fmt"

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
