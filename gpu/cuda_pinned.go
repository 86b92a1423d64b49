//go:build cuda

package gpu

// Pinned host memory (cuMemHostAlloc, cuMemHostRegister) and batched
// device→host copies.

/*
#cgo LDFLAGS: -lcuda
#include <stdint.h>
#include <string.h>
#include <cuda.h>

static CUresult omni_host_alloc(void **p, size_t n) {
	return cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE);
}

static CUresult omni_host_free(void *p) {
	return cuMemFreeHost(p);
}

static CUresult omni_host_register(void *p, size_t n) {
	return cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE);
}

static CUresult omni_host_unregister(void *p) {
	return cuMemHostUnregister(p);
}

// omni_host_pinned: p lies in page-locked memory the driver knows, from
// cuMemHostAlloc (cuMemHostGetFlags succeeds) or cuMemHostRegister (the
// driver reports host memory at p).
static int omni_host_pinned(void *p) {
	unsigned int flags = 0;
	if (cuMemHostGetFlags(&flags, p) == CUDA_SUCCESS) {
		return 1;
	}
	unsigned int type = 0;
	return cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
		type == CU_MEMORYTYPE_HOST;
}

// Batched device→host copies. cuMemcpyBatchAsync (CUDA 12.8+ drivers) is
// looked up at run time (cuGetProcAddress, which the 11.8 headers have),
// asking for its 12.8 ABI (a failIdx argument before the stream; CUDA 13
// drivers still serve that version). The attribute types are declared
// here as 12.8's cuda.h lays them out (they are newer than the headers).
typedef struct { int type; int id; } omni_memloc;
typedef struct {
	int srcAccessOrder; // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1
	omni_memloc srcLocHint;
	omni_memloc dstLocHint;
	unsigned int flags;
} omni_memcpy_attrs;
typedef CUresult (CUDAAPI *omni_batch_fn)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
	omni_memcpy_attrs *attrs, size_t *attrIdxs, size_t numAttrs, size_t *failIdx, CUstream stream);
static omni_batch_fn omni_batch = NULL;

// omni_batch_init looks cuMemcpyBatchAsync up (the context is current);
// 1 when the driver has it.
static int omni_batch_init(void) {
	void *p = NULL;
	if (omni_batch == NULL && cuGetProcAddress("cuMemcpyBatchAsync", &p, 12080, 0) == CUDA_SUCCESS && p != NULL) {
		omni_batch = (omni_batch_fn)p;
	}
	return omni_batch != NULL;
}

// omni_batch_copy issues count copies dsts[i] <- srcs[i] (sizes[i] bytes)
// in stream order, as one batch.
static CUresult omni_batch_copy(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *stream) {
	omni_memcpy_attrs a;
	memset(&a, 0, sizeof a);
	a.srcAccessOrder = 1;
	size_t idx = 0, fail = 0;
	return omni_batch(dsts, srcs, sizes, count, &a, &idx, 1, &fail, (CUstream)stream);
}
*/
import "C"

import "unsafe"

// hostAlloc returns n bytes of page-locked, portable host memory
// (cuMemHostAlloc) as a Go slice. The caller holds the context current.
func hostAlloc(n int) ([]byte, error) {
	var p unsafe.Pointer
	if r := C.omni_host_alloc(&p, C.size_t(n)); r != C.CUDA_SUCCESS {
		return nil, cuError(int(r))
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// hostFree returns memory from hostAlloc. The caller holds the context
// current.
func hostFree(p unsafe.Pointer) error {
	if r := C.omni_host_free(p); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}

// hostRegister page-locks n bytes of host memory at p (portable) for the
// driver. The caller holds the context current.
func hostRegister(p unsafe.Pointer, n int) error {
	if r := C.omni_host_register(p, C.size_t(n)); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}

// hostUnregister undoes hostRegister. The caller holds the context current.
func hostUnregister(p unsafe.Pointer) error {
	if r := C.omni_host_unregister(p); r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}

// hostPinned reports whether p is page-locked memory from cuMemHostAlloc or
// cuMemHostRegister. The caller holds the context current.
func hostPinned(p unsafe.Pointer) bool { return C.omni_host_pinned(p) != 0 }

// batchInit reports whether the driver has cuMemcpyBatchAsync. The caller
// holds the context current.
func batchInit() bool { return C.omni_batch_init() != 0 }

// batchCopy issues len(dsts) copies as one cuMemcpyBatchAsync on stream.
// The caller holds the context current and checked every span.
func batchCopy(dsts, srcs []uint64, sizes []uint64, stream unsafe.Pointer) error {
	r := C.omni_batch_copy((*C.CUdeviceptr)(unsafe.Pointer(&dsts[0])), (*C.CUdeviceptr)(unsafe.Pointer(&srcs[0])),
		(*C.size_t)(unsafe.Pointer(&sizes[0])), C.size_t(len(dsts)), stream)
	if r != C.CUDA_SUCCESS {
		return cuError(int(r))
	}
	return nil
}
