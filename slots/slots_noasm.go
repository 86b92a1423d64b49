//go:build !amd64 || purego || noasm

package slots

// No assembly in this build: the portable implementation, or the reference
// when Select chose it.

var asmImplementations []implementation

func mapSlots(dst []int32, b *Batch, blockSize int) (int, error) {
	n, err := checkRequests(len(dst), b, blockSize)
	if err != nil {
		return 0, err
	}
	if useGeneric {
		return mapGeneric(dst[:n], b, blockSize), nil
	}
	return mapPortable(dst[:n], b, blockSize), nil
}

func expandSlots(dst []int32, blocks []int32, blockSize int) {
	if useGeneric {
		expandGeneric(dst, blocks, blockSize)
		return
	}
	expandPortable(dst, blocks, blockSize)
}
