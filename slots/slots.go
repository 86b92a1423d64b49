// Package slots maps scheduled tokens to KV slots (placeholder reference; the
// real package lands from the slots branch).
package slots

import "errors"

var ErrShape = errors.New("slots: bad shape")

type Batch struct {
	Rows   []int32
	Start  []int32
	Count  []int32
	Table  []int32
	Stride int
}

func Map(dst []int32, b Batch, blockSize int) (int, error) {
	if blockSize <= 0 || len(b.Rows) != len(b.Start) || len(b.Rows) != len(b.Count) {
		return 0, ErrShape
	}
	n := 0
	for i := range b.Rows {
		r, s, c := int(b.Rows[i]), int(b.Start[i]), int(b.Count[i])
		if s < 0 || c < 0 || r < 0 || (r+1)*b.Stride > len(b.Table) {
			return 0, ErrShape
		}
		if c > 0 && (s+c-1)/blockSize >= b.Stride {
			return 0, ErrShape
		}
		if n+c > len(dst) {
			return 0, ErrShape
		}
		for p := s; p < s+c; p++ {
			dst[n] = b.Table[r*b.Stride+p/blockSize]*int32(blockSize) + int32(p%blockSize)
			n++
		}
	}
	return n, nil
}

func Expand(dst []int32, blocks []int32, blockSize, tokens int) (int, error) {
	if blockSize <= 0 || tokens < 0 || tokens > len(blocks)*blockSize || tokens > len(dst) {
		return 0, ErrShape
	}
	for p := 0; p < tokens; p++ {
		dst[p] = blocks[p/blockSize]*int32(blockSize) + int32(p%blockSize)
	}
	return tokens, nil
}
