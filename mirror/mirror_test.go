package mirror

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// fillRow fills row with a pattern derived from (slot, gen), never all zero.
// Rows longer than 64 KiB repeat their first 64 KiB block, each block
// tagged with its index, so that big rows stay cheap under -race.
func fillRow(row []byte, slot int32, gen int) {
	const block = 64 << 10
	x := uint64(slot)*0x9E3779B97F4A7C15 + uint64(gen)*0xBF58476D1CE4E5B9 + 1
	var w [8]byte
	for i := 0; i < min(len(row), block); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x|0x0101010101010101)
		copy(row[i:], w[:])
	}
	for i := block; i < len(row); i += block {
		copy(row[i:], row[:block])
		binary.LittleEndian.PutUint32(w[:], uint32(i/block))
		copy(row[i:], w[:4])
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		numSlots, rowBytes int
		want               error
	}{
		{0, 64, ErrNumSlots},
		{-1, 64, ErrNumSlots},
		{16, 0, ErrRowBytes},
		{16, -5, ErrRowBytes},
		{maxSlots + 1, 1, ErrTooLarge},
		{3, math.MaxInt/2 + 1, ErrTooLarge},
		{1 << 20, math.MaxInt >> 19, ErrTooLarge},
	} {
		m, err := New(tc.numSlots, tc.rowBytes)
		require.Nil(t, m)
		require.ErrorIs(t, err, tc.want, "New(%d, %d)", tc.numSlots, tc.rowBytes)
		require.Contains(t, err.Error(), strconv.Itoa(tc.numSlots))
	}
}

func TestGeometry(t *testing.T) {
	for _, tc := range []struct{ numSlots, rowBytes int }{
		{1, 1}, {10, 64}, {1000, 3000}, {16 << 20, 4096}, {4, 3 << 20},
		{maxSlots, 1}, {maxSlots, 4 << 20}, {1<<31 - 1, chunkTarget}, {7, chunkTarget + 1},
	} {
		t.Run(fmt.Sprintf("slots=%d/row=%d", tc.numSlots, tc.rowBytes), func(t *testing.T) {
			m, err := New(tc.numSlots, tc.rowBytes)
			require.NoError(t, err)
			require.Equal(t, tc.numSlots, m.NumSlots())
			require.Equal(t, tc.rowBytes, m.RowBytes())
			require.Zero(t, m.ResidentBytes())
			rpc := 1 << m.rowShift
			require.Equal(t, uint32(rpc-1), m.rowMask)
			if tc.rowBytes <= chunkTarget {
				// The largest power of two of rows that fits a chunk.
				require.LessOrEqual(t, rpc*tc.rowBytes, chunkTarget)
				require.Greater(t, 2*rpc*tc.rowBytes, chunkTarget)
			} else {
				require.Equal(t, 1, rpc)
			}
			require.Equal(t, (tc.numSlots+rpc-1)/rpc, m.numChunks)
			require.LessOrEqual(t, len(m.top), maxTop)
			require.GreaterOrEqual(t, m.leafShift, uint(minLeafShift))
			require.Equal(t, (m.numChunks+1<<m.leafShift-1)>>m.leafShift, len(m.top))
			for i := range m.top {
				require.Nil(t, m.top[i].Load())
			}
		})
	}
}

// model is a Mirror's expected content.
type model map[int32][]byte

