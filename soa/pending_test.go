package soa

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPending(t *testing.T) {
	var p Pending
	require.Zero(t, p.Len())
	p.Append(130, 0, 0)
	p.Append(77, 0, 1)
	p.AppendSlots([]int32{131, 78, -1}, 1, 2)
	p.AppendSlots(nil, 2, 5)
	require.Equal(t, 5, p.Len())
	require.Equal(t, []int32{130, 77, 131, 78, -1}, p.Slot)
	require.Equal(t, []int32{0, 0, 1, 1, 1}, p.Step)
	require.Equal(t, []int32{0, 1, 2, 3, 4}, p.Offset)

	p.Reset()
	require.Zero(t, p.Len())
	require.Empty(t, p.Step)
	require.Empty(t, p.Offset)
	p.AppendSlots([]int32{9}, 3, 40)
	require.Equal(t, []int32{9}, p.Slot)
	require.Equal(t, []int32{3}, p.Step)
	require.Equal(t, []int32{40}, p.Offset)
}

func TestSteadyStateNoAllocs(t *testing.T) {
	o := NewOccupancy(4096)
	slots := make([]int32, 1024)
	for i := range slots {
		slots[i] = int32(i*3) % 4096
	}
	slots[5] = -1
	owner := uint64(1)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		owner++
		o.Claim(slots, owner, 0)
		o.ClaimRow(7, owner, 3)
		o.Commit(slots, owner)
		_, _ = o.Load(9)
		_ = o.Owns(9, owner)
	}))

	var p Pending
	for range 4 { // warm-up
		p.AppendSlots(slots, 0, 0)
		p.Append(1, 2, 3)
	}
	p.Reset()
	require.Zero(t, testing.AllocsPerRun(100, func() {
		p.Reset()
		for i := range 16 {
			p.AppendSlots(slots[:64], int32(i), int32(64*i))
		}
		for i := range 1024 {
			p.Append(int32(i), 0, int32(i))
		}
	}))
}
