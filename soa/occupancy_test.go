package soa

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPackUnpack(t *testing.T) {
	for _, owner := range []uint64{0, 1, 2, 12345, MaxOwner} {
		for _, st := range []uint8{Absent, InTransit, Committed} {
			w := Pack(st, owner)
			require.Equal(t, owner<<2|uint64(st), w)
			gs, go_ := Unpack(w)
			require.Equal(t, st, gs)
			require.Equal(t, owner, go_)
		}
	}
	require.Zero(t, Pack(Absent, 0), "the zero word is Absent")
}

func requireSlot(t *testing.T, o *Occupancy, s int32, state uint8, owner uint64) {
	t.Helper()
	gs, gowner := o.Load(s)
	require.Equal(t, state, gs, "slot %d state", s)
	require.Equal(t, owner, gowner, "slot %d owner", s)
	require.Equal(t, Pack(state, owner), o.Word(s))
}

func TestOccupancyClaimCommit(t *testing.T) {
	o := must(NewOccupancy(16))
	require.Equal(t, 16, o.Len())
	for s := range int32(16) {
		requireSlot(t, o, s, Absent, 0)
	}

	// Owner 1 claims fresh slots: nothing stolen; rows firstRow+i, negative
	// slots skipped but their row numbers consumed.
	require.Zero(t, o.Claim([]int32{0, 1, -1, 2, 3}, 1, 100))
	for i, s := range []int32{0, 1, -1, 2, 3} {
		if s < 0 {
			continue
		}
		requireSlot(t, o, s, InTransit, 1)
		require.Equal(t, uint32(100+i), o.Row(s))
		require.True(t, o.Owns(s, 1))
		require.False(t, o.Owns(s, 2))
	}
	requireSlot(t, o, 4, Absent, 0)

	// Owner 1 again on its own slot: not a steal. Owner 2 steals 2 and 3
	// (3 listed twice: counted once) and claims fresh 4.
	require.Zero(t, o.Claim([]int32{1}, 1, 7))
	require.Equal(t, uint32(7), o.Row(1))
	require.Equal(t, 2, o.Claim([]int32{2, 3, 3, 4}, 2, 0))
	require.Equal(t, uint32(2), o.Row(3), "last claim of a repeated slot sets its row")
	require.False(t, o.Owns(2, 1))
	require.True(t, o.Owns(2, 2))

	// Owner 1 commits: only 0 and 1 (still its own) flip; 2, 3 stay with 2.
	require.Equal(t, 2, o.Commit([]int32{0, 1, 2, 3, -1, -5}, 1))
	requireSlot(t, o, 0, Committed, 1)
	requireSlot(t, o, 1, Committed, 1)
	requireSlot(t, o, 2, InTransit, 2)
	requireSlot(t, o, 3, InTransit, 2)
	require.False(t, o.Owns(0, 1), "committed is not owned")
	// Committing twice flips nothing.
	require.Zero(t, o.Commit([]int32{0, 1}, 1))

	// Claiming a committed slot is not a steal.
	require.Zero(t, o.Claim([]int32{0}, 3, 0))
	requireSlot(t, o, 0, InTransit, 3)

	require.Equal(t, 3, o.Commit([]int32{2, 3, 4, 3}, 2), "a repeated slot flips once")
	requireSlot(t, o, 4, Committed, 2)

	// ClaimRow.
	require.False(t, o.ClaimRow(5, 4, 42))
	require.Equal(t, uint32(42), o.Row(5))
	require.True(t, o.ClaimRow(5, 5, 43))
	require.False(t, o.ClaimRow(5, 5, 44))
	require.False(t, o.ClaimRow(-1, 5, 44))
	require.False(t, o.ClaimRow(4, 5, 45), "committed slot: not stolen")
	requireSlot(t, o, 5, InTransit, 5)

	o.Reset(5)
	requireSlot(t, o, 5, Absent, 0)
	require.Zero(t, o.Commit([]int32{5}, 5))
}

