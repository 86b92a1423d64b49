package cachetest

// The save path, Materialize and the check of served rows against the oracle.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

type saveResult struct {
	id  omnicache.StepID
	err error
}

func (h *Harness) isDev(k int) bool {
	if h.DevKeys != nil {
		return h.DevKeys[k]
	}
	return h.Device
}

func (h *Harness) isOwned(k int) bool {
	if h.OwnKeys != nil {
		return h.OwnKeys[k]
	}
	return h.Owned
}

// OutputsFor builds the step's outputs: per key, the rows of the scheduled
// requests in batch order.
func (h *Harness) OutputsFor(st Step) *omnicache.Outputs {
	tokens := 0
	for _, s := range st.Sched {
		tokens += s.Count()
	}
	o := &omnicache.Outputs{Tokens: tokens, Padded: tokens}
	if len(st.Accepted) > 0 {
		for _, s := range st.Sched {
			acc, ok := st.Accepted[s.ID()]
			if !ok {
				acc = s.Count()
			}
			o.Accepted = append(o.Accepted, int32(acc))
		}
	}
	for k, key := range h.Cfg.Keys {
		rb := key.RowBytes
		buf := make([]byte, tokens*rb)
		off := 0
		for _, s := range st.Sched {
			acc, ok := st.Accepted[s.ID()]
			for j := 0; j < s.Count(); j++ {
				ver := h.ver[s.ID()]
				if ok && j >= acc {
					ver = RejectedVer // a rejected draft's row: never to be delivered or hit
				}
				FillRow(buf[off:off+rb], MkTag(k, s.ID(), s.Start()+j, ver))
				off += rb
			}
		}
		t := omnicache.Tensor{Rows: tokens, Owned: h.isOwned(k)}
		switch {
		case h.OmitKeys != nil && h.OmitKeys[k]:
			t = omnicache.Tensor{} // the step did not emit this key
		case tokens == 0:
			t.Host = []byte{}
		case h.isDev(k):
			t.Dev = gpu.HostBuffer(buf)
		default:
			t.Host = buf
		}
		o.Tensors = append(o.Tensors, t)
	}
	return o
}

// omitted reports per key whether the outputs omit it (a zero Tensor).
func omitted(o *omnicache.Outputs) []bool {
	om := make([]bool, len(o.Tensors))
	for k, t := range o.Tensors {
		om[k] = t.Host == nil && t.Dev.IsZero()
	}
	return om
}

// Outs builds the outputs of the pending (begun) step.
func (h *Harness) Outs() *omnicache.Outputs {
	h.T.Helper()
	require.NotNil(h.T, h.pending, "harness: no begun step")
	return h.OutputsFor(h.pending.st)
}

// TrySave calls Save. On success it records what the step's Materialize
// must return and applies the step's writes to the model; then it
// overwrites the non-owned output buffers as an engine reusing them would.
// A failed Save ends the step (the next call is a Begin).
func (h *Harness) TrySave(o *omnicache.Outputs) (omnicache.StepID, error) {
	h.T.Helper()
	r := Guard(h.T, h.prefix()+"Save", func() saveResult {
		id, err := h.C.Save(o)
		return saveResult{id, err}
	})
	return h.afterSave(o, r)
}

// SaveAsync starts Save on another goroutine (which then is the engine
// goroutine for that call) and returns a join that fails the test if the
// Save has not returned within the deadline, and does TrySave's
// bookkeeping.
func (h *Harness) SaveAsync(o *omnicache.Outputs) (done <-chan struct{}, join func() (omnicache.StepID, error)) {
	d := make(chan struct{})
	var r saveResult
	go func() {
		id, err := h.C.Save(o)
		r = saveResult{id, err}
		close(d)
	}()
	join = func() (omnicache.StepID, error) {
		h.T.Helper()
		Guard(h.T, h.prefix()+"Save", func() struct{} { <-d; return struct{}{} })
		return h.afterSave(o, r)
	}
	return d, join
}

