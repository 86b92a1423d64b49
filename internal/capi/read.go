// The reading calls: materialize, lookup, stats.

package main

/*
#include <stdint.h>
#include "omnicache.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// scratch is a materialize call's Result and its view of the caller's
// key buffers, reused across calls.
type scratch struct {
	res  omnicache.Result
	into [][]byte
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

//export ocgo_step_rows
func ocgo_step_rows(h C.uint64_t, step C.uint64_t, reqs *C.int64_t, nreqs C.int64_t, nOut *C.int64_t, rowsOut *C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	if nOut == nil || rowsOut == nil {
		return m.fail(fmt.Errorf("%w: NULL n_reqs or rows", errArgument))
	}
	_, n, rows, err := e.stepRows(step, reqs, nreqs)
	if err != nil {
		return m.fail(err)
	}
	*nOut, *rowsOut = C.int64_t(n), C.int64_t(rows)
	return C.OMNICACHE_OK
}

// stepRows is Cache.StepRows of a materialize call's request list (reqs
// NULL: every request; else the caller's ids, maybe none), which it
// returns as q.
func (e *entry) stepRows(step C.uint64_t, reqs *C.int64_t, nreqs C.int64_t) (q []int64, n, rows int, err error) {
	if reqs != nil {
		if q, err = view[int64](reqs, nreqs, "reqs"); err != nil {
			return nil, 0, 0, err
		}
		if q == nil {
			q = []int64{} // an empty list, not every request
		}
	}
	n, rows, err = e.c.StepRows(omnicache.StepID(step), q)
	return q, n, rows, err
}

//export ocgo_materialize
func ocgo_materialize(h C.uint64_t, step C.uint64_t, reqs *C.int64_t, nreqs C.int64_t, cr *C.omnicache_result, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	data, q, rows, err := e.resultBuffers(step, reqs, nreqs, cr)
	if err != nil {
		return m.fail(err)
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	into := sc.into[:0]
	for k, key := range e.keys {
		var b []byte
		if need := rows * key.RowBytes; need > 0 {
			b = unsafe.Slice((*byte)(data[k]), need)
		}
		into = append(into, b)
	}
	sc.into = into
	res := &sc.res
	res.Into(into)
	defer func() {
		// the caller's memory is the caller's after the call
		res.Into(nil)
		clear(sc.into)
	}()
	err = e.c.Materialize(omnicache.StepID(step), q, res)
	var re *omnicache.RequestError
	if err != nil && !errors.As(err, &re) {
		return m.fail(err)
	}
	fillResult(cr, res)
	compact(res, into, e.keys)
	if err != nil {
		m.fail(err)
		return code(re.Errs[0]) // the first failed request's cause
	}
	return C.OMNICACHE_OK
}

//export ocgo_materialize_dev
func ocgo_materialize_dev(h C.uint64_t, step C.uint64_t, cr *C.omnicache_result, stream C.uint64_t, flags C.uint32_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	if flags&^C.OMNICACHE_MATERIALIZE_OWN != 0 {
		return m.fail(fmt.Errorf("%w: unknown materialize flags %#x", errArgument, uint32(flags)))
	}
	// The result struct and the sizes first (a short buffer consumes
	// nothing), then the buffers as the device's.
	if _, _, _, err = e.resultBuffers(step, nil, 0, cr); err != nil {
		return m.fail(err)
	}
	bufs, err := e.devBuffers(cr.key_data, cr.key_cap, cr.nkeys)
	if err != nil {
		return m.fail(err)
	}
	if flags&C.OMNICACHE_MATERIALIZE_OWN != 0 {
		own, err := e.c.OwnResultDev(omnicache.StepID(step), bufs)
		if err != nil {
			return m.fail(err)
		}
		if !own {
			return m.fail(fmt.Errorf("%w: step %d: not the device buffers it was begun with (OMNICACHE_MATERIALIZE_OWN; the step stays unconsumed)", omnicache.ErrOutputs, uint64(step)))
		}
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	res := &sc.res
	// The library's writes into the buffers wait for the caller's stream
	// (once): none when every row is in place already.
	waited := false
	ready := func() error {
		if waited {
			return nil
		}
		waited = true
		return e.waitStream(uintptr(stream))
	}
	err = e.c.MaterializeDev(omnicache.StepID(step), bufs, res, ready)
	var re *omnicache.RequestError
	if err != nil && !errors.As(err, &re) {
		return m.fail(err)
	}
	fillResult(cr, res)
	if cerr := compactDev(e.dev, res, bufs, e.keys, ready); cerr != nil {
		return m.fail(fmt.Errorf("%w: compacting the device rows: %w", omnicache.ErrWriteFailed, cerr))
	}
	if err != nil {
		m.fail(err)
		return code(re.Errs[0]) // the first failed request's cause
	}
	return C.OMNICACHE_OK
}

// resultBuffers checks a materialize call's result struct against the
// step's sizes (Cache.StepRows of reqs): the request entries and key
// buffers must hold them, else errShortBuffer with n_reqs and total_rows
// set to the sizes needed. It returns the key buffers, the request list
// and the rows per key.
func (e *entry) resultBuffers(step C.uint64_t, reqs *C.int64_t, nreqs C.int64_t, cr *C.omnicache_result) (data []unsafe.Pointer, q []int64, rows int, err error) {
	if cr == nil {
		return nil, nil, 0, fmt.Errorf("%w: NULL result", errArgument)
	}
	if cr.cap_reqs < 0 || (cr.cap_reqs > 0 && (cr.prefix == nil || cr.tokens == nil)) {
		return nil, nil, 0, fmt.Errorf("%w: result: %d request entries without prefix or tokens arrays", errArgument, int64(cr.cap_reqs))
	}
	if int(cr.nkeys) != len(e.keys) {
		return nil, nil, 0, fmt.Errorf("%w: result: %d key buffers for %d keys", errArgument, int64(cr.nkeys), len(e.keys))
	}
	if data, err = view[unsafe.Pointer](cr.key_data, cr.nkeys, "key_data"); err != nil {
		return nil, nil, 0, err
	}
	caps, err := view[int64](cr.key_cap, cr.nkeys, "key_cap")
	if err != nil {
		return nil, nil, 0, err
	}
	// The sizes first: buffers that cannot hold the step's rows consume
	// nothing, and buffers that can are the Result's own (no copy).
	q, n, rows, err := e.stepRows(step, reqs, nreqs)
	if err != nil {
		return nil, nil, 0, err
	}
	cr.n_reqs, cr.total_rows = C.int64_t(n), C.int64_t(rows)
	short := int64(cr.cap_reqs) < int64(n)
	for k, key := range e.keys {
		if need := rows * key.RowBytes; caps[k] < int64(need) || (data[k] == nil && need > 0) {
			short = true
		}
	}
	if short {
		return nil, nil, 0, fmt.Errorf("%w: step %d: %d requests and %d rows; call again with buffers that hold them", errShortBuffer, uint64(step), n, rows)
	}
	return data, q, rows, nil
}

// fillResult writes res's requests (ids, prefixes, rows, errors, first
// positions) and their rows into the result struct.
func fillResult(cr *C.omnicache_result, res *omnicache.Result) {
	n := res.Len()
	total := 0
	for i := 0; i < n; i++ {
		total += res.Tokens(i)
	}
	cr.n_reqs, cr.total_rows = C.int64_t(n), C.int64_t(total)
	var ids []int64
	if cr.ids != nil {
		ids = unsafe.Slice((*int64)(unsafe.Pointer(cr.ids)), n)
	}
	prefix := unsafe.Slice((*int32)(unsafe.Pointer(cr.prefix)), n)
	tokens := unsafe.Slice((*int32)(unsafe.Pointer(cr.tokens)), n)
	var errs, from []int32
	if cr.errs != nil {
		errs = unsafe.Slice((*int32)(unsafe.Pointer(cr.errs)), n)
	}
	if cr.from != nil {
		from = unsafe.Slice((*int32)(unsafe.Pointer(cr.from)), n)
	}
	for i := 0; i < n; i++ {
		if ids != nil {
			ids[i] = res.ID(i)
		}
		prefix[i], tokens[i] = int32(res.Prefix(i)), int32(res.Tokens(i))
		if errs != nil {
			errs[i] = int32(code(res.Err(i)))
		}
		if from != nil {
			from[i] = int32(res.From(i))
		}
	}
}

// compactDev is compact for rows in device buffers (MaterializeDev): a
// request's rows after a gap move down over it device to device, in
// pieces no longer than the gap (a copy's source and destination must not
// overlap), after ready (the caller's stream) and then waited for.
func compactDev(d gpu.Device, res *omnicache.Result, bufs []gpu.Buffer, keys []omnicache.Key, ready func() error) error {
	moved := false
	for k, key := range keys {
		rb := key.RowBytes
		at := 0
		for i := 0; i < res.Len(); i++ {
			off, n := res.Offset(i), res.Tokens(i)
			for gap := off - at; gap > 0 && n > 0; {
				if !moved {
					if err := ready(); err != nil {
						return err
					}
				}
				m := min(n, gap)
				if err := d.CopyDtoD(bufs[k], at*rb, bufs[k], off*rb, m*rb); err != nil {
					return err
				}
				moved = true
				at, off, n = at+m, off+m, n-m
			}
			at += n
		}
	}
	if !moved {
		return nil
	}
	ev, err := d.Record()
	if err == nil {
		err = d.Wait(ev)
	}
	return err
}

// compact lays each key's rows out request after request from the start
// of the caller's buffer, as the ABI promises. The Result wrote them in
// place, each request at its Offset: they already are, unless rows were
// left out (rejected drafts, replaced rows, rows a resumed request had),
// which leaves gaps the rows after them move down over (copy is a
// memmove), or a key's rows went to the Result's own memory.
func compact(res *omnicache.Result, into [][]byte, keys []omnicache.Key) {
	for k, key := range keys {
		rb := key.RowBytes
		at := 0
		for i := 0; i < res.Len(); i++ {
			nb := res.Tokens(i) * rb
			if src := res.Rows(i, k); nb > 0 && &src[0] != &into[k][at] {
				copy(into[k][at:at+nb], src)
			}
			at += nb
		}
	}
}

// withHashes is the cache of handle h and the caller's n block hashes.
func withHashes(h C.uint64_t, hashes *C.uint64_t, n C.int64_t) (*entry, []uint64, error) {
	e, err := lookup(uint64(h))
	if err != nil {
		return nil, nil, err
	}
	hs, err := view[uint64](hashes, n, "hashes")
	return e, hs, err
}

//export ocgo_lookup
func ocgo_lookup(h C.uint64_t, hashes *C.uint64_t, n C.int64_t, held *C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, hs, err := withHashes(h, hashes, n)
	if err != nil {
		return m.fail(err)
	}
	if held == nil {
		return m.fail(fmt.Errorf("%w: NULL held", errArgument))
	}
	k, err := e.c.Lookup(context.Background(), hs)
	*held = C.int64_t(k)
	return m.fail(err)
}

//export ocgo_wait_published
func ocgo_wait_published(h C.uint64_t, hashes *C.uint64_t, n C.int64_t, timeoutNs C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, hs, err := withHashes(h, hashes, n)
	if err != nil {
		return m.fail(err)
	}
	if timeoutNs < 0 {
		return m.fail(fmt.Errorf("%w: negative timeout %d ns", errArgument, int64(timeoutNs)))
	}
	return m.fail(waitPublished(e.c, hs, time.Duration(timeoutNs)))
}

// waitPublished is Cache.WaitPublished bounded by timeout (0: no wait: a
// block still being stored fails at once).
func waitPublished(c *omnicache.Cache, hashes []uint64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.WaitPublished(ctx, hashes)
}

// statFields are omnicache.Stats' fields, in declaration order.
var statFields = func() []string {
	t := reflect.TypeOf(omnicache.Stats{})
	names := make([]string, t.NumField())
	for i := range names {
		names[i] = t.Field(i).Name
	}
	return names
}()

//export ocgo_stats
func ocgo_stats(h C.uint64_t, out *C.int64_t, cap C.int64_t, nOut *C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	dst, err := view[int64](out, cap, "out")
	if err != nil {
		return m.fail(err)
	}
	if e.closed.Load() {
		return m.fail(omnicache.ErrClosed)
	}
	v := reflect.ValueOf(e.c.Stats())
	for i := 0; i < len(statFields) && i < len(dst); i++ {
		dst[i] = v.Field(i).Int()
	}
	if nOut != nil {
		*nOut = C.int64_t(len(statFields))
	}
	return C.OMNICACHE_OK
}

//export ocgo_stat_names
func ocgo_stat_names(buf *C.char, cap C.int64_t) C.int64_t {
	s := strings.Join(statFields, ",")
	if buf != nil && cap > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(cap))
		n := copy(dst[:len(dst)-1], s)
		dst[n] = 0
	}
	return C.int64_t(len(s))
}
