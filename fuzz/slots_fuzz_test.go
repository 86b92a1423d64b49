package fuzz

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/omnicache/omnicache/slots"
)

// canary fills the memory after a destination; no implementation may touch it.
const canary = int32(-0x5a5a5a5b)

// result is what one implementation did with one input.
type result struct {
	n   int
	err string
	buf []int32 // dst followed by canaries
}

// eachImplementation runs f once per implementation of package slots,
// "generic" (the reference) first.
func eachImplementation(t *testing.T, f func(name string) result) map[string]result {
	t.Helper()
	names := slots.Implementations()
	slices.SortStableFunc(names, func(a, b string) int {
		switch {
		case a == "generic":
			return -1
		case b == "generic":
			return 1
		}
		return 0
	})
	out := map[string]result{}
	for _, name := range names {
		restore, ok := slots.Select(name)
		if !ok {
			t.Fatalf("slots.Select(%q) failed for a listed implementation", name)
		}
		out[name] = f(name)
		restore()
	}
	return out
}

// compare checks every implementation's result against the reference's.
func compare(t *testing.T, results map[string]result, dstLen int) {
	t.Helper()
	ref := results["generic"]
	for i := ref.n; i < len(ref.buf); i++ {
		if ref.buf[i] != canary {
			t.Fatalf("generic: wrote buf[%d] past its %d slots (len(dst) %d, err %q)", i, ref.n, dstLen, ref.err)
		}
	}
	for name, r := range results {
		if r.n != ref.n || r.err != ref.err {
			t.Fatalf("%s: n %d, err %q; generic: n %d, err %q", name, r.n, r.err, ref.n, ref.err)
		}
		if !slices.Equal(r.buf, ref.buf) {
			for j := range r.buf {
				if r.buf[j] != ref.buf[j] {
					t.Fatalf("%s: buf[%d] = %d, generic %d (n %d, len(dst) %d)", name, j, r.buf[j], ref.buf[j], r.n, dstLen)
				}
			}
		}
	}
}

func withCanaries(n int) []int32 {
	buf := make([]int32, n+17)
	for i := range buf {
		buf[i] = canary
	}
	return buf
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// batchFrom decodes a batch: 5 bytes per request (row int8, start and count
// little-endian int16). With fit set, rows, starts and counts are folded into
// the table so that most batches are valid.
func batchFrom(reqs []byte, table []int32, stride, blockSize int, fit bool) slots.Batch {
	n := len(reqs) / 5
	b := slots.Batch{Rows: make([]int32, n), Start: make([]int32, n), Count: make([]int32, n), Table: table, Stride: stride}
	rows, positions := 0, int64(0)
	if stride > 0 && blockSize > 0 {
		rows = len(table) / stride
		positions = min(int64(stride)*int64(blockSize), 1<<31-1)
	}
	for i := range n {
		r := reqs[5*i:]
		row := int32(int8(r[0]))
		start := int32(int16(binary.LittleEndian.Uint16(r[1:])))
		count := int32(int16(binary.LittleEndian.Uint16(r[3:])))
		if fit && rows > 0 && positions > 0 {
			row = int32(uint32(row) % uint32(rows))
			s := int64(uint32(start)) % positions
			switch {
			case count&3 != 0: // mostly decodes
				count = 1
			default:
				count = int32(int64(uint32(count)) % (positions - s + 1))
			}
			start = int32(s)
		}
		b.Rows[i], b.Start[i], b.Count[i] = row, start, count
	}
	return b
}

func blocks(seed uint64, n int) []int32 {
	rng := rand.New(rand.NewPCG(seed, ^seed))
	t := make([]int32, n)
	for i := range t {
		if seed&1 == 0 {
			t[i] = rng.Int32N(1 << 16)
		} else {
			t[i] = int32(rng.Uint32())
		}
	}
	return t
}

// FuzzMap compares slots.Map of every implementation with the reference:
// count, error, every slot, and the canaries after the destination.
func FuzzMap(f *testing.F) {
	decodes := make([]byte, 0, 5*40)
	for i := range 40 {
		decodes = append(decodes, byte(i), byte(i*7), byte(i), 1, 0)
	}
	f.Add(16, 64, uint16(4096), uint16(40), uint64(1), true, decodes)
	f.Add(3, 100, uint16(2000), uint16(3000), uint64(2), true, []byte{1, 0, 0, 0, 4, 2, 5, 0, 1, 0, 3, 17, 0, 33, 0})
	f.Add(48, 7, uint16(70), uint16(500), uint64(3), false, []byte{1, 0, 0, 0, 1, 9, 0, 0, 1, 0})
	f.Add(0, 7, uint16(70), uint16(500), uint64(4), false, []byte{1, 0, 0, 0, 1})
	f.Add(1<<20+1, 5, uint16(10), uint16(500), uint64(5), true, decodes[:85])
	f.Fuzz(func(t *testing.T, blockSize, stride int, tableLen, dstLen uint16, seed uint64, fit bool, reqs []byte) {
		table := blocks(seed, int(tableLen))
		b := batchFrom(reqs, table, stride, blockSize, fit)
		results := eachImplementation(t, func(string) result {
			buf := withCanaries(int(dstLen))
			n, err := slots.Map(buf[:dstLen], b, blockSize)
			return result{n, errString(err), buf}
		})
		compare(t, results, int(dstLen))
	})
}

// FuzzExpand compares slots.Expand of every implementation with the
// reference.
func FuzzExpand(f *testing.F) {
	f.Add(16, 40, uint16(64), uint16(40), uint64(1))
	f.Add(3, 1000, uint16(2000), uint16(1024), uint64(2))
	f.Add(48, 97, uint16(3), uint16(100), uint64(3))
	f.Add(-1, 1, uint16(3), uint16(100), uint64(4))
	f.Fuzz(func(t *testing.T, blockSize, tokens int, nblocks, dstLen uint16, seed uint64) {
		bl := blocks(seed, int(nblocks))
		results := eachImplementation(t, func(string) result {
			buf := withCanaries(int(dstLen))
			n, err := slots.Expand(buf[:dstLen], bl, blockSize, tokens)
			return result{n, errString(err), buf}
		})
		compare(t, results, int(dstLen))
	})
}
