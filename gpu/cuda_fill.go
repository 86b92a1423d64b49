//go:build cuda

package gpu

import "fmt"

// Fill sets bytes [off, off+n) of b to v with cuMemsetD8Async on the
// device's stream (host memory used as a Buffer is set once the stream
// drained).
func (d *CUDA) Fill(b Buffer, off, n int, v byte) error {
	if err := cspan(b, off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: fill: %w", ErrCopy, err)
	}
	defer d.leave()
	if b.Host != nil {
		if err := streamSync(d.stream); err != nil {
			return fmt.Errorf("%w: cuStreamSynchronize: %w", ErrCopy, err)
		}
		s := b.Host[off : off+n]
		for i := range s {
			s[i] = v
		}
		return nil
	}
	if err := memsetD8(devPtr(b, off), v, n, d.stream); err != nil {
		return fmt.Errorf("%w: cuMemsetD8Async of %d bytes: %w", ErrCopy, n, err)
	}
	return nil
}
