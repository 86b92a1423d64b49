// Package mirror: placeholder (the real package lands from the mirror branch).
package mirror

import (
	"errors"
	"sync/atomic"
)

var ErrSize = errors.New("mirror: bad size")

type Mirror struct {
	n, rb int
	mem   atomic.Pointer[[]byte]
}

func New(numSlots, rowBytes int) (*Mirror, error) {
	if numSlots <= 0 || rowBytes <= 0 {
		return nil, ErrSize
	}
	return &Mirror{n: numSlots, rb: rowBytes}, nil
}
func (m *Mirror) RowBytes() int { return m.rb }
func (m *Mirror) NumSlots() int { return m.n }
func (m *Mirror) get() []byte {
	if p := m.mem.Load(); p != nil {
		return *p
	}
	b := make([]byte, m.n*m.rb)
	m.mem.Store(&b)
	return b
}
func (m *Mirror) Write(slots []int32, rows []byte) {
	mem := m.get()
	for i, s := range slots {
		if s >= 0 {
			copy(mem[int(s)*m.rb:int(s+1)*m.rb], rows[i*m.rb:])
		}
	}
}
func (m *Mirror) Read(dst []byte, slots []int32) {
	p := m.mem.Load()
	for i, s := range slots {
		d := dst[i*m.rb : (i+1)*m.rb]
		if s < 0 || p == nil {
			clear(d)
			continue
		}
		copy(d, (*p)[int(s)*m.rb:])
	}
}
func (m *Mirror) WriteRow(slot int32, row []byte) { m.Write([]int32{slot}, row) }
func (m *Mirror) ReadRow(dst []byte, slot int32)  { m.Read(dst, []int32{slot}) }
func (m *Mirror) ResidentBytes() int64 {
	if m.mem.Load() == nil {
		return 0
	}
	return int64(m.n * m.rb)
}