func (h *Harness) afterSave(o *omnicache.Outputs, r saveResult) (omnicache.StepID, error) {
	h.T.Helper()
	ps := h.pending
	h.pending = nil
	if r.err != nil {
		if ps != nil && !errors.Is(r.err, omnicache.ErrWriteFailed) {
			// A failed Save undoes its Begin: the model is as before it.
			h.restoreModel(&ps.undo)
		}
		return r.id, r.err
	}
	if ps == nil {
		h.T.Errorf("%sSave succeeded without a begun step", h.prefix())
		return r.id, nil
	}
	if _, dup := h.wants[r.id]; dup {
		h.T.Errorf("%sSave returned step id %v again (ids are never reused)", h.prefix(), r.id)
	}
	if ps.into != nil || ps.dev != nil {
		h.dmu.Lock()
		if ps.into != nil {
			h.resultInto[r.id] = ps.into
		}
		if ps.dev != nil {
			h.resultDev[r.id] = ps.dev
		}
		h.dmu.Unlock()
	}
	h.nsteps++
	ord := h.nsteps
	h.tokensAt = append(h.tokensAt, o.Tokens)
	omit := omitted(o)
	for _, s := range ps.st.Sched {
		acc, spec := ps.st.Accepted[s.ID()]
		for j, sl := range ps.slots[s.ID()] {
			if sl < 0 || int(sl) >= len(h.writtenAt) {
				continue
			}
			for k := range h.model {
				h.model[k][sl] = MkTag(k, s.ID(), s.Start()+j, ps.vers[s.ID()])
				if omit[k] {
					h.model[k][sl] = 0 // recorded absent: reads as zeros
				}
			}
			h.writtenAt[sl] = ord
			if spec && j >= acc {
				// A rejected draft's slot: written nowhere, read as
				// reassigned (or absent) until rewritten: no content known.
				for k := range h.model {
					h.model[k][sl] = 0
				}
				h.unknown[sl] = true
				h.rejected[sl] = true
			} else if h.rejected[sl] {
				h.unknown[sl], h.rejected[sl] = false, false
			}
		}
	}
	sw := &stepWant{ord: ord, byID: map[int64]int{}}
	h.order = append(h.order, r.id)
	for _, s := range ps.st.Sched {
		rw := reqWant{id: s.ID(), start: s.Start(), count: s.Count(), ver: ps.vers[s.ID()], omit: omit, acc: s.Count()}
		if a, ok := ps.st.Accepted[s.ID()]; ok {
			rw.acc = a
		}
		rw.end = s.Start() + rw.acc
		rw.dlCap = math.MaxInt
		if pl, ok := h.preLen[s.ID()]; ok {
			if s.Start()-len(ps.hits[s.ID()]) >= pl { // its rows start at 0 with a hit prefix
				delete(h.preLen, s.ID()) // saved past what it had
			} else {
				rw.floor, rw.floorMax = true, pl
			}
		}
		h.lens[s.ID()] = max(h.lens[s.ID()], rw.end)
		if hs, ok := ps.hits[s.ID()]; ok {
			rw.hitSlots = hs
			for _, sl := range hs {
				w := 0
				if sl >= 0 && int(sl) < len(h.writtenAt) {
					w = h.writtenAt[sl]
				}
				rw.hitFrom = append(rw.hitFrom, w)
				rw.hitRejected = rw.hitRejected || h.rejected[sl]
			}
			rw.prefix = make([][]Tag, len(h.model))
			for k := range h.model {
				for _, sl := range hs {
					var g Tag
					if sl >= 0 && int(sl) < len(h.model[k]) {
						g = h.model[k][sl]
					}
					rw.prefix[k] = append(rw.prefix[k], g)
				}
			}
		}
		sw.byID[s.ID()] = len(sw.reqs)
		sw.reqs = append(sw.reqs, rw)
	}
	h.wants[r.id] = sw
	if !h.NoScribble {
		for _, t := range o.Tensors {
			if t.Owned {
				continue
			}
			buf := t.Host
			if buf == nil {
				buf = t.Dev.Host
			}
			for i := range buf {
				buf[i] = 0xA5
			}
		}
	}
	return r.id, nil
}

