package omnicache

// Result receives what Materialize returns: per request and key the rows
// `[hit prefix rows | this step's rows]` (the prefix only on the request's
// first step after a hit). A Result is reusable: Materialize overwrites it,
// keeping its buffers, so steady-state use allocates nothing. The slices it
// hands out stay valid until the Result is reused.
type Result struct {
	ids      []int64
	prefix   []int32
	tokens   []int32
	from     []int32 // per request: the position of its first row
	off      []int32 // row offset of request i within every key's buffer
	rowBytes []int
	keys     [][]byte // per key: the rows of the last Materialize
	own      [][]byte // per key: the Result's own buffer, kept for reuse
	into     [][]byte // per key: the caller's buffer (Into); nil: own memory
	errs     []error  // per request: why its rows were not served (nil: served)
	nfail    int
	keep     []int32 // Materialize's scratch: rows kept per request when its step was trimmed
	skip     []int32 // Materialize's scratch: rows left out at the front per request (delivered already)
	// Materialize's delivery (delivery.go), per request asked: its state
	// (nil: nothing to deliver), where its rows end if served (cut by a
	// replace meanwhile), and where they end uncut; dlStep is the step.
	dl     []*delivery
	dlHi   []int32
	dlFull []int32
	dlStep uint64
	// dev: the last Materialize was a MaterializeDev (the rows are in
	// device memory: Rows has none unless a host device's).
	dev bool
}

// trimFront leaves out request i's first n rows (it had them already):
// its rows then start n positions later. Views only.
func (r *Result) trimFront(i int, n int32) {
	n = min(n, r.tokens[i])
	r.off[i] += n
	r.tokens[i] -= n
	r.from[i] += n
	r.prefix[i] = max(0, r.prefix[i]-n)
}

// requestError is the *RequestError of the Materialize of step id into r
// when a request was not served, else nil.
func (r *Result) requestError(id StepID) error {
	if r.nfail == 0 {
		return nil
	}
	re := &RequestError{Step: id}
	for i, e := range r.errs {
		if e != nil {
			re.IDs = append(re.IDs, r.ids[i])
			re.Errs = append(re.Errs, e)
		}
	}
	return re
}

// Err is nil when request i's rows were served, else why not (its rows
// are then zeros; Materialize returned a *RequestError).
func (r *Result) Err(i int) error { return r.errs[i] }

// Into makes the Materializes into r write key k's rows into bufs[k], the
// caller's memory, rather than into buffers of r's own, when cap(bufs[k])
// holds them (Cache.StepRows tells how many rows a step will have at most;
// a buffer too small for a step makes that key's rows go to r's own
// memory): request i's rows are then bufs[k][off*RowBytes:] for the row
// offset off that Offset(i) returns, with no copy beyond the one from the
// cache's memory. Into(nil) returns to r's own buffers; until then r
// references bufs (Rows hands out views of them).
func (r *Result) Into(bufs [][]byte) {
	r.into = bufs
	if bufs == nil {
		for k := range r.keys {
			r.keys[k] = nil
		}
	}
}

// Offset is the row of key buffers at which request i's rows begin:
// Rows(i, k) is the buffer's rows [Offset(i), Offset(i)+Tokens(i)).
func (r *Result) Offset(i int) int { return int(r.off[i]) }

// adopts reports whether the read path may hand r its own buffers (adopt)
// instead of writing into those r has sized: not with the caller's memory.
func (r *Result) adopts() bool { return r.into == nil }

// adopt makes buf key k's buffer (laid out as Rows expects for every
// request added) and returns r's own buffer it replaces. Only when adopts.
func (r *Result) adopt(k int, buf []byte) []byte {
	old := r.own[k]
	r.own[k], r.keys[k] = buf, buf
	return old
}

// fail records that request i's rows cannot be served, and zeroes them.
func (r *Result) fail(i int, err error) {
	if r.errs[i] == nil {
		r.nfail++
	}
	r.errs[i] = err
	for k := range r.keys {
		if len(r.keys[k]) > 0 {
			clear(r.Rows(i, k))
		}
	}
}

// Len is the number of requests in the result, in the order asked for.
func (r *Result) Len() int { return len(r.ids) }

// ID is the i-th request's id.
func (r *Result) ID(i int) int64 { return r.ids[i] }

