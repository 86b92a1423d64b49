// Package mirror is the host mirror of one cache key: numSlots rows of
// rowBytes each, one row per KV slot, held in plain Go memory that is
// allocated lazily, chunk by chunk, when a row in it is first written.
//
// # Layout
//
// Rows are grouped into chunks of rowsPerChunk rows, where rowsPerChunk is the
// largest power of two with rowsPerChunk*rowBytes <= 2 MiB (1 when a row is
// larger than that: one row per chunk). A chunk is one make([]byte): it is
// never pinned and never zeroed beyond what make does, so the process RSS
// grows only with the pages the writer really touches. The last chunk holds
// only the rows that exist. Chunks hang off a two-level directory:
//
//	slot s ──► chunk c = s >> rowShift          row in chunk = s & rowMask
//	           leaf  l = c >> leafShift         entry in leaf = c & leafMask
//
//	top  [ l0 | l1 | nil | ... ]      made by New: at most 1024 pointers
//	        │    │
//	        │    └─► leaf [ nil | c | nil | ... ]   made on the first write
//	        ▼                    │                  into one of its chunks
//	      leaf [ c | nil | ... ]  └─► chunk []byte, rowsPerChunk*rowBytes
//	             │
//	             └─► chunk: row 0 | row 1 | ... | row rowsPerChunk-1
//
// A leaf covers 1024 chunks (the last leaf only the chunks that exist);
// only mirrors of more than a million chunks get wider leaves (by powers of
// two), so that the top level never exceeds 1024 pointers. New therefore costs two small allocations whatever the
// mirror's size, and touches no row memory. Because rowsPerChunk is always a
// power of two, locating a row is two shifts, two masks and one multiply:
// no division on any path.
//
// Reading a slot whose chunk (or leaf) was never written yields a zero row
// without allocating anything. Reading a never-written slot of an allocated
// chunk yields zeros too (make zeroes, or hands out fresh OS pages).
//
// # Concurrency
//
// Exactly one goroutine (the cache's committer) may call Write, WriteRow
// and WriteSplit; WriteSplit's workers write disjoint rows on its behalf
// and are done before it returns (see Workers).
// Any number of goroutines may call Read, ReadRow, ResidentBytes, RowBytes
// and NumSlots concurrently with it, under one rule: a reader may only read
// slots that are committed, i.e. whose last Write returned before the reader
// learned (through an atomic publication by the caller, which gives the
// happens-before edge) that the slot is readable; the writer must not be
// writing that slot at the same time. Reading slots that were never written
// is always allowed: leaf and chunk pointers are published with atomic
// stores and read with atomic loads, so a reader that probes a chunk the
// writer is allocating sees either nil (zero row) or the fully made chunk,
// and rows of that chunk the writer has not written read as zeros. The
// Mirror holds no lock.
//
// # Misuse
//
// New reports bad sizes with the sentinel errors below. The row operations
// are low-level kernels: a buffer whose length disagrees with the slot count
// and row size, or a slot >= NumSlots, is a programmer error and panics with
// a message starting "mirror: ". A negative slot is not an error: it means
// "skip this row" on writes and "zero row" on reads.
package mirror

import (
	"errors"
	"fmt"
	"github.com/omnicache/omnicache/internal/hostmem"
	"math"
	"math/bits"
	"sync/atomic"
)

// Errors returned by New and Prepare, wrapped with the offending sizes;
// test with errors.Is.
var (
	// ErrNumSlots: numSlots <= 0.
	ErrNumSlots = errors.New("mirror: numSlots must be positive")
	// ErrRowBytes: rowBytes <= 0.
	ErrRowBytes = errors.New("mirror: rowBytes must be positive")
	// ErrTooLarge: numSlots*rowBytes overflows int, or numSlots exceeds
	// 1<<31 (slots are int32).
	ErrTooLarge = errors.New("mirror: size overflows")
	// ErrNoMemory: the OS refused a chunk's memory (Prepare).
	ErrNoMemory = errors.New("mirror: the OS refused a chunk's memory")
)

const (
	// chunkTarget bounds a chunk's size: a chunk holds the largest power of
	// two of rows that fits in it (or one row, if a row is bigger).
	chunkTarget = 2 << 20
	// minLeafShift: a leaf has at least 1<<minLeafShift entries.
	minLeafShift = 10
	// maxTop: the top level never has more entries than this.
	maxTop = 1024
	// maxSlots: slots are int32, so slot numSlots-1 must fit.
	maxSlots = 1 << 31
)

