package slots

import (
	"errors"
	"fmt"
	"math"
)

// Errors returned by Map and Expand. Each is wrapped with the details of the
// case (request index, row, positions, lengths) via fmt.Errorf("...: %w"), so
// test with errors.Is.
var (
	// ErrLength: Rows, Start and Count have different lengths.
	ErrLength = errors.New("slots: Rows, Start and Count lengths differ")
	// ErrBlockSize: the block size is not in [1, math.MaxInt32].
	ErrBlockSize = errors.New("slots: block size out of range")
	// ErrStride: Stride is not positive while requests are present.
	ErrStride = errors.New("slots: stride not positive")
	// ErrNegative: a request has a negative Start or Count.
	ErrNegative = errors.New("slots: negative start or count")
	// ErrRow: a request's row is outside the block table
	// (row < 0 or (row+1)*Stride > len(Table)).
	ErrRow = errors.New("slots: row outside the block table")
	// ErrColumn: a scheduled position lies beyond its table row: its block
	// column is >= Stride, or the position does not fit in an int32.
	ErrColumn = errors.New("slots: position beyond the block table row")
	// ErrTokens: Expand's tokens is negative or more than its blocks hold.
	ErrTokens = errors.New("slots: tokens beyond the blocks")
	// ErrShortDst: dst is shorter than the number of slots to write.
	ErrShortDst = errors.New("slots: destination too short")
)

// Batch is one step's scheduled requests in token order, borrowed from the
// engine for the call only.
type Batch struct {
	Rows   []int32 // block-table row of each scheduled request
	Start  []int32 // first scheduled position (tokens already computed)
	Count  []int32 // tokens scheduled this step (0 allowed)
	Table  []int32 // the engine's block table, row-major [rows][Stride]
	Stride int     // block ids per table row
}

// Map writes the slot of every scheduled token into dst, requests in batch
// order, and returns how many it wrote. The slot of position pos of a request
// on row r is Table[r*Stride+pos/blockSize]*blockSize + pos%blockSize.
//
// Map checks the whole batch (one pass over the requests) before it writes:
// on error it returns 0 and has written nothing. It never writes past
// len(dst).
func Map(dst []int32, b Batch, blockSize int) (int, error) {
	if err := checkBatch(&b, blockSize); err != nil || len(b.Rows) == 0 {
		return 0, err
	}
	return mapSlots(dst, &b, blockSize)
}

// Expand writes the slots of the first tokens positions of a request whose
// blocks are blocks (a prefix-cache hit span) and returns how many it wrote:
// dst[pos] = blocks[pos/blockSize]*blockSize + pos%blockSize. On error it
// returns 0 and has written nothing. It never writes past len(dst).
func Expand(dst []int32, blocks []int32, blockSize, tokens int) (int, error) {
	if blockSize <= 0 || blockSize > math.MaxInt32 {
		return 0, fmt.Errorf("slots: block size %d: %w", blockSize, ErrBlockSize)
	}
	if tokens < 0 || tokens > 0 && (tokens-1)/blockSize >= len(blocks) {
		return 0, fmt.Errorf("slots: %d tokens over %d blocks of %d: %w", tokens, len(blocks), blockSize, ErrTokens)
	}
	if tokens > len(dst) {
		return 0, fmt.Errorf("slots: %d tokens, len(dst) %d: %w", tokens, len(dst), ErrShortDst)
	}
	if tokens == 0 {
		return 0, nil
	}
	expandSlots(dst[:tokens], blocks, blockSize)
	return tokens, nil
}

// Total checks b as Map does (without a destination) and returns the number
// of tokens it schedules: the length Map's dst needs. A total that does not
// fit in an int (on a 32-bit platform) is ErrShortDst.
func Total(b Batch, blockSize int) (int, error) {
	if err := checkBatch(&b, blockSize); err != nil || len(b.Rows) == 0 {
		return 0, err
	}
	return checkRequests(math.MaxInt, &b, blockSize)
}

// checkBatch checks what does not depend on the requests one by one.
func checkBatch(b *Batch, blockSize int) error {
	if len(b.Start) != len(b.Rows) || len(b.Count) != len(b.Rows) {
		return fmt.Errorf("slots: len(Rows) %d, len(Start) %d, len(Count) %d: %w",
			len(b.Rows), len(b.Start), len(b.Count), ErrLength)
	}
	if blockSize <= 0 || blockSize > math.MaxInt32 {
		return fmt.Errorf("slots: block size %d: %w", blockSize, ErrBlockSize)
	}
	if len(b.Rows) > 0 && b.Stride <= 0 {
		return fmt.Errorf("slots: Stride %d with %d requests: %w", b.Stride, len(b.Rows), ErrStride)
	}
	return nil
}