func (md model) check(t *testing.T, m *Mirror) {
	t.Helper()
	rb := m.RowBytes()
	row := make([]byte, rb)
	zero := make([]byte, rb)
	for s, want := range md {
		m.ReadRow(row, s)
		require.True(t, bytes.Equal(want, row), "slot %d", s)
	}
	// Batched reads: all written slots, plus unwritten and negative ones.
	var slots []int32
	for s := range md {
		slots = append(slots, s)
	}
	for range 16 {
		s := rand.Int32N(int32(m.NumSlots()))
		if _, ok := md[s]; !ok {
			slots = append(slots, s)
		}
	}
	slots = append(slots, -1, int32(m.NumSlots()-1))
	dst := bytes.Repeat([]byte{0xEE}, len(slots)*rb)
	m.Read(dst, slots)
	for i, s := range slots {
		want, ok := md[s]
		if !ok {
			want = zero
		}
		require.True(t, bytes.Equal(want, dst[i*rb:(i+1)*rb]), "row %d slot %d", i, s)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct{ numSlots, rowBytes int }{
		{1, 1}, {10, 64}, {1000, 3000}, {5000, 4096}, {70000, 33}, {6, 3 << 20}, {3, chunkTarget},
	} {
		t.Run(fmt.Sprintf("slots=%d/row=%d", tc.numSlots, tc.rowBytes), func(t *testing.T) {
			m, err := New(tc.numSlots, tc.rowBytes)
			require.NoError(t, err)
			rb := tc.rowBytes
			md := model{}
			for gen := range 3 {
				n := min(tc.numSlots, 64)
				slots := make([]int32, n)
				rows := make([]byte, n*rb)
				for i := range slots {
					slots[i] = rand.Int32N(int32(tc.numSlots))
					if i == 0 {
						slots[i] = int32(tc.numSlots - 1) // the short last chunk
					}
					if i%7 == 3 {
						slots[i] = -1
					}
					fillRow(rows[i*rb:(i+1)*rb], slots[i], gen)
				}
				m.Write(slots, rows)
				for i, s := range slots {
					if s >= 0 {
						md[s] = rows[i*rb : (i+1)*rb]
					}
				}
				// And one row at a time.
				s := rand.Int32N(int32(tc.numSlots))
				row := make([]byte, rb)
				fillRow(row, s, gen+100)
				m.WriteRow(s, row)
				md[s] = row
				md.check(t, m)
			}
			require.LessOrEqual(t, m.ResidentBytes(), int64(tc.numSlots*rb))
		})
	}
}

func TestLastWins(t *testing.T) {
	m, err := New(100, 16)
	require.NoError(t, err)
	slots := []int32{5, 7, 5, 9, 5}
	rows := make([]byte, len(slots)*16)
	for i := range slots {
		fillRow(rows[i*16:(i+1)*16], slots[i], i)
	}
	m.Write(slots, rows)
	got := make([]byte, 16)
	m.ReadRow(got, 5)
	require.Equal(t, rows[4*16:], got)
	m.ReadRow(got, 7)
	require.Equal(t, rows[16:32], got)
}

func TestNegativeSlots(t *testing.T) {
	m, err := New(1<<20, 4096)
	require.NoError(t, err)
	rows := bytes.Repeat([]byte{0xAB}, 3*4096)
	// All negative: nothing written, nothing allocated.
	m.Write([]int32{-1, -7, math.MinInt32}, rows)
	m.WriteRow(-3, rows[:4096])
	require.Zero(t, m.ResidentBytes())

	m.Write([]int32{-1, 10, -1}, rows)
	dst := bytes.Repeat([]byte{0xCD}, 3*4096)
	m.Read(dst, []int32{-1, 10, -2})
	require.Equal(t, make([]byte, 4096), dst[:4096])
	require.Equal(t, rows[4096:8192], dst[4096:8192])
	require.Equal(t, make([]byte, 4096), dst[8192:])

	row := bytes.Repeat([]byte{0xCD}, 4096)
	m.ReadRow(row, -1)
	require.Equal(t, make([]byte, 4096), row)
}

func TestNeverWrittenReadsZero(t *testing.T) {
	m, err := New(16<<20, 4096)
	require.NoError(t, err)
	rpc := int32(1) << m.rowShift
	dst := bytes.Repeat([]byte{0x5A}, 4*4096)
	m.Read(dst, []int32{0, 12345, 16<<20 - 1, rpc})
	require.Equal(t, make([]byte, len(dst)), dst)
	require.Zero(t, m.ResidentBytes())

	// One chunk written: its other rows and every other chunk read as zeros,
	// and reading allocates nothing.
	row := bytes.Repeat([]byte{0x11}, 4096)
	m.WriteRow(3, row)
	res := m.ResidentBytes()
	require.Equal(t, int64(rpc)*4096, res)
	for i := range dst {
		dst[i] = 0x5A
	}
	m.Read(dst, []int32{4, rpc, 5 * rpc, 16<<20 - 1})
	require.Equal(t, make([]byte, len(dst)), dst)
	require.Equal(t, res, m.ResidentBytes())
	require.Zero(t, testing.AllocsPerRun(10, func() { m.Read(dst, []int32{4, rpc, 5 * rpc, 16<<20 - 1}) }))
	require.Equal(t, res, m.ResidentBytes())
}

// rss returns the process's resident bytes from /proc/self/statm.
func rss() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}

