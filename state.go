package omnicache

import (
	"sync/atomic"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/mirror"
	"github.com/omnicache/omnicache/soa"
	"github.com/omnicache/omnicache/writer"
)

// keyState is one configured key: its occupancy column and its lazily
// created mirror.
type keyState struct {
	Key
	idx int
	imm int // index among immediate keys, -1 for deferred keys
	occ *soa.Occupancy
	mir atomic.Pointer[mirror.Mirror]
}

// producer owns in-transit slots: an immediate write (one step, or the
// decode buffer's parked steps) or a deferred clone. Rows of producer row r
// for immediate key ki live in host[(r/n)*nimm+ki] (page region or owned host
// memory) or, for device rows parked by the decode buffer, dev[...]. Entries
// are written before the producer is published under the state lock and are
// immutable afterwards, except staged, which only the committer reads.
//
// owners counts pending writes of its rows (the map entry lives while > 0);
// pins counts step records and readers. It is released when both are 0.
type producer struct {
	id       uint64
	seq      uint64 // committer queue sequence once handed over (immediate)
	deferred bool
	owners   int32
	pins     int32

	// immediate
	n      int // rows per parked step
	steps  int // steps parked (1 for a plain step)
	page   *writer.Page
	ev     gpu.Event
	host   [][]byte
	dev    []gpu.Buffer
	staged [][]byte
	rows   soa.Pending // immediate: slot, parked step and row offset of every row
	slots  []int32     // deferred: slot of every clone row
	early  []gpu.Buffer
	earlyB int64 // bytes of early, released by the committer after the copy
	charge int64 // bytes released with the producer

	// device rows parked by the decode buffer (dev) are read by
	// Materialize until the flush has copied them to staged; the committer
	// then releases them (guarded by the state lock).
	devLive    bool
	devReads   int32
	devRelease bool
	devCharge  int64

	// deferred clone
	key int
	buf gpu.Buffer
	own bool // buf is the engine's owned tensor
}

// task is one unit of committer work.
type task struct {
	p    *producer // immediate write
	ev   gpu.Event // its rows are host-ready once ev completes
	segs []seg     // deferred write
	sync bool
}

// seg is a run of a deferred clone's rows.
type seg struct {
	p   *producer
	off int32
	n   int32
}

// plan entry kinds for hit reads.
const (
	srcZero = iota
	srcAbsent
	srcMirror
	srcProducer
	srcJoin
)

// stepRec is a saved step until Materialize or Discard consumes it.
type stepRec struct {
	id       StepID
	consumed bool
	ids      []int64
	count    []int32
	tokOff   []int32 // first row of each request in the step (see offsets)
	prefix   []int32 // hit prefix tokens per request (empty when no hit)
	planOff  []int32 // per request: first plan entry (entries for key k follow in key order)
	src      []*producer
	srcOff   []int32 // per key: first row of this step in src[k]
	pins     []*producer
	// hit plan entries, one per (request, key, prefix row)
	pKind []uint8
	pSlot []int32
	pWord []uint64
	pProd []*producer
	pRow  []uint32
	lastQ int // search hint for request lookup
	// immediate-key hit reads join the committer up to joinSeq; a row
	// whose owner is newer than maxOwner was reassigned after planning.
	joinSeq  uint64
	maxOwner uint64
}

func (s *stepRec) reset() {
	s.consumed = false
	s.ids = s.ids[:0]
	s.count = s.count[:0]
	s.tokOff = s.tokOff[:0]
	s.prefix = s.prefix[:0]
	s.planOff = s.planOff[:0]
	clear(s.src)
	s.srcOff = s.srcOff[:0]
	clear(s.pins)
	s.pins = s.pins[:0]
	s.pKind = s.pKind[:0]
	s.pSlot = s.pSlot[:0]
	s.pWord = s.pWord[:0]
	clear(s.pProd)
	s.pProd = s.pProd[:0]
	s.pRow = s.pRow[:0]
	s.lastQ = 0
}

// offsets returns each request's first row within the step, computing them
// on first use (by the engine before the record is published, or by the one
// consumer after it was taken).
func (s *stepRec) offsets() []int32 {
	if len(s.tokOff) != len(s.ids) {
		s.tokOff = s.tokOff[:0]
		off := int32(0)
		for _, n := range s.count {
			s.tokOff = append(s.tokOff, off)
			off += n
		}
	}
	return s.tokOff
}

// prefixOf is request i's hit prefix (0 when the step served none).
func (s *stepRec) prefixOf(i int) int32 {
	if len(s.prefix) == 0 {
		return 0
	}
	return s.prefix[i]
}

func (s *stepRec) pin(p *producer) {
	for _, q := range s.pins {
		if q == p {
			return
		}
	}
	p.pins++
	s.pins = append(s.pins, p)
}

func (s *stepRec) find(id int64) int {
	n := len(s.ids)
	for k := 0; k < n; k++ {
		i := s.lastQ + k
		if i >= n {
			i -= n
		}
		if s.ids[i] == id {
			s.lastQ = i + 1
			return i
		}
	}
	return -1
}
