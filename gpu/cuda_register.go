//go:build cuda

package gpu

import "fmt"

// Host memory registered for others (HostRegistrar): the cache's mirror
// chunks, which the committer copies a step's rows into straight from the
// device. Registrations are kept apart from AllocHost's pages (d.host),
// whose lookups scan every entry.

// RegisterHost page-locks p for the driver (cuMemHostRegister, portable).
func (d *CUDA) RegisterHost(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: register host memory: %w", ErrAlloc, err)
	}
	defer d.leave()
	if err := hostRegister(hostPtr(p), len(p)); err != nil {
		return fmt.Errorf("%w: cuMemHostRegister of %d bytes: %w", ErrAlloc, len(p), err)
	}
	d.memMu.Lock()
	d.reg[uintptr(hostPtr(p))] = hostPtr(p)
	d.memMu.Unlock()
	return nil
}

// UnregisterHost undoes RegisterHost(p) once the stream has drained (no
// copy into p is in flight then). p not registered: nothing happens.
func (d *CUDA) UnregisterHost(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	base := uintptr(hostPtr(p))
	d.memMu.Lock()
	ptr, ok := d.reg[base]
	delete(d.reg, base)
	d.memMu.Unlock()
	if !ok || d.closed.Load() {
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: unregister host memory: %w", ErrAlloc, err)
	}
	defer d.leave()
	if err := streamSync(d.stream); err != nil {
		return fmt.Errorf("%w: cuStreamSynchronize: %w", ErrCopy, err)
	}
	if err := hostUnregister(ptr); err != nil {
		return fmt.Errorf("%w: cuMemHostUnregister: %w", ErrAlloc, err)
	}
	return nil
}

// CopyDtoHRegistered issues dst[i] ← src[i] for every i, in stream order:
// one cuMemcpyBatchAsync where the driver has it, else one
// cuMemcpyDtoHAsync each. Every dst lies in one RegisterHost span, every
// src in device memory; spans are checked before anything is issued.
func (d *CUDA) CopyDtoHRegistered(dst [][]byte, src []Buffer) error {
	if len(dst) != len(src) {
		panic("gpu: CopyDtoHRegistered: dst and src lengths differ")
	}
	for i := range dst {
		if err := cspan(src[i], 0, len(dst[i])); err != nil {
			return err
		}
		if src[i].Host != nil {
			return d.CopyDtoHBatch(dst, src) // host-backed sources: the general path
		}
	}
	if !d.canBatch || len(dst) == 1 {
		for i := range dst {
			if err := d.CopyDtoH(dst[i], src[i], 0); err != nil {
				return err
			}
		}
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	d.batchMu.Lock()
	defer d.batchMu.Unlock()
	d.bDst, d.bSrc, d.bSize = d.bDst[:0], d.bSrc[:0], d.bSize[:0]
	for i, p := range dst {
		if len(p) == 0 {
			continue
		}
		d.bDst = append(d.bDst, uint64(uintptr(hostPtr(p))))
		d.bSrc = append(d.bSrc, uint64(src[i].Ptr))
		d.bSize = append(d.bSize, uint64(len(p)))
	}
	if len(d.bDst) == 0 {
		return nil
	}
	if err := batchCopy(d.bDst, d.bSrc, d.bSize, streamPtr(d.stream)); err != nil {
		return fmt.Errorf("%w: cuMemcpyBatchAsync of %d copies: %w", ErrCopy, len(d.bDst), err)
	}
	d.batched.Add(int64(len(d.bDst)))
	return nil
}
