package gpu

import (
	"fmt"
	"sync/atomic"
)

// Faulty wraps a Device and makes its copies fail once a number of copies
// have succeeded. Tests use it to drive the cache's sticky-failure path.
type Faulty struct {
	Device
	left atomic.Int64
	on   atomic.Bool
}

// NewFaulty returns d wrapped with no failure armed.
func NewFaulty(d Device) *Faulty { return &Faulty{Device: d} }

// FailAfter arms the wrapper: n more copies succeed, then every copy fails.
func (f *Faulty) FailAfter(n int64) {
	f.left.Store(n)
	f.on.Store(true)
}

func (f *Faulty) fail() error {
	if f.on.Load() && f.left.Add(-1) < 0 {
		return fmt.Errorf("%w: injected fault", ErrCopy)
	}
	return nil
}

func (f *Faulty) CopyDtoD(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Device.CopyDtoD(dst, dstOff, src, srcOff, n)
}

func (f *Faulty) CopyDtoH(dst []byte, src Buffer, srcOff int) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Device.CopyDtoH(dst, src, srcOff)
}