func TestLazy64GiB(t *testing.T) {
	const numSlots, rowBytes = 16 << 20, 4096 // 64 GiB
	row := bytes.Repeat([]byte{0x77}, rowBytes)
	dst := make([]byte, rowBytes)
	// GC, and hand freed memory back to the OS, so that the earlier tests'
	// garbage neither inflates the baseline nor shrinks under our feet.
	runtime.GC()
	debug.FreeOSMemory()
	before, haveRSS := rss()

	m, err := New(numSlots, rowBytes)
	require.NoError(t, err)
	require.Zero(t, m.ResidentBytes())
	rpc := int32(1) << m.rowShift
	chunkBytes := int64(rpc) * rowBytes
	// Rows in three chunks: the first (three rows), one in the middle of
	// the first leaf, and the last one (in the last leaf).
	written := []int32{0, 1, rpc - 1, 1000*rpc + 17, numSlots - 1}
	for _, s := range written {
		m.WriteRow(s, row)
	}
	require.Equal(t, 3*chunkBytes, m.ResidentBytes())
	for _, s := range written {
		m.ReadRow(dst, s)
		require.Equal(t, row, dst)
	}
	m.ReadRow(dst, 5000*rpc)
	require.Equal(t, make([]byte, rowBytes), dst)
	require.Equal(t, 3*chunkBytes, m.ResidentBytes())

	if !haveRSS {
		t.Skip("/proc/self/statm unreadable: RSS part skipped")
	}
	runtime.GC()
	debug.FreeOSMemory()
	after, _ := rss()
	const slack = 1 << 20 // the directory, the runtime's own bookkeeping
	t.Logf("RSS %d -> %d (+%d), resident %d", before, after, after-before, m.ResidentBytes())
	require.LessOrEqual(t, after-before, m.ResidentBytes()+slack)
	runtime.KeepAlive(m)
}

// TestConcurrentReaders runs readers of committed slots while the writer
// writes other slots and allocates new chunks; run it under -race. Slots
// 4k+3 are never written: readers probe them (in chunks being allocated)
// and must read zeros.
func TestConcurrentReaders(t *testing.T) {
	const numSlots, rowBytes = 512, 64 << 10 // 32 rows per chunk, 16 chunks
	m, err := New(numSlots, rowBytes)
	require.NoError(t, err)
	var order []int32
	for s := range int32(numSlots) {
		if s%4 != 3 {
			order = append(order, s)
		}
	}
	src := make([]byte, numSlots*rowBytes) // slot s's row at s*rowBytes
	for s := range int32(numSlots) {
		fillRow(src[int(s)*rowBytes:int(s+1)*rowBytes], s, 0)
	}
	var committed atomic.Int32 // order[:committed] are committed
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			dst := make([]byte, 3*rowBytes)
			zero := make([]byte, rowBytes)
			for !done.Load() {
				n := committed.Load()
				never := 4*rng.Int32N(numSlots/4) + 3
				if n == 0 {
					m.ReadRow(dst[:rowBytes], never)
					if !bytes.Equal(dst[:rowBytes], zero) {
						errs <- fmt.Errorf("never-written slot %d not zero", never)
						return
					}
					continue
				}
				s := order[rng.Int32N(n)]
				m.Read(dst, []int32{s, never, -1})
				if !bytes.Equal(dst[:rowBytes], src[int(s)*rowBytes:int(s+1)*rowBytes]) {
					errs <- fmt.Errorf("committed slot %d: wrong row", s)
					return
				}
				if !bytes.Equal(dst[rowBytes:2*rowBytes], zero) || !bytes.Equal(dst[2*rowBytes:], zero) {
					errs <- fmt.Errorf("never-written slot %d or negative slot not zero", never)
					return
				}
			}
		})
	}
	rows := make([]byte, 2*rowBytes)
	for i := 0; i < len(order); i += 2 {
		s0, s1 := int(order[i]), int(order[i+1])
		copy(rows[:rowBytes], src[s0*rowBytes:])
		copy(rows[rowBytes:], src[s1*rowBytes:])
		m.Write(order[i:i+2], rows)
		committed.Store(int32(i + 2))
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Equal(t, int64(numSlots*rowBytes), m.ResidentBytes())
}

func requirePanicsMirror(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		require.NotNil(t, r, "no panic")
		msg := fmt.Sprint(r)
		require.True(t, strings.HasPrefix(msg, "mirror: "), "panic %q", msg)
	}()
	f()
}

