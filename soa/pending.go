package soa

import "slices"

// Pending holds the rows parked by the decode buffer, one entry per parked
// token row, in the order they were parked. The zero value is ready; Reset
// keeps the columns' capacity, so appends are allocation-free after
// warm-up. Single goroutine (the caller's lock).
type Pending struct {
	Slot   []int32 // KV slot of the row
	Step   []int32 // index of the buffered step
	Offset []int32 // row offset into the parked storage
}

// Append parks one row.
func (p *Pending) Append(slot, step, offset int32) {
	p.Slot = append(p.Slot, slot)
	p.Step = append(p.Step, step)
	p.Offset = append(p.Offset, offset)
}

// AppendSlots parks one row per slot of one step, at offsets firstOffset+i.
// Slots are copied as given (negative ones included).
func (p *Pending) AppendSlots(slots []int32, step int32, firstOffset int32) {
	n, k := len(p.Slot), len(slots)
	p.Slot = append(p.Slot, slots...)
	p.Step = slices.Grow(p.Step, k)[:n+k]
	p.Offset = slices.Grow(p.Offset, k)[:n+k]
	st, off := p.Step[n:n+k], p.Offset[n:n+k]
	for i := range st {
		st[i] = step
		off[i] = firstOffset + int32(i)
	}
}

// Len returns the number of parked rows.
func (p *Pending) Len() int { return len(p.Slot) }

// Reset forgets every parked row, keeping the columns' capacity.
func (p *Pending) Reset() {
	p.Slot, p.Step, p.Offset = p.Slot[:0], p.Step[:0], p.Offset[:0]
}