// hugeChunks: chunks come from hostmem.AllocHuge (benchmarks compare
// with 4 KiB pages by clearing it).
var hugeChunks = true

// chunk is one lazily made block of rowsPerChunk rows.
type chunk struct{ b []byte }

// leaf is a second-level directory page: one pointer per chunk.
type leaf []atomic.Pointer[chunk]

// Mirror is the host mirror of one key. See the package doc for the layout
// and for which goroutine may call what.
type Mirror struct {
	rowBytes  int
	numSlots  int
	rowShift  uint   // log2(rowsPerChunk)
	rowMask   uint32 // rowsPerChunk-1
	leafShift uint   // log2(entries per leaf)
	leafMask  uint32 // entries per leaf - 1
	numChunks int
	top       []atomic.Pointer[leaf]
	resident  atomic.Int64
	hooks     Hooks
}

// New returns an empty mirror of numSlots rows of rowBytes bytes. It
// allocates only the mirror header and a top-level directory of at most 1024
// pointers, whatever the size: no row memory is allocated or touched.
func New(numSlots, rowBytes int) (*Mirror, error) { return NewWithHooks(numSlots, rowBytes, Hooks{}) }

// Hooks are told about a mirror's chunks: Made when the writer goroutine
// made a chunk (before any row is written to it), Freed by Free before the
// chunk's memory goes back to the OS. The cache registers chunks with its
// device through them, so that a device can copy rows straight into the
// mirror (gpu.HostRegistrar).
type Hooks struct {
	Made  func(chunk []byte)
	Freed func(chunk []byte)
}

// NewWithHooks is New with hooks on the chunks' lifetimes.
func NewWithHooks(numSlots, rowBytes int, h Hooks) (*Mirror, error) {
	switch {
	case numSlots <= 0:
		return nil, fmt.Errorf("mirror.New(%d, %d): %w", numSlots, rowBytes, ErrNumSlots)
	case rowBytes <= 0:
		return nil, fmt.Errorf("mirror.New(%d, %d): %w", numSlots, rowBytes, ErrRowBytes)
	case numSlots > maxSlots || rowBytes > math.MaxInt/numSlots:
		return nil, fmt.Errorf("mirror.New(%d, %d): %w", numSlots, rowBytes, ErrTooLarge)
	}
	rowShift := uint(0)
	if rowBytes <= chunkTarget {
		rowShift = uint(bits.Len(uint(chunkTarget/rowBytes)) - 1)
	}
	numChunks := (numSlots-1)>>rowShift + 1
	leafShift := uint(minLeafShift)
	for (numChunks-1)>>leafShift+1 > maxTop {
		leafShift++
	}
	return &Mirror{
		rowBytes:  rowBytes,
		numSlots:  numSlots,
		rowShift:  rowShift,
		rowMask:   1<<rowShift - 1,
		leafShift: leafShift,
		leafMask:  1<<leafShift - 1,
		numChunks: numChunks,
		top:       make([]atomic.Pointer[leaf], (numChunks-1)>>leafShift+1),
		hooks:     h,
	}, nil
}

// Span returns the memory of the n rows from slot s on, which lie in one
// chunk (s+n <= ChunkEnd(s)), making the chunk: a device copies rows
// straight into it. Its rows follow Write's rules. Writer goroutine only.
func (m *Mirror) Span(s int32, n int) []byte {
	if s < 0 || n < 0 || int(s)+n > int(m.ChunkEnd(s)) {
		panic(fmt.Sprintf("mirror: Span(%d, %d) outside one chunk", s, n))
	}
	b := m.chunkW(uint32(s) >> m.rowShift)
	off := int(uint32(s)&m.rowMask) * m.rowBytes
	return b[off : off+n*m.rowBytes]
}

// ChunkEnd is the slot past the last row of slot s's chunk (at most
// NumSlots).
func (m *Mirror) ChunkEnd(s int32) int32 { return m.runLimit(uint32(s) >> m.rowShift) }

// RowBytes returns the size of one row.
func (m *Mirror) RowBytes() int { return m.rowBytes }

// NumSlots returns the number of rows (slots) the mirror holds.
func (m *Mirror) NumSlots() int { return m.numSlots }

// ResidentBytes returns the bytes of the chunks allocated so far: the row
// memory the mirror really holds (the directory is not counted). Safe from
// any goroutine.
func (m *Mirror) ResidentBytes() int64 { return m.resident.Load() }

