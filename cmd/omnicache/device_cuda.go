//go:build cuda

package main

import "github.com/omnicache/omnicache/gpu"

// cudaCompiled reports whether this binary has the CUDA device.
const cudaCompiled = true

// openCUDA opens CUDA device ordinal (gpu.NewCUDA: its primary context, a
// stream and a stream-ordered memory pool).
func openCUDA(ordinal int) (gpu.Device, error) { return gpu.NewCUDA(ordinal) }