func TestOccupancyOwnerRange(t *testing.T) {
	o := must(NewOccupancy(4))
	for _, owner := range []uint64{0, MaxOwner + 1, 1 << 63, ^uint64(0)} {
		require.PanicsWithValue(t, "soa: owner "+strconv.FormatUint(owner, 10)+" outside [1, 1<<62)", func() { o.Claim([]int32{1}, owner, 0) })
		require.Panics(t, func() { o.ClaimRow(1, owner, 0) })
	}
	require.NotPanics(t, func() { o.Claim([]int32{1}, MaxOwner, 0) })
	requireSlot(t, o, 1, InTransit, MaxOwner)
	require.Equal(t, 1, o.Commit([]int32{1}, MaxOwner))
	requireSlot(t, o, 1, Committed, MaxOwner)
}

// TestOccupancyConcurrent runs Claim (engine) and Commit (committer) on two
// goroutines and readers on others, under -race. Every claim of a slot ends
// at least one way: its owner commits it, or a later owner steals it while
// in transit (a Commit landing between a steal's load and store counts
// both: see Claim), so the flips plus the steals are at least the slots
// claimed; the flips alone never exceed them; no slot stays in transit.
func TestOccupancyConcurrent(t *testing.T) {
	const numSlots, owners, batch = 256, 2000, 48
	o := must(NewOccupancy(numSlots))
	batches := make([][]int32, owners+1)
	claimed := 0
	rng := rand.New(rand.NewPCG(7, 7))
	for g := 1; g <= owners; g++ {
		seen := map[int32]bool{}
		for range batch {
			s := rng.Int32N(numSlots)
			if rng.IntN(10) == 0 {
				s = -1
			}
			batches[g] = append(batches[g], s)
			if s >= 0 && !seen[s] {
				seen[s] = true
				claimed++
			}
		}
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			last := make([]uint64, numSlots) // owners only grow per slot
			for {
				select {
				case <-done:
					return
				default:
				}
				s := rng.Int32N(numSlots)
				st, owner := o.Load(s)
				if st > Committed || (st == Absent) != (owner == 0) || owner < last[s] {
					t.Errorf("slot %d: bad word state %d owner %d (last owner %d)", s, st, owner, last[s])
					return
				}
				last[s] = owner
			}
		})
	}
	toCommit := make(chan uint64, 64)
	flipped := 0
	wg.Go(func() {
		for g := range toCommit {
			flipped += o.Commit(batches[g], g)
		}
	})
	stolen := 0
	for g := uint64(1); g <= owners; g++ {
		stolen += o.Claim(batches[g], g, 0)
		toCommit <- g
	}
	close(toCommit)
	close(done)
	wg.Wait()
	require.GreaterOrEqual(t, flipped+stolen, claimed, "a claim that neither landed nor was stolen")
	require.LessOrEqual(t, flipped, claimed, "more commits than claims")
	for s := range int32(numSlots) {
		st, _ := o.Load(s)
		require.NotEqual(t, InTransit, st, "slot %d left in transit", s)
	}
}

// MarkAbsent steals in-transit slots (the old owner's Commit then fails),
// turns committed slots absent, and counts only the steals.
func TestOccupancyMarkAbsent(t *testing.T) {
	o := must(NewOccupancy(8))
	defer o.Free()
	o.Claim([]int32{0, 1, 2}, 7, 0)
	o.Commit([]int32{2}, 7)
	require.Equal(t, 2, o.MarkAbsent([]int32{0, 1, 2, 3, -1}), "slots 0 and 1 were in transit")
	for s := int32(0); s < 4; s++ {
		requireSlot(t, o, s, Absent, 0)
	}
	require.Zero(t, o.Commit([]int32{0, 1}, 7), "the old owner's commit skips the stolen slots")
	requireSlot(t, o, 0, Absent, 0)
	require.False(t, o.Owns(1, 7))
	o.Claim([]int32{0}, 9, 0)
	require.Equal(t, 1, o.Commit([]int32{0}, 9), "a newer claim after the absence commits")
	requireSlot(t, o, 0, Committed, 9)
}

// must returns v, panicking on err (a table the test cannot map).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
