package replay

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
)

// The --verify oracle. Every row the simulated forward produces is a
// deterministic function of (key, token prefix): with H[p] the rolling hash
// of the request's tokens[0..p] (sim.Req.H), the row of key k at position p
// is the 8-byte little-endian word splitmix64(H[p] ^ salt(k)) repeated over
// the row (a row whose length is not a multiple of 8 ends with the word's low
// bytes). A row served for the wrong prefix, a stale tenant's row or a zero
// row of a written slot therefore differs from the oracle.

// keySalt is the oracle's per-key salt: FNV-1a of the key name.
func keySalt(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// OracleWord is the word repeated over the row of a key with salt at a
// position whose prefix hash is h.
func OracleWord(salt, h uint64) uint64 { return sim.SplitMix64(h ^ salt) }

// fillRow writes the oracle row for word w into dst.
func fillRow(dst []byte, w uint64) {
	if len(dst) >= 8 {
		binary.LittleEndian.PutUint64(dst, w)
		n := 8
		for n < len(dst) {
			n += copy(dst[n:], dst[:n])
		}
		return
	}
	for i := range dst {
		dst[i] = byte(w >> (8 * i))
	}
}

// rowMismatch returns the first byte offset where row differs from the
// oracle row of w, or -1.
func rowMismatch(row []byte, w uint64) int {
	i := 0
	for ; i+8 <= len(row); i += 8 {
		if binary.LittleEndian.Uint64(row[i:]) != w {
			return i
		}
	}
	for j := 0; i < len(row); i, j = i+1, j+1 {
		if row[i] != byte(w>>(8*j)) {
			return i
		}
	}
	return -1
}

// Failure is one wrong row found by --verify.
type Failure struct {
	Step     int    `json:"step"`
	Request  int64  `json:"request"`
	Position int    `json:"position"`
	Key      string `json:"key"`
	Slot     int32  `json:"slot"` // -1 when not known
	What     string `json:"what"`
}

func (f Failure) String() string {
	s := fmt.Sprintf("step %d: request %d position %d key %s", f.Step, f.Request, f.Position, f.Key)
	if f.Slot >= 0 {
		s += fmt.Sprintf(" slot %d", f.Slot)
	}
	return s + ": " + f.What
}

const maxFailuresKept = 20

// verifier checks materialized rows and, at the end, the mirror.
type verifier struct {
	keys  []omnicache.Key
	salts []uint64
	bs    int
	// Per KV slot: the prefix hash of the last row the forward produced for
	// it, and who produced it. set marks slots ever written.
	slotH   []uint64
	slotReq []int64
	slotPos []int32
	set     []bool

	rows     int64
	failures int64
	kept     []Failure
	// delivered is, per request, the position its rows were delivered up
	// to: a step's rows must start there (a request that recomputes rows
	// after a preemption gets none of them again); repeated and missing
	// count the rows a result started below or above it.
	delivered         map[int64]int
	repeated, missing int64
	// cuts are the requests whose tokens were replaced: steps before the
	// replacing one deliver none of their rows from the position on, and
	// delivery restarts there.
	cuts map[int64]*cut
}

// cut is a replacement seen by the verifier: request's rows from from on
// were replaced at step step.
type cut struct {
	from, step int
	applied    bool
}

// replaced notes the step's replacements (call before its Begin, with
// every step before the previous one checked).
func (v *verifier) replaced(st *sim.Step) {
	for i, id := range st.Plan.Replaced {
		v.cuts[id] = &cut{from: int(st.Plan.ReplacedFrom[i]), step: st.Index}
	}
}

func newVerifier(keys []omnicache.Key, numSlots, bs int) *verifier {
	v := &verifier{
		keys:    keys,
		bs:      bs,
		slotH:   make([]uint64, numSlots),
		slotReq: make([]int64, numSlots),
		slotPos: make([]int32, numSlots),
		set:     make([]bool, numSlots),

		delivered: map[int64]int{},
		cuts:      map[int64]*cut{},
	}
	for _, k := range keys {
		v.salts = append(v.salts, keySalt(k.Name))
	}
	return v
}

func (v *verifier) fail(f Failure) {
	v.failures++
	if len(v.kept) < maxFailuresKept {
		v.kept = append(v.kept, f)
	}
}

// produce fills the step's output tensors with oracle rows (token order) and
// records which slot gets which row. A rejected draft's row is its draft
// prefix's: delivered or hit it would be wrong; its slot is not checked in
// the mirror (rejected rows are written nowhere).
func (v *verifier) produce(s *sim.Sim, st *sim.Step, bufs [][]byte) {
	p := &st.Plan
	j := 0
	for i, r := range st.Reqs {
		start, n := int(p.Start[i]), int(p.Count[i])
		acc := n
		if len(st.Accepted) > i {
			acc = int(st.Accepted[i])
		}
		for pos := start; pos < start+n; pos++ {
			h := r.H[min(pos, len(r.H)-1)]
			if st.RowH != nil {
				h = st.RowH[j]
			}
			for k, kk := range v.keys {
				rb := kk.RowBytes
				fillRow(bufs[k][j*rb:(j+1)*rb], OracleWord(v.salts[k], h))
			}
			slot := s.Slot(p.Rows[i], pos)
			v.slotH[slot] = h
			v.slotReq[slot] = r.ID
			v.slotPos[slot] = int32(pos)
			v.set[slot] = pos < start+acc
			j++
		}
	}
}

// stepRecord is what verification needs of a saved step, kept until it is
// consumed a step later.
type stepRecord struct {
	index int
	ids   []int64
	reqs  []*sim.Req
	// hs are the requests' prefix hashes when the step ran, to their
	// capacity: sampling fills them in place, a replacement gives the
	// request new ones.
	hs     [][]uint64
	start  []int32
	count  []int32
	prefix []int32
	hits   []int64 // ids with a hit prefix this step
}

func (rec *stepRecord) set(st *sim.Step) {
	rec.index = st.Index
	rec.ids = append(rec.ids[:0], st.Plan.IDs...)
	clear(rec.reqs)
	rec.reqs = append(rec.reqs[:0], st.Reqs...)
	clear(rec.hs)
	rec.hs = rec.hs[:0]
	for _, r := range st.Reqs {
		rec.hs = append(rec.hs, r.H[:cap(r.H)])
	}
	rec.start = append(rec.start[:0], st.Plan.Start...)
	rec.count = append(rec.count[:0], st.Plan.Count...)
	if len(st.Accepted) == len(rec.count) {
		// Rows are delivered for the accepted tokens only.
		rec.count = append(rec.count[:0], st.Accepted...)
	}
	rec.prefix = append(rec.prefix[:0], st.Prefix...)
	rec.hits = rec.hits[:0]
	for i, p := range st.Prefix {
		if p > 0 {
			rec.hits = append(rec.hits, st.Plan.IDs[i])
		}
	}
}

// check verifies what Materialize returned for rec's requests asked (ids, in
// order: rec.ids when verifying everything, else rec.hits).
func (v *verifier) check(rec *stepRecord, asked []int64, res Rows) {
	if res.Len() != len(asked) {
		v.fail(Failure{Step: rec.index, Slot: -1, What: fmt.Sprintf("Materialize returned %d requests, asked %d", res.Len(), len(asked))})
		return
	}
	j := 0
	for i, id := range asked {
		for j < len(rec.ids) && rec.ids[j] != id {
			j++
		}
		if j == len(rec.ids) {
			panic("bench: asked for a request outside the step")
		}
		hs := rec.hs[j]
		prefix, start, n := int(rec.prefix[j]), int(rec.start[j]), int(rec.count[j])
		lo, hi := start-prefix, start+n
		if c := v.cuts[id]; c != nil {
			if rec.index < c.step {
				// Saved before the replacement: nothing from its
				// position on.
				hi = max(min(hi, c.from), lo)
			} else if !c.applied {
				c.applied = true
				if d, ok := v.delivered[id]; ok && d > c.from {
					v.delivered[id] = c.from // delivery restarts there
				}
			}
		}
		from := lo
		if d, ok := v.delivered[id]; ok && d > lo {
			from = min(d, hi) // rows it was delivered already are not delivered again
		}
		got := res.From(i)
		switch {
		case res.ID(i) != id:
			v.fail(Failure{Step: rec.index, Request: id, Slot: -1, What: fmt.Sprintf("result id %d, want %d", res.ID(i), id)})
			continue
		case got < from && res.Tokens(i) > 0:
			v.repeated += int64(min(from, got+res.Tokens(i)) - got)
			v.fail(Failure{Step: rec.index, Request: id, Position: got, Slot: -1, What: fmt.Sprintf(
				"rows from %d delivered again (delivered up to %d)", got, from)})
			continue
		case got > from:
			v.missing += int64(got - from)
			v.fail(Failure{Step: rec.index, Request: id, Position: from, Slot: -1, What: fmt.Sprintf(
				"rows %d..%d never delivered (this step's start at %d)", from, got, got)})
			continue
		case res.Tokens(i) != hi-from && !(res.Tokens(i) == 0 && from == hi) || res.Prefix(i) != max(0, min(start, hi)-from):
			v.fail(Failure{Step: rec.index, Request: id, Slot: -1, What: fmt.Sprintf(
				"result shape: from %d prefix %d tokens %d, want from %d prefix %d tokens %d",
				got, res.Prefix(i), res.Tokens(i), from, max(0, min(start, hi)-from), hi-from)})
			continue
		}
		if res.Tokens(i) > 0 {
			v.delivered[id] = max(v.delivered[id], hi)
		}
		for k, kk := range v.keys {
			rb := kk.RowBytes
			data := res.Rows(i, k)
			if len(data) != res.Tokens(i)*rb {
				v.fail(Failure{Step: rec.index, Request: id, Key: kk.Name, Slot: -1, What: fmt.Sprintf("%d bytes, want %d", len(data), res.Tokens(i)*rb)})
				continue
			}
			for row := range res.Tokens(i) {
				pos := from + row
				what := "step row"
				if pos < start {
					what = "prefix row"
				}
				v.rows++
				if off := rowMismatch(data[row*rb:(row+1)*rb], OracleWord(v.salts[k], hs[pos])); off >= 0 {
					v.fail(Failure{Step: rec.index, Request: id, Position: pos, Key: kk.Name, Slot: -1,
						What: fmt.Sprintf("wrong or stale %s (first bad byte %d)", what, off)})
				}
			}
		}
	}
}

// checkMirror compares every slot ever written with the row last produced
// for it (call after Sync).
func (v *verifier) checkMirror(c Cache, step int) error {
	const batch = 4096
	var slots []int32
	var dst []byte
	for k, kk := range v.keys {
		if kk.Deferred {
			continue // deferred rows of live requests legitimately stay pending
		}
		rb := kk.RowBytes
		for lo := 0; lo < len(v.set); lo += batch {
			slots = slots[:0]
			for s := lo; s < min(lo+batch, len(v.set)); s++ {
				if v.set[s] {
					slots = append(slots, int32(s))
				}
			}
			if len(slots) == 0 {
				continue
			}
			if cap(dst) < len(slots)*rb {
				dst = make([]byte, len(slots)*rb)
			}
			dst = dst[:len(slots)*rb]
			if err := c.Peek(k, slots, dst); err != nil {
				return fmt.Errorf("peek: %w", err)
			}
			for i, s := range slots {
				v.rows++
				if off := rowMismatch(dst[i*rb:(i+1)*rb], OracleWord(v.salts[k], v.slotH[s])); off >= 0 {
					v.fail(Failure{Step: step, Request: v.slotReq[s], Position: int(v.slotPos[s]), Key: kk.Name, Slot: s,
						What: fmt.Sprintf("mirror row after Sync is not the last row written (first bad byte %d)", off)})
				}
			}
		}
	}
	return nil
}
