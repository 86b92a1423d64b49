package omnicache

import (
	"github.com/omnicache/omnicache/soa"
	"github.com/omnicache/omnicache/writer"
)

// keyState is one configured key.
type keyState struct {
	Key
	imm int            // index among immediate keys, -1 for deferred keys
	def int            // index among deferred keys, -1 for immediate keys
	occ *soa.Occupancy // deferred keys: per-slot occupancy
}

// plan entry kinds for hit reads.
const (
	srcZero = iota
	srcAbsent
	srcMirror
	srcClone
)

// stepRec is a saved step until Materialize or Discard consumes it.
type stepRec struct {
	id        StepID
	ids       []int64
	count     []int32
	tokOff    []int32 // first row of each request in the step (see offsets)
	prefix    []int32 // hit prefix tokens per request (empty when no hit)
	planOff   []int32 // per request: first deferred-key plan entry (deferred keys follow in order)
	hitOff    []int32 // per request: its hit blocks in hitBlocks (-1: no hit served)
	hitBlocks []int32
	slots     []int32 // scratch of the consumer (readJoined)
	src       []*writer.Write
	srcOff    []int32 // per key: first row of this step in src[k]
	pins      []*writer.Write
	// hit plan entries, one per (request, key, prefix row)
	pKind []uint8
	pSlot []int32
	pWord []uint64
	pProd []*writer.Write
	pRow  []uint32
	lastQ int     // search hint for request lookup
	qidx  []int32 // requests asked of Materialize, as step indices (set by take)
	// immediate-key hit reads join the committer up to joinSeq; a row
	// whose owner is newer than maxOwner was reassigned after planning.
	joinSeq  uint64
	maxOwner uint64
	owners   []uint64 // scratch of the consumer (readJoined)
}

func (s *stepRec) reset() {
	s.ids = s.ids[:0]
	s.count = s.count[:0]
	s.tokOff = s.tokOff[:0]
	s.prefix = s.prefix[:0]
	s.planOff = s.planOff[:0]
	s.hitOff = s.hitOff[:0]
	s.hitBlocks = s.hitBlocks[:0]
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

func (s *stepRec) pin(p *writer.Write) {
	for _, q := range s.pins {
		if q == p {
			return
		}
	}
	p.Pins++
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
