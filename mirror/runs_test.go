package mirror

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// runSlots returns n slots made of runs of consecutive slots (lengths 1 to
// 3 chunks, so that runs cross chunk ends and reach the short last chunk),
// with skipped (-1) slots inside runs and runs that overlap earlier ones
// (a slot written twice in one call: the last row wins).
func runSlots(rng *rand.Rand, n, numSlots, rowsPerChunk int) []int32 {
	slots := make([]int32, 0, n)
	for len(slots) < n {
		s := rng.IntN(numSlots)
		if rng.IntN(4) == 0 {
			s = max(0, numSlots-1-rng.IntN(2*rowsPerChunk)) // near the end
		}
		l := 1 + rng.IntN(3*rowsPerChunk)
		for k := 0; k < l && len(slots) < n && s+k < numSlots; k++ {
			if rng.IntN(16) == 0 {
				slots = append(slots, -1)
				continue
			}
			slots = append(slots, int32(s+k))
		}
	}
	return slots
}

// TestRuns checks the run copies (runEnd) against rows written and read
// one at a time (WriteRow, ReadRow, which copy no runs): Write, Read,
// WriteSplit and ReadSplit with slots in runs that cross chunks and the
// split groups.
func TestRuns(t *testing.T) {
	for _, tc := range []struct{ numSlots, rowBytes int }{
		{100, 64}, {70000, 64}, {37, 512 << 10}, {50, 1 << 20}, {9000, 3 << 10},
	} {
		t.Run(fmt.Sprintf("slots=%d/row=%d", tc.numSlots, tc.rowBytes), func(t *testing.T) {
			rb := tc.rowBytes
			w := NewWorkers(3, 1)
			defer w.Stop()
			got, err := New(tc.numSlots, rb) // Write / WriteSplit
			require.NoError(t, err)
			defer got.Free()
			want, err := New(tc.numSlots, rb) // WriteRow
			require.NoError(t, err)
			defer want.Free()
			perChunk := 1 << got.rowShift
			rng := rand.New(rand.NewPCG(uint64(rb), uint64(tc.numSlots)))
			for round := range 12 {
				n := 1 + rng.IntN(min(400, (16<<20)/rb)) // big rows: up to 16 MiB a round (under -race too)
				slots := runSlots(rng, n, tc.numSlots, perChunk)
				buf := make([]byte, len(slots)*rb)
				for i, s := range slots {
					fillRow(buf[i*rb:(i+1)*rb], s, round*1000+i)
				}
				if round%2 == 0 {
					got.Write(slots, buf)
				} else {
					got.WriteSplit(w, slots, buf)
				}
				for i, s := range slots {
					want.WriteRow(s, buf[i*rb:(i+1)*rb])
				}
				// Read the same runs back, and runs of other slots.
				reads := append(slots, runSlots(rng, min(64, (16<<20)/rb), tc.numSlots, perChunk)...)
				a := bytes.Repeat([]byte{0xEE}, len(reads)*rb)
				if round%3 == 0 {
					got.ReadSplit(w, a, reads)
				} else {
					got.Read(a, reads)
				}
				row := make([]byte, rb)
				for i, s := range reads {
					want.ReadRow(row, s)
					require.True(t, bytes.Equal(row, a[i*rb:(i+1)*rb]), "round %d: row %d (slot %d)", round, i, s)
				}
			}
			row, row2 := make([]byte, rb), make([]byte, rb)
			for s := range int32(tc.numSlots) {
				got.ReadRow(row, s)
				want.ReadRow(row2, s)
				require.True(t, bytes.Equal(row, row2), "slot %d", s)
			}
		})
	}
}

func TestRunEnd(t *testing.T) {
	slots := []int32{4, 5, 6, 8, 9, -1, 10, 11, 11, 12}
	for _, tc := range []struct {
		i   int
		end int32
		j   int
	}{
		{0, 100, 3}, {0, 6, 2}, {0, 5, 1}, {3, 100, 5}, {6, 100, 8}, {7, 100, 8}, {8, 100, 10}, {9, 13, 10},
	} {
		require.Equal(t, tc.j, runEnd(slots, tc.i, tc.end), "i=%d end=%d", tc.i, tc.end)
	}
}

// FuzzRuns checks Write and Read (and their split forms) against rows
// written and read one at a time, on slot lists decoded from the input: each
// byte pair is a run (start, length), so runs cross chunk ends, overlap,
// repeat and end at the mirror's last slot; 0xFF starts a skipped slot.
func FuzzRuns(f *testing.F) {
	f.Add([]byte{0, 4, 3, 9, 0xFF, 0, 60, 8})
	f.Add([]byte{250, 20, 10, 3, 10, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		const numSlots, rb = 70, 64 << 10 // 32 rows a chunk
		var slots []int32
		for i := 0; i+1 < len(in) && len(slots) < 256; i += 2 {
			if in[i] == 0xFF {
				slots = append(slots, -1)
				continue
			}
			s := int(in[i]) % numSlots
			for k := 0; k < int(in[i+1]%80) && s+k < numSlots; k++ {
				slots = append(slots, int32(s+k))
			}
		}
		got, err := New(numSlots, rb)
		require.NoError(t, err)
		defer got.Free()
		want, err := New(numSlots, rb)
		require.NoError(t, err)
		defer want.Free()
		w := NewWorkers(3, 1)
		defer w.Stop()
		buf := make([]byte, len(slots)*rb)
		for i, s := range slots {
			fillRow(buf[i*rb:(i+1)*rb], s, i)
		}
		if len(in)%2 == 0 {
			got.Write(slots, buf)
		} else {
			got.WriteSplit(w, slots, buf)
		}
		for i, s := range slots {
			want.WriteRow(s, buf[i*rb:(i+1)*rb])
		}
		a := bytes.Repeat([]byte{0xEE}, len(slots)*rb)
		got.ReadSplit(w, a, slots)
		b := make([]byte, len(slots)*rb)
		got.Read(b, slots)
		row := make([]byte, rb)
		for i, s := range slots {
			want.ReadRow(row, s)
			require.True(t, bytes.Equal(row, a[i*rb:(i+1)*rb]), "ReadSplit row %d (slot %d)", i, s)
			require.True(t, bytes.Equal(row, b[i*rb:(i+1)*rb]), "Read row %d (slot %d)", i, s)
		}
	})
}
