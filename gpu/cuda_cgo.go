//go:build cuda

package gpu

// The rest of the cgo shim: the cuInit guard, the device's stream-ordered
// memory pool (gorgonia.org/cu v0.9.6 has no memory-pool calls) and CUDA
// error texts.

/*
#cgo CFLAGS: -D_GNU_SOURCE
#cgo LDFLAGS: -lcuda -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cuda.h>

// cuInit guard. gorgonia.org/cu calls cuInit from its package init and
// exits the process (os.Exit(1)) when it fails, so a cuda build would die
// at startup on a machine without a GPU or a loaded driver, before any
// caller could fall back to the host device. This definition of cuInit
// takes precedence over libcuda's at link time: it forwards to the driver's
// cuInit (dlsym RTLD_NEXT), records the result of the first call (the
// package init's) and reports success for that call only. NewCUDA returns
// the recorded error. Later calls return the driver's result unchanged.
static CUresult omni_init_result = CUDA_SUCCESS;
static int omni_init_calls = 0;

CUresult CUDAAPI cuInit(unsigned int flags) {
	CUresult (*real)(unsigned int) = (CUresult (*)(unsigned int))dlsym(RTLD_NEXT, "cuInit");
	CUresult r = real ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
	if (__atomic_fetch_add(&omni_init_calls, 1, __ATOMIC_SEQ_CST) == 0) {
		omni_init_result = r;
		return CUDA_SUCCESS;
	}
	return r;
}

static CUresult omni_init_status(void) { return omni_init_result; }

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

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"gorgonia.org/cu"
)

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

// cuErr converts an error from gorgonia.org/cu (its error values are the
// driver's result codes) to one carrying the driver's error text.
// cu prints its codes by a short name only.
func cuErr(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if v := reflect.ValueOf(e); v.Kind() == reflect.Int && v.Type().PkgPath() == "gorgonia.org/cu" {
			return cuError(int(v.Int()))
		}
	}
	return err
}

// initStatus is the result of the process's first cuInit (see the guard).
func initStatus() error {
	if r := C.omni_init_status(); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
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

// streamPtr is the raw CUstream of s (cu's C types are its own).
func streamPtr(s cu.Stream) unsafe.Pointer { return unsafe.Pointer(s.C()) }

func (m memPool) alloc(n int, s cu.Stream) (uintptr, error) {
	var p C.CUdeviceptr
	if r := C.omni_pool_alloc(&p, C.size_t(n), m.p, streamPtr(s)); r != C.CUDA_SUCCESS {
		return 0, cuError(int(r))
	}
	return uintptr(p), nil
}

func freeAsync(p uintptr, s cu.Stream) error {
	if r := C.omni_free_async(C.CUdeviceptr(p), streamPtr(s)); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}