// Save saves the begun step's outputs and returns the step id.
func (h *Harness) Save() omnicache.StepID {
	h.T.Helper()
	id, err := h.TrySave(h.Outs())
	require.NoError(h.T, err, h.prefix()+"Save")
	return id
}

// Step runs Begin and Save for st.
func (h *Harness) Step(st Step) omnicache.StepID {
	h.T.Helper()
	h.Begin(st)
	return h.Save()
}

func reqList(reqs []int64) []int64 {
	if len(reqs) == 0 {
		return nil
	}
	return reqs
}

// MatCall calls Materialize into res (no checking of the rows; with Into,
// of where they landed).
func (h *Harness) MatCall(id omnicache.StepID, reqs []int64, res *omnicache.Result) error {
	h.T.Helper()
	var into func(error)
	h.dmu.Lock()
	bufs := h.resultInto[id]
	dev := h.resultDev[id]
	h.dmu.Unlock()
	if dev != nil && reqs == nil && res != nil {
		return h.matDev(id, res, dev)
	}
	switch {
	case bufs != nil && reqs == nil && res != nil:
		into = h.intoBufs(id, reqs, res, bufs)
		h.dmu.Lock()
		delete(h.resultInto, id)
		h.dmu.Unlock()
	case h.Into && res != nil:
		into = h.into(id, reqs, res)
	}
	err := Guard(h.T, fmt.Sprintf("%sMaterialize(%v)", h.prefix(), id), func() error {
		return h.C.Materialize(id, reqs, res)
	})
	if into != nil {
		into(err)
	}
	if err == nil || !errors.Is(err, omnicache.ErrUnknownStep) && !errors.Is(err, omnicache.ErrNotInStep) && res != nil {
		h.dmu.Lock()
		h.consumed[id] = true
		h.dmu.Unlock()
	}
	return err
}

// Mat materializes reqs (none: the whole step) of step id and checks every
// row.
func (h *Harness) Mat(id omnicache.StepID, reqs ...int64) {
	h.T.Helper()
	reqs = reqList(reqs)
	err := h.MatCall(id, reqs, &h.Res)
	require.NoError(h.T, err, "%sMaterialize(%v, %v)", h.prefix(), id, reqs)
	require.NoError(h.T, h.Verify(id, reqs, &h.Res))
}

// MatDelayed materializes a step whose hit slots may have been reassigned
// since: ErrReassigned or the original rows are both right, the new
// tenant's rows never. It reports whether the read errored.
func (h *Harness) MatDelayed(id omnicache.StepID, reqs ...int64) (reassigned bool) {
	h.T.Helper()
	reqs = reqList(reqs)
	err := h.MatCall(id, reqs, &h.Res)
	if errors.Is(err, omnicache.ErrReassigned) {
		return true
	}
	require.NoError(h.T, err, "%sdelayed Materialize(%v): want success or ErrReassigned", h.prefix(), id)
	require.NoError(h.T, h.Verify(id, reqs, &h.Res), "delayed read must return the original rows")
	return false
}

func (h *Harness) want(id omnicache.StepID) *stepWant {
	h.T.Helper()
	sw, ok := h.wants[id]
	if !ok {
		h.T.Fatalf("harness: step id %v was not saved by this harness", id)
	}
	return sw
}

// RewrittenSince reports whether a hit slot of reqs (nil: all) of step id
// was written by a later step: a delayed read of it may fail with
// ErrReassigned.
func (h *Harness) RewrittenSince(id omnicache.StepID, reqs []int64) bool {
	return h.anyHitSlot(id, reqs, func(sl int32, ord int) bool { return h.writtenAt[sl] > ord })
}

