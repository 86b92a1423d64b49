// Package soa: placeholder (the real package lands from the mirror branch).
package soa

import "sync/atomic"

const (
	Absent    uint8 = 0
	InTransit uint8 = 1
	Committed uint8 = 2
)

func Pack(state uint8, owner uint64) uint64 { return owner<<2 | uint64(state) }
func Unpack(w uint64) (uint8, uint64)       { return uint8(w & 3), w >> 2 }

type Occupancy struct {
	word []uint64
	row  []uint32
}

func NewOccupancy(n int) *Occupancy {
	return &Occupancy{word: make([]uint64, n), row: make([]uint32, n)}
}
func (o *Occupancy) Len() int { return len(o.word) }
func (o *Occupancy) Word(s int32) uint64 {
	return atomic.LoadUint64(&o.word[s])
}
func (o *Occupancy) Load(s int32) (uint8, uint64) { return Unpack(o.Word(s)) }
func (o *Occupancy) Row(s int32) uint32           { return o.row[s] }
func (o *Occupancy) ClaimRow(s int32, owner uint64, row uint32) bool {
	st, ow := o.Load(s)
	atomic.StoreUint64(&o.word[s], Pack(InTransit, owner))
	o.row[s] = row
	return st == InTransit && ow != owner
}
func (o *Occupancy) Claim(slots []int32, owner uint64, firstRow uint32) int {
	n := 0
	for i, s := range slots {
		if s >= 0 && o.ClaimRow(s, owner, firstRow+uint32(i)) {
			n++
		}
	}
	return n
}
func (o *Occupancy) Owns(s int32, owner uint64) bool { return o.Word(s) == Pack(InTransit, owner) }
func (o *Occupancy) Commit(slots []int32, owner uint64) int {
	n := 0
	for _, s := range slots {
		if s >= 0 && atomic.CompareAndSwapUint64(&o.word[s], Pack(InTransit, owner), Pack(Committed, owner)) {
			n++
		}
	}
	return n
}

type Handle int32

const NoHandle Handle = -1

type Requests struct {
	ID        []int64
	HitTokens []int32
	HitOff    []int32
	HitN      []int32
	Flags     []uint32
	Aux       []int64
	Blocks    []int32
	pos       []int32
	handle    []int32
	freeH     []int32
	byID      map[int64]Handle
}

func NewRequests(capHint int) *Requests { return &Requests{byID: make(map[int64]Handle, capHint)} }
func (t *Requests) Len() int            { return len(t.ID) }
func (t *Requests) Add(id int64, hitTokens int32, blocks []int32) (Handle, bool) {
	if h, ok := t.byID[id]; ok {
		return h, false
	}
	var h Handle
	if n := len(t.freeH); n > 0 {
		h = Handle(t.freeH[n-1])
		t.freeH = t.freeH[:n-1]
	} else {
		h = Handle(len(t.pos))
		t.pos = append(t.pos, 0)
	}
	t.pos[h] = int32(len(t.ID))
	t.handle = append(t.handle, int32(h))
	t.ID = append(t.ID, id)
	t.HitTokens = append(t.HitTokens, hitTokens)
	t.HitOff = append(t.HitOff, int32(len(t.Blocks)))
	t.HitN = append(t.HitN, int32(len(blocks)))
	t.Blocks = append(t.Blocks, blocks...)
	t.Flags = append(t.Flags, 0)
	t.Aux = append(t.Aux, 0)
	t.byID[id] = h
	return h, true
}
func (t *Requests) Lookup(id int64) (Handle, bool) { h, ok := t.byID[id]; return h, ok }
func (t *Requests) Pos(h Handle) int               { return int(t.pos[h]) }
func (t *Requests) HitBlocks(h Handle) []int32 {
	p := t.pos[h]
	return t.Blocks[t.HitOff[p] : t.HitOff[p]+t.HitN[p]]
}
func (t *Requests) Remove(h Handle) {
	p := t.pos[h]
	last := int32(len(t.ID) - 1)
	delete(t.byID, t.ID[p])
	if p != last {
		t.ID[p], t.HitTokens[p], t.HitOff[p], t.HitN[p], t.Flags[p], t.Aux[p] = t.ID[last], t.HitTokens[last], t.HitOff[last], t.HitN[last], t.Flags[last], t.Aux[last]
		lh := t.handle[last]
		t.handle[p] = lh
		t.pos[lh] = p
	}
	t.ID, t.HitTokens, t.HitOff, t.HitN, t.Flags, t.Aux, t.handle = t.ID[:last], t.HitTokens[:last], t.HitOff[:last], t.HitN[:last], t.Flags[:last], t.Aux[:last], t.handle[:last]
	t.freeH = append(t.freeH, int32(h))
	if len(t.ID) == 0 {
		t.Blocks = t.Blocks[:0]
	}
}
func (t *Requests) Reset() { *t = *NewRequests(0) }

type Pending struct{ Slot, Step, Offset []int32 }

func (p *Pending) Append(slot, step, off int32) {
	p.Slot, p.Step, p.Offset = append(p.Slot, slot), append(p.Step, step), append(p.Offset, off)
}
func (p *Pending) AppendSlots(slots []int32, step, first int32) {
	for i, s := range slots {
		p.Append(s, step, first+int32(i))
	}
}
func (p *Pending) Len() int { return len(p.Slot) }
func (p *Pending) Reset()   { p.Slot, p.Step, p.Offset = p.Slot[:0], p.Step[:0], p.Offset[:0] }
