//go:build cuda

package gpu

// The CUDA driver API calls of the device, one thin cgo wrapper each: the
// C functions below call the driver (cuda.h maps the names to their _v2
// entry points), the Go functions turn a CUresult into an error with the
// driver's name and description of the code (cuError).

/*
#cgo LDFLAGS: -lcuda
#include <stdint.h>
#include <cuda.h>

static CUresult omni_init(void) { return cuInit(0); }
static CUresult omni_device_count(int *n) { return cuDeviceGetCount(n); }
static CUresult omni_device_get(CUdevice *d, int ordinal) { return cuDeviceGet(d, ordinal); }
static CUresult omni_primary_retain(CUcontext *c, CUdevice d) { return cuDevicePrimaryCtxRetain(c, d); }
static CUresult omni_primary_release(CUdevice d) { return cuDevicePrimaryCtxRelease(d); }
static CUresult omni_ctx_set(CUcontext c) { return cuCtxSetCurrent(c); }
static CUresult omni_stream_create(CUstream *s) { return cuStreamCreate(s, CU_STREAM_NON_BLOCKING); }
static CUresult omni_stream_sync(CUstream s) { return cuStreamSynchronize(s); }
static CUresult omni_stream_destroy(CUstream s) { return cuStreamDestroy(s); }
static CUresult omni_mem_alloc(CUdeviceptr *p, size_t n) { return cuMemAlloc(p, n); }
static CUresult omni_mem_free(CUdeviceptr p) { return cuMemFree(p); }
static CUresult omni_address_range(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	return cuMemGetAddressRange(base, size, p);
}
static CUresult omni_htod(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	return cuMemcpyHtoDAsync(dst, src, n, s);
}
static CUresult omni_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	return cuMemcpyDtoHAsync(dst, src, n, s);
}
static CUresult omni_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	return cuMemcpyDtoDAsync(dst, src, n, s);
}
static CUresult omni_memset8(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
	return cuMemsetD8Async(dst, v, n, s);
}
static CUresult omni_event_create(CUevent *e) { return cuEventCreate(e, CU_EVENT_DISABLE_TIMING); }
static CUresult omni_event_record(CUevent e, CUstream s) { return cuEventRecord(e, s); }
static CUresult omni_event_query(CUevent e) { return cuEventQuery(e); }
static CUresult omni_event_sync(CUevent e) { return cuEventSynchronize(e); }
static CUresult omni_event_destroy(CUevent e) { return cuEventDestroy(e); }
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"
)

type (
	cuDevice  = C.CUdevice
	cuContext = C.CUcontext
	cuStream  = C.CUstream
	cuEvent   = C.CUevent
)

// check is nil for CUDA_SUCCESS, else the driver's error.
func check(r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return cuError(int(r))
}

// isNotReady reports whether err is CUDA_ERROR_NOT_READY (an event or
// stream query whose work has not completed).
func isNotReady(err error) bool {
	var e *cudaError
	return errors.As(err, &e) && e.code == C.CUDA_ERROR_NOT_READY
}

// initStatus is the result of the process's cuInit, called once, at the
// first NewCUDA: a build with the cuda tag starts on a machine without a
// GPU or driver, and NewCUDA then fails with ErrNoDevice.
var initStatus = sync.OnceValue(func() error { return check(C.omni_init()) })

func deviceCount() (int, error) {
	var n C.int
	err := check(C.omni_device_count(&n))
	return int(n), err
}

func deviceGet(ordinal int) (cuDevice, error) {
	var d C.CUdevice
	err := check(C.omni_device_get(&d, C.int(ordinal)))
	return d, err
}

func primaryRetain(d cuDevice) (cuContext, error) {
	var c C.CUcontext
	err := check(C.omni_primary_retain(&c, d))
	return c, err
}

func primaryRelease(d cuDevice) error         { return check(C.omni_primary_release(d)) }
func ctxSetCurrent(c cuContext) error         { return check(C.omni_ctx_set(c)) }
func streamSync(s cuStream) error             { return check(C.omni_stream_sync(s)) }
func streamDestroy(s cuStream) error          { return check(C.omni_stream_destroy(s)) }
func memFree(p uintptr) error                 { return check(C.omni_mem_free(C.CUdeviceptr(p))) }
func eventRecord(e cuEvent, s cuStream) error { return check(C.omni_event_record(e, s)) }
func eventQuery(e cuEvent) error              { return check(C.omni_event_query(e)) }
func eventSync(e cuEvent) error               { return check(C.omni_event_sync(e)) }
func eventDestroy(e cuEvent) error            { return check(C.omni_event_destroy(e)) }

// streamCreate makes a non-blocking stream (no implicit synchronization
// with the legacy default stream).
func streamCreate() (cuStream, error) {
	var s C.CUstream
	err := check(C.omni_stream_create(&s))
	return s, err
}

// streamPtr is the raw CUstream of s, for the shim's functions that take
// it as a void pointer.
func streamPtr(s cuStream) unsafe.Pointer { return unsafe.Pointer(s) }

func memAlloc(n int) (uintptr, error) {
	var p C.CUdeviceptr
	err := check(C.omni_mem_alloc(&p, C.size_t(n)))
	return uintptr(p), err
}

// addressRange is the base and size of the device allocation holding p.
func addressRange(p uintptr) (base uintptr, size int, err error) {
	var b C.CUdeviceptr
	var n C.size_t
	err = check(C.omni_address_range(&b, &n, C.CUdeviceptr(p)))
	return uintptr(b), int(n), err
}

func copyHtoD(dst uintptr, src unsafe.Pointer, n int, s cuStream) error {
	return check(C.omni_htod(C.CUdeviceptr(dst), src, C.size_t(n), s))
}

func copyDtoH(dst unsafe.Pointer, src uintptr, n int, s cuStream) error {
	return check(C.omni_dtoh(dst, C.CUdeviceptr(src), C.size_t(n), s))
}

func copyDtoD(dst, src uintptr, n int, s cuStream) error {
	return check(C.omni_dtod(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s))
}

func memsetD8(dst uintptr, v byte, n int, s cuStream) error {
	return check(C.omni_memset8(C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), s))
}

// eventCreate makes an event without timing (the cheapest to record).
func eventCreate() (cuEvent, error) {
	var e C.CUevent
	err := check(C.omni_event_create(&e))
	return e, err
}