// From is the token position of request i's first row: its rows are
// positions [From(i), From(i)+Tokens(i)) of its sequence (0 with a hit
// prefix, else the step's first scheduled position).
func (r *Result) From(i int) int { return int(r.from[i]) }

// Prefix is the number of hit-prefix rows at the start of request i's rows.
func (r *Result) Prefix(i int) int { return int(r.prefix[i]) }

// Tokens is the number of rows request i has (prefix included).
func (r *Result) Tokens(i int) int { return int(r.tokens[i]) }

// Rows returns request i's rows of key k (Config.Keys order),
// Tokens(i)*RowBytes bytes.
func (r *Result) Rows(i, k int) []byte {
	if r.dev && r.keys[k] == nil {
		return nil // device memory (MaterializeDev)
	}
	rb := r.rowBytes[k]
	lo := int(r.off[i]) * rb
	return r.keys[k][lo : lo+int(r.tokens[i])*rb : lo+int(r.tokens[i])*rb]
}

// reset sizes the result for n requests and the given key widths.
func (r *Result) reset(rowBytes []int) {
	r.dev = false
	r.ids = r.ids[:0]
	r.prefix = r.prefix[:0]
	r.tokens = r.tokens[:0]
	r.from = r.from[:0]
	r.off = r.off[:0]
	clear(r.errs)
	r.errs = r.errs[:0]
	r.nfail = 0
	r.rowBytes = append(r.rowBytes[:0], rowBytes...)
	if cap(r.keys) < len(rowBytes) {
		r.keys = make([][]byte, len(rowBytes))
	}
	r.keys = r.keys[:len(rowBytes)]
	if len(r.own) < len(rowBytes) {
		r.own = append(r.own, make([][]byte, len(rowBytes)-len(r.own))...)
	}
}

// trim makes request i hold only its first n rows (n ≤ Tokens(i)): the
// rows after them are not delivered. Views only; the layout is kept.
func (r *Result) trim(i int, n int32) {
	r.tokens[i] = max(0, min(n, r.tokens[i]))
	r.prefix[i] = min(r.prefix[i], r.tokens[i])
}

// add appends request id with prefix and total token counts, its first
// row at position from.
func (r *Result) add(id int64, prefix, tokens, from int32) {
	off := int32(0)
	if n := len(r.off); n > 0 {
		off = r.off[n-1] + r.tokens[n-1]
	}
	r.ids = append(r.ids, id)
	r.prefix = append(r.prefix, prefix)
	r.tokens = append(r.tokens, tokens)
	r.from = append(r.from, from)
	r.off = append(r.off, off)
	r.errs = append(r.errs, nil)
}

// size makes every key buffer hold the rows added so far: the caller's
// (Into) when it has room, else r's own, grown when short.
func (r *Result) size() {
	total := r.rows()
	for k, rb := range r.rowBytes {
		need := total * rb
		if k < len(r.into) && cap(r.into[k]) >= need {
			r.keys[k] = r.into[k][:need]
			continue
		}
		if cap(r.own[k]) < need {
			r.own[k] = make([]byte, need)
		}
		r.keys[k] = r.own[k][:need]
	}
}

// rows is the number of rows of the requests added.
func (r *Result) rows() int {
	if n := len(r.off); n > 0 {
		return int(r.off[n-1] + r.tokens[n-1])
	}
	return 0
}

// fits reports whether r's buffers hold the rows of the requests added
// already: size would allocate nothing.
func (r *Result) fits() bool {
	total := r.rows()
	for k, rb := range r.rowBytes {
		need := total * rb
		if !(k < len(r.into) && cap(r.into[k]) >= need) && cap(r.own[k]) < need {
			return false
		}
	}
	return true
}

// dest is the read path's view of a Result (reader.Dest).
type dest struct{ r *Result }

func (d dest) Rows(qi, k int) []byte          { return d.r.Rows(qi, k) }
func (d dest) Size()                          { d.r.size() }
func (d dest) Adopts() bool                   { return d.r.adopts() }
func (d dest) Fits() bool                     { return d.r.fits() }
func (d dest) Adopt(k int, buf []byte) []byte { return d.r.adopt(k, buf) }
func (d dest) Fail(qi int, err error)         { d.r.fail(qi, err) }
