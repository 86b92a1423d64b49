//go:build cuda

package gpu

// The rest of the cgo shim: the device's stream-ordered memory pool and
// CUDA error texts (the plain driver calls are in cuda_driver.go).

/*
#cgo LDFLAGS: -lcuda
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cuda.h>

// omni_error_text writes "NAME: description" of r into buf.
static void omni_error_text(CUresult r, char *buf, size_t n) {
	const char *name = NULL, *desc = NULL;
	cuGetErrorName(r, &name);
	cuGetErrorString(r, &desc);
	snprintf(buf, n, "%s: %s", name ? name : "CUDA_ERROR_UNKNOWN_CODE", desc ? desc : "unrecognized error code");
}

static int omni_pools_supported(int ordinal) {
	int v = 0;
	if (cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, (CUdevice)ordinal) != CUDA_SUCCESS) {
		return 0;
	}
	return v;
}

// omni_pool_create makes a private device memory pool that keeps freed
// memory for reuse (release threshold: unlimited; memory goes back to the
// driver when the pool is destroyed).
static CUresult omni_pool_create(int ordinal, CUmemoryPool *pool) {
	CUmemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = ordinal;
	CUresult r = cuMemPoolCreate(pool, &props);
	if (r != CUDA_SUCCESS) {
		return r;
	}
	cuuint64_t thr = UINT64_MAX;
	r = cuMemPoolSetAttribute(*pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
	if (r != CUDA_SUCCESS) {
		cuMemPoolDestroy(*pool);
	}
	return r;
}

static CUresult omni_pool_alloc(CUdeviceptr *p, size_t n, CUmemoryPool pool, void *stream) {
	return cuMemAllocFromPoolAsync(p, n, pool, (CUstream)stream);
}

static CUresult omni_free_async(CUdeviceptr p, void *stream) {
	return cuMemFreeAsync(p, (CUstream)stream);
}

static CUresult omni_pool_destroy(CUmemoryPool pool) { return cuMemPoolDestroy(pool); }
*/
import "C"

import "fmt"

// cudaError is a CUDA driver error code with its name and description.
type cudaError struct {
	code int
	text string
}

func (e *cudaError) Error() string { return fmt.Sprintf("%s (%d)", e.text, e.code) }

// cuError converts a CUresult (non-zero) to an error carrying the driver's
// name and description of the code.
func cuError(code int) error {
	var buf [256]C.char
	C.omni_error_text(C.CUresult(code), &buf[0], C.size_t(len(buf)))
	return &cudaError{code: code, text: C.GoString(&buf[0])}
}

func poolsSupported(ordinal int) bool { return C.omni_pools_supported(C.int(ordinal)) != 0 }

type memPool struct{ p C.CUmemoryPool }

func poolCreate(ordinal int) (memPool, error) {
	var p C.CUmemoryPool
	if r := C.omni_pool_create(C.int(ordinal), &p); r != C.CUDA_SUCCESS {
		return memPool{}, cuError(int(r))
	}
	return memPool{p}, nil
}

func (m memPool) destroy() error {
	if r := C.omni_pool_destroy(m.p); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}

func (m memPool) alloc(n int, s cuStream) (uintptr, error) {
	var p C.CUdeviceptr
	if r := C.omni_pool_alloc(&p, C.size_t(n), m.p, streamPtr(s)); r != C.CUDA_SUCCESS {
		return 0, cuError(int(r))
	}
	return uintptr(p), nil
}

func freeAsync(p uintptr, s cuStream) error {
	if r := C.omni_free_async(C.CUdeviceptr(p), streamPtr(s)); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}
