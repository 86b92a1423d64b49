//go:build !cuda

package gpu

// Available reports whether this build has the CUDA device.
const Available = false

// NewCUDA returns ErrNoCUDA: this build has no `cuda` tag.
func NewCUDA(ordinal int) (Device, error) { return nil, ErrNoCUDA }

// NewCUDAWith returns ErrNoCUDA: this build has no `cuda` tag.
func NewCUDAWith(ordinal int, opt CUDAOptions) (Device, error) { return nil, ErrNoCUDA }