// rejectedFrom reports whether a hit slot of reqs (nil: every request) in
// step id holds a rejected draft written by that step or a later one.
func (h *Harness) rejectedFrom(id omnicache.StepID, reqs []int64) bool {
	for _, rw := range h.want(id).reqs {
		if rw.hitRejected && (reqs == nil || slices.Contains(reqs, rw.id)) {
			return true // a rejected draft at Save, rewritten since or not
		}
	}
	return h.anyHitSlot(id, reqs, func(sl int32, ord int) bool { return h.writtenAt[sl] >= ord && h.rejected[sl] })
}

// anyHitSlot reports whether pred holds for a hit slot (one the harness
// tracks) of reqs (nil: every request) in step id; ord is the step's
// ordinal.
func (h *Harness) anyHitSlot(id omnicache.StepID, reqs []int64, pred func(sl int32, ord int) bool) bool {
	sw := h.want(id)
	for _, rw := range sw.reqs {
		if reqs != nil && !slices.Contains(reqs, rw.id) {
			continue
		}
		for _, sl := range rw.hitSlots {
			if sl >= 0 && int(sl) < len(h.writtenAt) && pred(sl, sw.ord) {
				return true
			}
		}
	}
	return false
}

// Verify checks res against what step id must return for reqs (nil: every
// request in batch order).
func (h *Harness) Verify(id omnicache.StepID, reqs []int64, res *omnicache.Result) error {
	h.T.Helper()
	return h.VerifyServed(id, reqs, res, nil)
}

