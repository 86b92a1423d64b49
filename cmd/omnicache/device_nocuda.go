//go:build !cuda

package main

import "github.com/omnicache/omnicache/gpu"

// cudaCompiled reports whether this binary has the CUDA device.
const cudaCompiled = false

// openCUDA fails: this build has no CUDA device.
func openCUDA(int) (gpu.Device, error) { return nil, errNoCUDA }