// Write scatters row i of rows (len(slots)*RowBytes bytes) to slot slots[i].
// A negative slot skips its row. When a slot repeats within one call, the
// last of its rows wins. Writer goroutine only.
func (m *Mirror) Write(slots []int32, rows []byte) {
	rb := m.rowBytes
	if len(rows) != len(slots)*rb {
		panicLen("Write", len(rows), len(slots), rb)
	}
	// Slots close together share a chunk: look it up once per run of them
	// (a decode flush's rows are per-request runs, a step's rows one run).
	// A run of consecutive slots in one chunk is one copy (see runEnd).
	var cb []byte
	cc := ^uint32(0)
	for i := 0; i < len(slots); {
		s := slots[i]
		if s < 0 {
			i++
			continue
		}
		if int(s) >= m.numSlots {
			panicSlot(s, m.numSlots)
		}
		c := uint32(s) >> m.rowShift
		if c != cc {
			cb, cc = m.chunkW(c), c
		}
		j := i + 1
		if j < len(slots) && slots[j] == s+1 {
			j = runEnd(slots, i, m.runLimit(c))
		}
		off := int(uint32(s)&m.rowMask) * rb
		copy(cb[off:off+(j-i)*rb], rows[i*rb:j*rb])
		i = j
	}
}

// runLimit is the slot past chunk c's last row: a run of slots in chunk c
// stays below it.
func (m *Mirror) runLimit(c uint32) int32 {
	return int32(min(int64(c+1)<<m.rowShift, int64(m.numSlots)))
}

// WriteRow writes one row (RowBytes bytes) to slot; a negative slot is a
// no-op. Writer goroutine only.
func (m *Mirror) WriteRow(slot int32, row []byte) {
	if len(row) != m.rowBytes {
		panicLen("WriteRow", len(row), 1, m.rowBytes)
	}
	if slot < 0 {
		return
	}
	copy(m.writable(slot), row)
}

// Read gathers slot slots[i] into row i of dst (len(slots)*RowBytes bytes).
// A negative slot, or a slot whose chunk was never written, yields an exact
// zero row; nothing is allocated. Safe concurrently with the writer for
// committed or never-written slots (see the package doc).
func (m *Mirror) Read(dst []byte, slots []int32) {
	rb := m.rowBytes
	if len(dst) != len(slots)*rb {
		panicLen("Read", len(dst), len(slots), rb)
	}
	// A chunk found missing stays missing for the call: none of its slots
	// was committed when the read began. A run of consecutive slots in
	// one chunk is one copy, as in Write.
	var cb []byte
	cc := ^uint32(0)
	for i := 0; i < len(slots); {
		s := slots[i]
		if s < 0 {
			clear(dst[i*rb : i*rb+rb])
			i++
			continue
		}
		if int(s) >= m.numSlots {
			panicSlot(s, m.numSlots)
		}
		c := uint32(s) >> m.rowShift
		if c != cc {
			cb, cc = m.chunkR(c), c
		}
		j := i + 1
		if j < len(slots) && slots[j] == s+1 {
			j = runEnd(slots, i, m.runLimit(c))
		}
		d := dst[i*rb : j*rb]
		off := int(uint32(s)&m.rowMask) * rb
		if cb == nil {
			clear(d)
		} else {
			copy(d, cb[off:off+(j-i)*rb])
		}
		i = j
	}
}

// ReadRow reads slot into dst (RowBytes bytes), with Read's rules.
func (m *Mirror) ReadRow(dst []byte, slot int32) {
	if len(dst) != m.rowBytes {
		panicLen("ReadRow", len(dst), 1, m.rowBytes)
	}
	if slot < 0 {
		clear(dst)
		return
	}
	if src := m.readable(slot); src != nil {
		copy(dst, src)
	} else {
		clear(dst)
	}
}

// readable returns the row of slot s (0 <= s), or nil if its chunk was
// never allocated.
func (m *Mirror) readable(s int32) []byte {
	if int(s) >= m.numSlots {
		panicSlot(s, m.numSlots)
	}
	b := m.chunkR(uint32(s) >> m.rowShift)
	if b == nil {
		return nil
	}
	off := int(uint32(s)&m.rowMask) * m.rowBytes
	return b[off : off+m.rowBytes]
}

// chunkR returns chunk c's rows, or nil if it was never allocated.
func (m *Mirror) chunkR(c uint32) []byte {
	lf := m.top[c>>m.leafShift].Load()
	if lf == nil {
		return nil
	}
	ch := (*lf)[c&m.leafMask].Load()
	if ch == nil {
		return nil
	}
	return ch.b
}

