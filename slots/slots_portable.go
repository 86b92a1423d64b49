package slots

import "math/bits"

// The portable implementation ("go"): no division per token. A request's
// first position is split into block column and offset once (a shift and a
// mask for a power-of-two block size, a multiply by a 64-bit reciprocal
// otherwise); from there its positions are consecutive, so a request is a
// run of blocks, and each block a run of consecutive slots.

// divider splits positions (0 <= pos <= math.MaxInt32) by a block size.
type divider struct {
	size  int32
	shift uint   // log2(size) when size is a power of two
	mask  int32  // size-1 when size is a power of two
	recip uint64 // ceil(2^64/size) otherwise
	pow2  bool
}

func newDivider(blockSize int) divider {
	d := divider{size: int32(blockSize), pow2: blockSize&(blockSize-1) == 0}
	if d.pow2 {
		d.shift = uint(bits.TrailingZeros32(uint32(blockSize)))
		d.mask = int32(blockSize - 1)
	} else {
		// Lemire, Kaser, Kurz, "Faster remainder by direct computation"
		// (2019): for a 32-bit numerator n and divisor d > 1 that is not a
		// power of two, n/d = (ceil(2^64/d) * n) >> 64 exactly.
		d.recip = ^uint64(0)/uint64(blockSize) + 1
	}
	return d
}

// split returns pos/size and pos%size.
func (d *divider) split(pos int32) (int, int32) {
	if d.pow2 {
		return int(pos >> d.shift), pos & d.mask
	}
	q, _ := bits.Mul64(d.recip, uint64(pos))
	return int(q), pos - int32(q)*d.size
}

// mapPortable writes the slots of b's tokens to dst and returns how many.
func mapPortable(dst []int32, b *Batch, blockSize int) int {
	d := newDivider(blockSize)
	rows := b.Rows
	starts := b.Start[:len(rows)]
	counts := b.Count[:len(rows)]
	table, stride := b.Table, b.Stride
	n := 0
	for i, row := range rows {
		count := int(counts[i])
		if count == 0 {
			continue
		}
		col, off := d.split(starts[i])
		at := int(row)*stride + col
		if count == 1 { // a decode: one table read
			dst[n] = table[at]*d.size + off
			n++
			continue
		}
		fillBlocks(dst[n:n+count], table[at:], d.size, off)
		n += count
	}
	return n
}

// expandPortable writes the slots of positions [0, len(dst)) over blocks.
func expandPortable(dst []int32, blocks []int32, blockSize int) {
	fillBlocks(dst, blocks, int32(blockSize), 0)
}

// fillBlocks fills dst with consecutive positions starting at offset off of
// blocks[0]: the rest of blocks[0], then blocks[1] from offset 0, and so on.
func fillBlocks(dst []int32, blocks []int32, size, off int32) {
	for k := 0; len(dst) > 0; k++ {
		run := dst[:min(int(size-off), len(dst))]
		slot := blocks[k]*size + off
		fillRun(run, slot)
		dst = dst[len(run):]
		off = 0
	}
}

// fillRun writes first, first+1, ... to run, eight at a time.
func fillRun(run []int32, first int32) {
	for ; len(run) >= 8; run = run[8:] {
		r := run[:8:8]
		r[0], r[1], r[2], r[3] = first, first+1, first+2, first+3
		r[4], r[5], r[6], r[7] = first+4, first+5, first+6, first+7
		first += 8
	}
	for j := range run {
		run[j] = first + int32(j)
	}
}