// VerifyServed is Verify where the requests in failed were not served:
// their Result.Err must be set and their rows zero; every other request's
// rows must be exact and its Err nil.
func (h *Harness) VerifyServed(id omnicache.StepID, reqs []int64, res *omnicache.Result, failed map[int64]error) error {
	h.T.Helper()
	sw := h.want(id)
	order := reqs
	if order == nil {
		for _, rw := range sw.reqs {
			order = append(order, rw.id)
		}
	}
	head := fmt.Sprintf("%sstep %v (the harness's step #%d), requests %v", h.prefix(), id, sw.ord, order)
	if res.Len() != len(order) {
		return fmt.Errorf("%s: result has %d requests, want %d", head, res.Len(), len(order))
	}
	var bad []string
	for i, rid := range order {
		idx, ok := sw.byID[rid]
		if !ok {
			return fmt.Errorf("%s: harness: request %d not in step", head, rid)
		}
		rw := sw.reqs[idx]
		if res.ID(i) != rid {
			bad = append(bad, fmt.Sprintf("result %d: id %d, want %d", i, res.ID(i), rid))
			continue
		}
		npre := len(rw.hitSlots)
		if _, ok := failed[rid]; ok != (res.Err(i) != nil) {
			bad = append(bad, fmt.Sprintf("req %d: Result.Err = %v, failed in the error: %v", rid, res.Err(i), ok))
			continue
		}
		h.dmu.Lock()
		if res.Err(i) != nil {
			if h.failedReq[id] == nil {
				h.failedReq[id] = map[int64]bool{}
			}
			h.failedReq[id][rid] = true
		} else if res.Tokens(i) > 0 { // rows delivered: its delivery advanced
			if h.served[id] == nil {
				h.served[id] = map[int64]bool{}
			}
			h.served[id][rid] = true
		}
		lo := rw.start - npre
		total := rw.end - lo // rows delivered at most: up to the accepted (or replaced) end
		if res.Err(i) != nil {
			total = npre + rw.count // not served: its whole shape, zeros
		}
		if rw.loose && res.Tokens(i) == rw.start+rw.acc-lo-(res.From(i)-lo) {
			total = rw.start + rw.acc - lo // the replace came after the asynchronous take
		}
		skip := 0
		if rw.floor && res.Err(i) == nil {
			n, got := min(total, max(0, rw.floorMax-lo)), res.From(i)-lo
			if rw.loose && got >= 0 && got <= n {
				// Taken asynchronously around a replace of its request: the
				// delivery it met depends on which came first.
				skip = got
			} else {
				skip = h.expectSkip(id, rid, lo, n, got)
			}
		}
		h.dmu.Unlock()
		if res.From(i) != lo+skip || res.Prefix(i) != max(0, min(npre, total)-skip) || res.Tokens(i) != total-skip {
			bad = append(bad, fmt.Sprintf("req %d: From=%d Prefix=%d Tokens=%d, want From=%d Prefix=%d Tokens=%d (hit prefix + %d rows of this step, %d accepted, end %d, %d delivered before)",
				rid, res.From(i), res.Prefix(i), res.Tokens(i), lo+skip, max(0, min(npre, total)-skip), total-skip, rw.count, rw.acc, rw.end, skip))
			continue
		}
		npre -= skip // the rows checked below start skip rows later
		for k, key := range h.Cfg.Keys {
			rb := key.RowBytes
			rows := res.Rows(i, k)
			if len(rows) != (npre+rw.count-min(0, npre))*rb && len(rows) != res.Tokens(i)*rb {
				bad = append(bad, fmt.Sprintf("req %d key %q: %d bytes, want %d", rid, key.Name, len(rows), res.Tokens(i)*rb))
				continue
			}
			if h.KeepRows {
				// The rows with the position they start at: two runs may
				// deliver a resumed request's rows from different positions
				// (an asynchronous take's timing); they agree where both have rows.
				h.rows[rowKey{sw.ord, rid, key.Name}] = append(binary.LittleEndian.AppendUint32(nil, uint32(res.From(i))), rows...)
			}
			for j := 0; j < res.Tokens(i); j++ {
				var w Tag
				part := "prefix"
				if res.Err(i) != nil {
					part = "failed request" // zeros
				} else if j < npre {
					w = rw.prefix[k][j+skip]
				} else {
					part = "own"
					if !rw.omit[k] {
						w = MkTag(k, rid, rw.start+j-npre, rw.ver)
					}
				}
				got := rows[j*rb : (j+1)*rb]
				if !bytes.Equal(got, RowOf(w, rb)) {
					bad = append(bad, fmt.Sprintf("req %d key %q row %d (%s): got %s, want %s", rid, key.Name, j, part, Describe(got), w))
				}
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s: wrong result:\n  %s", head, listBad(bad))
}

// expectSkip is how many of the n rows from position lo of request rid in
// step id Materialize leaves out, the request having resumed after a
// preemption: those below its delivered position (the end of every step
// of it served so far, in whatever order) and below what its older steps
// not consumed yet will deliver (the cache counts those). An older step
// consumed by Discard, or whose Materialize did not serve rid, delivered
// nothing. got (the cache's skip) is returned when it lies between the
// least and the most the harness can tell (an asynchronous Materialize
// took its step at a time the harness does not know); else the most.
func (h *Harness) expectSkip(id omnicache.StepID, rid int64, lo, n, got int) int {
	least, most := lo, lo
	older := true
	for _, sid := range h.order {
		if sid == id {
			older = false
			continue
		}
		sw := h.wants[sid]
		j, ok := sw.byID[rid]
		if !ok || h.discarded[sid] || sw.reqs[j].count == 0 {
			continue
		}
		rq := &sw.reqs[j]
		end := rq.end
		if rq.loose && h.served[sid][rid] {
			// An asynchronous Materialize took the step before a replace
			// cut it: it delivered up to the end before the cut, and the
			// replace then moved the delivery back to dlCap.
			end = max(end, rq.takenEnd)
		}
		if end <= rq.start-len(rq.hitSlots) {
			continue
		}
		hi := min(end, rq.dlCap)
		switch {
		case h.served[sid][rid]:
			least, most = max(least, hi), max(most, hi)
		case older && !h.consumed[sid], h.asyncOpen[sid], h.asyncVerify:
			most = max(most, hi)
		}
	}
	a, b := min(least-lo, n), min(most-lo, n)
	if h.asyncVerify {
		a = 0
	}
	if got >= a && got <= b {
		return got
	}
	return b
}

// Steps is the number of steps saved through the harness.
func (h *Harness) Steps() int { return h.nsteps }