func TestPanics(t *testing.T) {
	m, err := New(100, 8)
	require.NoError(t, err)
	row := make([]byte, 8)
	for name, f := range map[string]func(){
		"Write short":      func() { m.Write([]int32{1, 2}, make([]byte, 15)) },
		"Write long":       func() { m.Write([]int32{1}, make([]byte, 9)) },
		"Read short":       func() { m.Read(make([]byte, 7), []int32{1}) },
		"Read long":        func() { m.Read(make([]byte, 24), []int32{1, 2}) },
		"WriteRow len":     func() { m.WriteRow(1, make([]byte, 7)) },
		"ReadRow len":      func() { m.ReadRow(make([]byte, 9), 1) },
		"Write slot":       func() { m.Write([]int32{1, 100}, make([]byte, 16)) },
		"Read slot":        func() { m.Read(make([]byte, 16), []int32{1, 100}) },
		"WriteRow slot":    func() { m.WriteRow(100, row) },
		"ReadRow slot":     func() { m.ReadRow(row, math.MaxInt32) },
		"WriteRow max":     func() { m.WriteRow(math.MaxInt32, row) },
		"Write len+neg":    func() { m.Write([]int32{-1}, nil) },
		"Read nil+neg":     func() { m.Read(nil, []int32{-1}) },
		"Write empty rows": func() { m.Write(nil, row) },
	} {
		t.Run(name, func(t *testing.T) { requirePanicsMirror(t, f) })
	}
	// Empty calls are fine.
	m.Write(nil, nil)
	m.Read(nil, nil)
}

func TestNoAllocs(t *testing.T) {
	m, err := New(16<<20, 4096)
	require.NoError(t, err)
	slots := []int32{1, 1 << 20, -1, 5 << 20}
	rows := make([]byte, len(slots)*4096)
	m.Write(slots, rows) // warm-up: allocates the chunks
	require.Zero(t, testing.AllocsPerRun(20, func() {
		m.Write(slots, rows)
		m.Read(rows, slots)
		m.WriteRow(1, rows[:4096])
		m.ReadRow(rows[:4096], 2)
	}))
	// New: the header and the top level, whatever the size.
	require.LessOrEqual(t, testing.AllocsPerRun(20, func() { _, _ = New(16<<20, 4096) }), 2.0)
	require.LessOrEqual(t, testing.AllocsPerRun(20, func() { _, _ = New(maxSlots, 4<<20) }), 2.0)
}

func TestErrorsAreSentinels(t *testing.T) {
	_, err := New(0, 1)
	require.True(t, errors.Is(err, ErrNumSlots))
	require.True(t, strings.HasPrefix(ErrNumSlots.Error(), "mirror: "))
}

func TestFreeReturnsChunks(t *testing.T) {
	m, err := New(1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, 4096)
	row[0] = 7
	m.WriteRow(5, row)
	m.WriteRow(1<<19, row)
	if m.ResidentBytes() == 0 {
		t.Fatal("nothing resident after writes")
	}
	m.Free()
	if got := m.ResidentBytes(); got != 0 {
		t.Fatalf("resident %d after Free", got)
	}
	got := make([]byte, 4096)
	got[0] = 1
	m.ReadRow(got, 5)
	if got[0] != 0 {
		t.Fatal("a freed mirror must read as empty")
	}
}

// TestPrepareRefused: a chunk whose memory the OS refuses is ErrNoMemory
// from Prepare (Write would panic), makes nothing, and reads stay zero;
// once memory is there, Prepare makes it and Write allocates nothing.
func TestPrepareRefused(t *testing.T) {
	m, err := New(1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	sl := []int32{5, 6, -1, 1 << 19}
	undo := hostmem.RefuseFrom(1)
	err = m.Prepare(sl)
	undo()
	if !errors.Is(err, ErrNoMemory) || !errors.Is(err, hostmem.ErrNoMemory) || m.ResidentBytes() != 0 {
		t.Fatalf("Prepare with mappings refused: %v, %d bytes resident", err, m.ResidentBytes())
	}
	if err := m.Prepare(sl); err != nil {
		t.Fatal(err)
	}
	res := m.ResidentBytes()
	rows := bytes.Repeat([]byte{1}, len(sl)*16)
	m.Write(sl, rows)
	if m.ResidentBytes() != res {
		t.Fatalf("Write after Prepare allocated: %d bytes resident, then %d", res, m.ResidentBytes())
	}
}
