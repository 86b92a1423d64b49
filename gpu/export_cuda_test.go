//go:build cuda

package gpu

import "runtime"

// RawStream is the driver with nothing of the device around it: a stream
// of its own in the device's primary context, for the baseline of
// BenchmarkStaging (op=plain-pinned), which copies as an engine would
// without the cache. Its goroutine stays locked to its OS thread, with the
// context current, from NewRawStream to Close.
type RawStream struct {
	dev cuDevice
	s   cuStream
}

// NewRawStream retains device ordinal's primary context and makes a
// non-blocking stream on it (the driver is initialized by a NewCUDA
// before).
func NewRawStream(ordinal int) (*RawStream, error) {
	runtime.LockOSThread()
	dev, err := deviceGet(ordinal)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	ctx, err := primaryRetain(dev)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	if err = ctxSetCurrent(ctx); err == nil {
		var s cuStream
		if s, err = streamCreate(); err == nil {
			return &RawStream{dev: dev, s: s}, nil
		}
	}
	primaryRelease(dev)
	runtime.UnlockOSThread()
	return nil, err
}

// CopyDtoH issues one cuMemcpyDtoHAsync of len(dst) bytes from device
// address src.
func (r *RawStream) CopyDtoH(dst []byte, src uintptr) error {
	return copyDtoH(hostPtr(dst), src, len(dst), r.s)
}

// Sync waits for the stream (cuStreamSynchronize).
func (r *RawStream) Sync() error { return streamSync(r.s) }

// Close destroys the stream, releases the context and unlocks the thread.
func (r *RawStream) Close() {
	streamDestroy(r.s)
	primaryRelease(r.dev)
	runtime.UnlockOSThread()
}
