//go:build amd64 && !purego && !noasm

package slots

import (
	"math"

	"github.com/klauspost/cpuid/v2"
)

// The kernels' instruction families (see the "Requires:" lines of
// slots_amd64.s): AVX-512 kernels use AVX512F, AVX and AVX2, BMI1 (TZCNT),
// BMI2 (BZHI, SHRX) and CMOV; AVX512VL because the assembler gives xmm/ymm
// instructions on registers 16-31 their EVEX forms. AVX512BW is not used; it
// is required with F and VL as the project's AVX-512 baseline, which excludes
// no CPU that has VL. AVX2 kernels use AVX, AVX2, BMI1, BMI2 and CMOV.
var (
	hasAVX512 = cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VL,
		cpuid.AVX, cpuid.AVX2, cpuid.BMI1, cpuid.BMI2, cpuid.CMOV)
	hasAVX2 = cpuid.CPU.Supports(cpuid.AVX, cpuid.AVX2, cpuid.BMI1, cpuid.BMI2, cpuid.CMOV)

	// The dispatch toggles, on where available (the best one wins); Select
	// changes them.
	useAVX512 = hasAVX512
	useAVX2   = hasAVX2
)

var asmImplementations = []implementation{
	{name: "avx512", use: &useAVX512, available: hasAVX512},
	{name: "avx2", use: &useAVX2, available: hasAVX2},
}

func mapSlots(dst []int32, b *Batch, blockSize int) (int, error) {
	// The kernels index the table with 32-bit gathers.
	if !(useAVX512 || useAVX2) || len(b.Table) > math.MaxInt32 {
		n, err := checkRequests(len(dst), b, blockSize)
		if err != nil {
			return 0, err
		}
		if useGeneric {
			return mapGeneric(dst[:n], b, blockSize), nil
		}
		return mapPortable(dst[:n], b, blockSize), nil
	}
	nrows, positions := limits(b, blockSize)
	rows, start, count := &b.Rows[0], &b.Start[0], &b.Count[0]
	var n int
	if useAVX512 {
		n = checkAVX512(rows, start, count, len(b.Rows), nrows, int(positions))
	} else {
		n = checkAVX2(rows, start, count, len(b.Rows), nrows, int(positions))
	}
	if n < 0 || n > len(dst) {
		if _, err := checkRequests(len(dst), b, blockSize); err != nil {
			return 0, err
		}
		panic("slots: the assembly check rejected a batch the Go check accepts")
	}
	if n == 0 {
		return 0, nil
	}
	table, pow2 := &b.Table[0], blockSize&(blockSize-1) == 0
	switch {
	case useAVX512 && pow2:
		mapPow2AVX512(&dst[0], rows, start, count, len(b.Rows), table, b.Stride, blockSize)
	case useAVX512:
		mapDivAVX512(&dst[0], rows, start, count, len(b.Rows), table, b.Stride, blockSize, 1/float64(blockSize))
	case pow2:
		mapPow2AVX2(&dst[0], rows, start, count, len(b.Rows), table, b.Stride, blockSize)
	default:
		mapDivAVX2(&dst[0], rows, start, count, len(b.Rows), table, b.Stride, blockSize, 1/float64(blockSize))
	}
	return n, nil
}

func expandSlots(dst []int32, blocks []int32, blockSize int) {
	// The kernels count positions in int32 lanes.
	if !(useAVX512 || useAVX2) || len(dst) > math.MaxInt32 {
		if useGeneric {
			expandGeneric(dst, blocks, blockSize)
			return
		}
		expandPortable(dst, blocks, blockSize)
		return
	}
	pow2 := blockSize&(blockSize-1) == 0
	switch {
	case useAVX512 && pow2:
		expandPow2AVX512(&dst[0], &blocks[0], len(dst), blockSize)
	case useAVX512:
		expandDivAVX512(&dst[0], &blocks[0], len(dst), blockSize, 1/float64(blockSize))
	case pow2:
		expandPow2AVX2(&dst[0], &blocks[0], len(dst), blockSize)
	default:
		expandDivAVX2(&dst[0], &blocks[0], len(dst), blockSize, 1/float64(blockSize))
	}
}
