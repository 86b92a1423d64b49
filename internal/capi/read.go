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
	"unsafe"

	"github.com/omnicache/omnicache"
)

// unpark takes step's parked result, nil when none.
func (e *entry) unpark(step uint64) *parkedResult {
	if e.nparked.Load() == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	pr := e.parked[step]
	if pr != nil {
		delete(e.parked, step)
		e.nparked.Store(int32(len(e.parked)))
	}
	return pr
}

var results = sync.Pool{New: func() any { return new(omnicache.Result) }}

//export ocgo_materialize
func ocgo_materialize(h C.uint64_t, step C.uint64_t, reqs *C.int64_t, nreqs C.int64_t, cr *C.omnicache_result, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	if cr == nil {
		return m.fail(fmt.Errorf("%w: NULL result", errArgument))
	}
	if cr.cap_reqs < 0 || (cr.cap_reqs > 0 && (cr.prefix == nil || cr.tokens == nil)) {
		return m.fail(fmt.Errorf("%w: result: %d request entries without prefix or tokens arrays", errArgument, int64(cr.cap_reqs)))
	}
	if int(cr.nkeys) != len(e.keys) {
		return m.fail(fmt.Errorf("%w: result: %d key buffers for %d keys", errArgument, int64(cr.nkeys), len(e.keys)))
	}
	data, err := view[unsafe.Pointer](cr.key_data, cr.nkeys, "key_data")
	if err != nil {
		return m.fail(err)
	}
	caps, err := view[int64](cr.key_cap, cr.nkeys, "key_cap")
	if err != nil {
		return m.fail(err)
	}
	if e.closed.Load() {
		return m.fail(omnicache.ErrClosed)
	}
	pr := e.unpark(uint64(step))
	if pr == nil {
		var q []int64
		if reqs != nil {
			if q, err = view[int64](reqs, nreqs, "reqs"); err != nil {
				return m.fail(err)
			}
			if q == nil {
				q = []int64{} // an empty list, not every request
			}
		}
		res := results.Get().(*omnicache.Result)
		err = e.c.Materialize(omnicache.StepID(step), q, res)
		var re *omnicache.RequestError
		if err != nil && !errors.As(err, &re) {
			results.Put(res)
			return m.fail(err)
		}
		pr = &parkedResult{res: res, err: err}
	}
	res := pr.res
	n := res.Len()
	total := 0
	for i := 0; i < n; i++ {
		total += res.Tokens(i)
	}
	cr.n_reqs, cr.total_rows = C.int64_t(n), C.int64_t(total)
	short := int64(cr.cap_reqs) < int64(n)
	for k, key := range e.keys {
		if caps[k] < int64(total)*int64(key.RowBytes) || (data[k] == nil && total*key.RowBytes > 0) {
			short = true
		}
	}
	if short {
		e.mu.Lock()
		if !e.closed.Load() {
			e.parked[uint64(step)] = pr
			e.nparked.Store(int32(len(e.parked)))
		}
		e.mu.Unlock()
		return m.fail(fmt.Errorf("%w: step %d: %d requests and %d rows; call again with buffers that hold them", errShortBuffer, uint64(step), n, total))
	}
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
	for k, key := range e.keys {
		if total*key.RowBytes == 0 {
			continue
		}
		dst := unsafe.Slice((*byte)(data[k]), total*key.RowBytes)
		off := 0
		for i := 0; i < n; i++ {
			off += copy(dst[off:], res.Rows(i, k))
		}
	}
	err = pr.err
	results.Put(res)
	if err != nil {
		var re *omnicache.RequestError
		errors.As(err, &re)
		m.fail(err)
		return code(re.Errs[0]) // the first failed request's cause
	}
	return C.OMNICACHE_OK
}

//export ocgo_lookup
func ocgo_lookup(h C.uint64_t, hashes *C.uint64_t, n C.int64_t, held *C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	hs, err := view[uint64](hashes, n, "hashes")
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
	e, err := lookup(h)
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