// limits returns the number of table rows and the number of positions a row
// holds (clamped so that every position fits in an int32). b passed
// checkBatch and has requests, so Stride > 0.
func limits(b *Batch, blockSize int) (rows int, positions int64) {
	if uint64(len(b.Table)) <= math.MaxUint32 && uint64(b.Stride) <= math.MaxUint32 {
		rows = int(uint32(len(b.Table)) / uint32(b.Stride)) // a 32-bit division is cheaper
	} else {
		rows = len(b.Table) / b.Stride
	}
	positions = math.MaxInt32
	if b.Stride < math.MaxInt32 { // then Stride*blockSize < 2^62
		positions = min(int64(b.Stride)*int64(blockSize), math.MaxInt32)
	}
	return rows, positions
}

// checkRequests validates every request of b (which passed checkBatch and
// has requests) in one pass and returns the number of tokens, at most dstLen.
// It is the reference check and the one that words the errors: the assembly
// checks only say good or bad, and a bad batch is checked again here.
func checkRequests(dstLen int, b *Batch, blockSize int) (int, error) {
	nrows, positions := limits(b, blockSize)
	maxRow := uint64(nrows)
	rows := b.Rows
	starts := b.Start[:len(rows)]
	counts := b.Count[:len(rows)]
	total := int64(0)
	for i, row := range rows {
		s, c := starts[i], counts[i]
		if uint64(int64(row)) >= maxRow || s|c < 0 || c != 0 && int64(s)+int64(c) > positions {
			return 0, requestError(b, blockSize, i)
		}
		total += int64(c)
	}
	if total > int64(dstLen) {
		return 0, fmt.Errorf("slots: %d tokens scheduled, len(dst) %d: %w", total, dstLen, ErrShortDst)
	}
	return int(total), nil
}

// requestError words the error of request i, which checkRequests found bad.
func requestError(b *Batch, blockSize, i int) error {
	nrows, positions := limits(b, blockSize)
	row, s, c := b.Rows[i], b.Start[i], b.Count[i]
	switch {
	case row < 0 || int(row) >= nrows:
		return fmt.Errorf("slots: request %d: row %d, table of %d rows (len(Table) %d, Stride %d): %w",
			i, row, nrows, len(b.Table), b.Stride, ErrRow)
	case s < 0 || c < 0:
		return fmt.Errorf("slots: request %d: start %d, count %d: %w", i, s, c, ErrNegative)
	default:
		return fmt.Errorf("slots: request %d: positions [%d, %d), a row holds %d (Stride %d, block size %d): %w",
			i, s, int64(s)+int64(c), positions, b.Stride, blockSize, ErrColumn)
	}
}

// An implementation is one way to compute Map and Expand. use is the toggle
// the dispatch reads (nil for "go", the fallback when every toggle is off).
type implementation struct {
	name      string
	use       *bool
	available bool
}

// useGeneric makes Map and Expand use the reference implementation; only
// Select turns it on.
var useGeneric bool

func registry() []implementation {
	return append(asmImplementations[:len(asmImplementations):len(asmImplementations)],
		implementation{name: "go", available: true},
		implementation{name: "generic", use: &useGeneric, available: true})
}

// Implementations returns the names of the implementations this build and CPU
// can run, best first. The first is the one Map and Expand use unless Select
// chose another. "generic" is the reference.
func Implementations() []string {
	var names []string
	for _, im := range registry() {
		if im.available {
			names = append(names, im.name)
		}
	}
	return names
}

// Select makes Map and Expand use the named implementation and returns a func
// that restores the previous choice. It reports false (and changes nothing)
// for a name this build or CPU cannot run. For tests and benchmarks: it must
// not run concurrently with Map, Expand or another Select.
func Select(name string) (restore func(), ok bool) {
	impls := registry()
	saved := make([]bool, len(impls))
	found := false
	for i, im := range impls {
		if im.use != nil {
			saved[i] = *im.use
		}
		found = found || im.name == name && im.available
	}
	if !found {
		return func() {}, false
	}
	for _, im := range impls {
		if im.use != nil {
			*im.use = im.name == name
		}
	}
	return func() {
		for i, im := range impls {
			if im.use != nil {
				*im.use = saved[i]
			}
		}
	}, true
}