// writable returns the row of slot s (0 <= s), allocating its leaf and
// chunk if needed.
func (m *Mirror) writable(s int32) []byte {
	if int(s) >= m.numSlots {
		panicSlot(s, m.numSlots)
	}
	b := m.chunkW(uint32(s) >> m.rowShift)
	off := int(uint32(s)&m.rowMask) * m.rowBytes
	return b[off : off+m.rowBytes]
}

// chunkW returns chunk c's rows, allocating its leaf and chunk if needed.
// It panics when the OS refuses the chunk's memory (Prepare returns that
// as an error instead). Writer goroutine only.
func (m *Mirror) chunkW(c uint32) []byte {
	b, err := m.makeChunk(c)
	if err != nil {
		panic(err)
	}
	return b
}

// makeChunk is chunkW returning a refused mapping as an error.
func (m *Mirror) makeChunk(c uint32) ([]byte, error) {
	lf := m.top[c>>m.leafShift].Load()
	if lf == nil {
		lf = m.newLeaf(c >> m.leafShift)
	}
	ch := (*lf)[c&m.leafMask].Load()
	if ch == nil {
		var err error
		if ch, err = m.newChunk(lf, c); err != nil {
			return nil, err
		}
	}
	return ch.b, nil
}

// Prepare makes the memory of every row that slots (negative ones
// skipped) name, so that writing them allocates nothing: when the OS
// refuses a chunk's memory (an address-space limit such as ulimit -v) it
// returns an error wrapping ErrNoMemory, where Write would panic. Rows
// already made stay as they are. Writer goroutine only.
func (m *Mirror) Prepare(slots []int32) error {
	cc := ^uint32(0)
	for _, s := range slots {
		if s < 0 {
			continue
		}
		if int(s) >= m.numSlots {
			panicSlot(s, m.numSlots)
		}
		if c := uint32(s) >> m.rowShift; c != cc {
			if _, err := m.makeChunk(c); err != nil {
				return err
			}
			cc = c
		}
	}
	return nil
}

// newLeaf makes and publishes leaf l. The last leaf holds only the chunks
// that exist.
func (m *Mirror) newLeaf(l uint32) *leaf {
	n := min(1<<m.leafShift, m.numChunks-int(l)<<m.leafShift)
	lf := make(leaf, n)
	m.top[l].Store(&lf)
	return &lf
}

// newChunk makes chunk c, publishes it in its leaf and accounts for it. The
// last chunk holds only the rows that exist.
func (m *Mirror) newChunk(lf *leaf, c uint32) (*chunk, error) {
	rows := min(1<<m.rowShift, m.numSlots-int(c)<<m.rowShift)
	// Straight from the OS (zero, untouched until written: a make that
	// reuses freed heap memory would clear all of it first), never Go heap
	// memory (see hostmem.Map). A chunk of 2 MiB or more is huge-page
	// aligned and advised (Linux): its first write faults once per 2 MiB
	// instead of once per 4 KiB page.
	alloc := hostmem.AllocHuge
	if !hugeChunks {
		alloc = hostmem.Map
	}
	b, err := alloc(rows * m.rowBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %d of %d bytes: %w", ErrNoMemory, c, rows*m.rowBytes, err)
	}
	ch := &chunk{b: b}
	if m.hooks.Made != nil {
		m.hooks.Made(ch.b)
	}
	(*lf)[c&m.leafMask].Store(ch)
	m.resident.Add(int64(len(ch.b)))
	return ch, nil
}

// Free returns every chunk's memory to the OS. The mirror must not be used
// afterwards (by any goroutine); it reads as empty if it is.
func (m *Mirror) Free() {
	for i := range m.top {
		lf := m.top[i].Load()
		if lf == nil {
			continue
		}
		for j := range *lf {
			if ch := (*lf)[j].Load(); ch != nil {
				(*lf)[j].Store(nil)
				if m.hooks.Freed != nil {
					m.hooks.Freed(ch.b)
				}
				hostmem.Free(ch.b)
			}
		}
		m.top[i].Store(nil)
	}
	m.resident.Store(0)
}

func panicLen(op string, got, rows, rowBytes int) {
	panic(fmt.Sprintf("mirror: %s: buffer of %d bytes for %d rows of %d bytes", op, got, rows, rowBytes))
}

func panicSlot(s int32, numSlots int) {
	panic(fmt.Sprintf("mirror: slot %d out of range [0, %d)", s, numSlots))
}
