package slots

// The reference implementation ("generic"): the formula, one token at a time.
// Every other implementation must agree with it bit for bit. The callers have
// validated the input.

// mapGeneric writes the slots of b's tokens to dst and returns how many.
func mapGeneric(dst []int32, b *Batch, blockSize int) int {
	n := 0
	for i, row := range b.Rows {
		start, count := int(b.Start[i]), int(b.Count[i])
		for pos := start; pos < start+count; pos++ {
			block := b.Table[int(row)*b.Stride+pos/blockSize]
			dst[n] = block*int32(blockSize) + int32(pos%blockSize)
			n++
		}
	}
	return n
}

// expandGeneric writes the slots of positions [0, len(dst)) over blocks.
func expandGeneric(dst []int32, blocks []int32, blockSize int) {
	for pos := range dst {
		dst[pos] = blocks[pos/blockSize]*int32(blockSize) + int32(pos%blockSize)
	}
}
