//go:build cuda

package gpu

// Pinned host memory: gorgonia.org/cu wraps cuMemFreeHost but not
// cuMemHostAlloc, so staging pages are allocated through this shim.

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

static CUresult omni_host_alloc(void **p, size_t n) {
	return cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE);
}

static CUresult omni_host_free(void *p) {
	return cuMemFreeHost(p);
}

static int omni_host_pinned(void *p) {
	unsigned int flags = 0;
	return cuMemHostGetFlags(&flags, p) == CUDA_SUCCESS;
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

// hostPinned reports whether p is page-locked memory from cuMemHostAlloc
// (cuMemHostGetFlags succeeds). The caller holds the context current.
func hostPinned(p unsafe.Pointer) bool { return C.omni_host_pinned(p) != 0 }
