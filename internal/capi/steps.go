// The step calls: begin, save, abort, sync, reset, discard.

package main

/*
#include <stdint.h>
#include "omnicache.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"unsafe"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

//export ocgo_discard_begin
func ocgo_discard_begin(h C.uint64_t, step C.uint64_t, cp *C.omnicache_plan, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	if step != 0 {
		if err := e.c.Discard(omnicache.StepID(step)); err != nil {
			return m.fail(err) // nothing begun
		}
	}
	return m.fail(e.begin(cp))
}

//export ocgo_discard_begin_into
func ocgo_discard_begin_into(h C.uint64_t, step C.uint64_t, cp *C.omnicache_plan, kd *unsafe.Pointer, kc *C.int64_t,
	nkeys C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	data, err := view[unsafe.Pointer](kd, nkeys, "key_data")
	if err != nil {
		return m.fail(err)
	}
	caps, err := view[int64](kc, nkeys, "key_cap")
	if err != nil {
		return m.fail(err)
	}
	into := make([][]byte, len(data))
	for k := range data {
		if caps[k] < 0 || (data[k] == nil && caps[k] > 0) {
			return m.fail(fmt.Errorf("%w: key_data[%d] %p with capacity %d", errArgument, k, data[k], caps[k]))
		}
		if caps[k] > 0 {
			into[k] = unsafe.Slice((*byte)(data[k]), caps[k])
		}
	}
	if step != 0 {
		if err := e.c.Discard(omnicache.StepID(step)); err != nil {
			return m.fail(err) // nothing begun
		}
	}
	e.plan.ResultInto = into
	return m.fail(e.begin(cp))
}

//export ocgo_discard_begin_dev
func ocgo_discard_begin_dev(h C.uint64_t, step C.uint64_t, cp *C.omnicache_plan, kd *unsafe.Pointer, kc *C.int64_t,
	nkeys C.int64_t, stream C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	bufs, err := e.devBuffers(kd, kc, nkeys)
	if err != nil {
		return m.fail(err)
	}
	if step != 0 {
		if err := e.c.Discard(omnicache.StepID(step)); err != nil {
			return m.fail(err) // nothing begun
		}
	}
	// The library's copies into the buffers (the committer's during the
	// forward, Save's) start once the caller's last use of them did.
	if err := e.waitStream(uintptr(stream)); err != nil {
		return m.fail(err)
	}
	e.plan.ResultDev = bufs
	return m.fail(e.begin(cp))
}

// devBuffers views nkeys device buffers (pointers kd, capacities in bytes
// kc) of the cache's CUDA device.
func (e *entry) devBuffers(kd *unsafe.Pointer, kc *C.int64_t, nkeys C.int64_t) ([]gpu.Buffer, error) {
	if e.dev == nil {
		return nil, fmt.Errorf("%w: device buffers for a cache on the host device (OMNICACHE_DEVICE_CUDA, a cuda build)", errUnsupported)
	}
	data, err := view[unsafe.Pointer](kd, nkeys, "key_data")
	if err != nil {
		return nil, err
	}
	caps, err := view[int64](kc, nkeys, "key_cap")
	if err != nil {
		return nil, err
	}
	bufs := make([]gpu.Buffer, len(data))
	for k := range data {
		if caps[k] < 0 || (data[k] == nil && caps[k] > 0) {
			return nil, fmt.Errorf("%w: key_data[%d] %p with capacity %d", errArgument, k, data[k], caps[k])
		}
		bufs[k] = gpu.Buffer{Ptr: uintptr(data[k]), Size: int(caps[k])}
	}
	return bufs, nil
}

// waitEvent makes the device's stream wait for ev, a CUevent the caller
// recorded on its own stream (0: none).
func (e *entry) waitEvent(ev uintptr) error {
	if ev == 0 {
		return nil
	}
	w, ok := e.dev.(waiter)
	if !ok {
		return fmt.Errorf("%w: the device cannot wait for an event", errUnsupported)
	}
	if err := w.WaitExternal(ev); err != nil {
		return fmt.Errorf("%w: %w", omnicache.ErrOutputs, err)
	}
	return nil
}

// waitStream makes the device's stream wait for the work issued so far
// on the caller's CUstream stream (gpu.CUDA.WaitStream).
func (e *entry) waitStream(stream uintptr) error {
	w, ok := e.dev.(streamWaiter)
	if !ok {
		return fmt.Errorf("%w: the device cannot wait for a stream", errUnsupported)
	}
	if err := w.WaitStream(stream); err != nil {
		return fmt.Errorf("%w: %w", omnicache.ErrOutputs, err)
	}
	return nil
}

//export ocgo_begin
func ocgo_begin(h C.uint64_t, cp *C.omnicache_plan, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.begin(cp))
}

// begin runs Cache.Begin with the plan cp describes (borrowed for the
// call).
func (e *entry) begin(cp *C.omnicache_plan) error {
	if cp == nil {
		return fmt.Errorf("%w: NULL plan", errArgument)
	}
	p := &e.plan
	err := fillPlan(p, cp)
	if err == nil {
		err = e.c.Begin(p)
	}
	*p = omnicache.Plan{} // borrowed for the call
	return err
}

func fillPlan(p *omnicache.Plan, cp *C.omnicache_plan) (err error) {
	set64 := func(dst *[]int64, src *C.int64_t, n C.int64_t, what string) {
		if err == nil {
			*dst, err = view[int64](src, n, what)
		}
	}
	set32 := func(dst *[]int32, src *C.int32_t, n C.int64_t, what string) {
		if err == nil {
			*dst, err = view[int32](src, n, what)
		}
	}
	setU := func(dst *[]uint64, src *C.uint64_t, n C.int64_t, what string) {
		if err == nil {
			*dst, err = view[uint64](src, n, what)
		}
	}
	set64(&p.IDs, cp.ids, cp.n, "ids")
	set32(&p.Rows, cp.rows, cp.n, "rows")
	set32(&p.Start, cp.start, cp.n, "start")
	set32(&p.Count, cp.count, cp.n, "count")
	set32(&p.Table, cp.table, cp.table_len, "table")
	set64(&p.Arrivals, cp.arrivals, cp.n_arrivals, "arrivals")
	set32(&p.HitTokens, cp.hit_tokens, cp.n_arrivals, "hit_tokens")
	set32(&p.HitBlocks, cp.hit_blocks, cp.n_hit_blocks, "hit_blocks")
	set64(&p.Finished, cp.finished, cp.n_finished, "finished")
	set64(&p.Preempted, cp.preempted, cp.n_preempted, "preempted")
	set64(&p.Resumed, cp.resumed, cp.n_resumed, "resumed")
	set32(&p.FullBlocks, cp.full_blocks, cp.n_full, "full_blocks")
	setU(&p.FullHashes, cp.full_hashes, cp.n_full, "full_hashes")
	set32(&p.TierBlocks, cp.tier_blocks, cp.n_tier_blocks, "tier_blocks")
	setU(&p.TierHashes, cp.tier_hashes, cp.n_tier_hashes, "tier_hashes")
	set64(&p.Replaced, cp.replaced, cp.n_replaced, "replaced")
	set32(&p.ReplacedFrom, cp.replaced_from, cp.n_replaced, "replaced_from")
	if err != nil {
		return err
	}
	if cp.stride < 0 || int64(cp.stride) > math.MaxInt32 {
		return fmt.Errorf("%w: stride %d", errArgument, int64(cp.stride))
	}
	p.Stride = int(cp.stride)
	return nil
}

//export ocgo_save
func ocgo_save(h C.uint64_t, co *C.omnicache_outputs, step *C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	// A save that fails before the cache's Save undoes the begun step as
	// the cache's Save would (nothing of it is kept: begin it again).
	fail := func(err error) C.int {
		_ = e.c.Abort() // ErrSequence without a begun step: nothing to undo
		return m.fail(err)
	}
	if co == nil || step == nil {
		return fail(fmt.Errorf("%w: NULL outputs or step", errArgument))
	}
	ts, err := view[C.omnicache_tensor](co.tensors, co.ntensors, "tensors")
	if err != nil {
		return fail(err)
	}
	if len(ts) != len(e.keys) {
		return fail(fmt.Errorf("%w: %d tensors for %d keys", omnicache.ErrOutputs, len(ts), len(e.keys)))
	}
	acc, err := view[int32](co.accepted, co.n_accepted, "accepted")
	if err != nil {
		return fail(err)
	}
	o := &e.outs
	o.Tokens, o.Padded = int(co.tokens), int(co.padded)
	for k := range ts {
		t := &ts[k]
		switch {
		case t.flags&C.OMNICACHE_TENSOR_CUDA != 0 && e.dev == nil:
			return fail(fmt.Errorf("%w: key %q: a CUDA tensor for a cache on the host device (OMNICACHE_DEVICE_CUDA, a cuda build)", errUnsupported, e.keys[k].Name))
		case t.flags&^C.OMNICACHE_TENSOR_CUDA != 0 || t.reserved != 0:
			return fail(fmt.Errorf("%w: key %q: unknown tensor flags %#x", errArgument, e.keys[k].Name, uint32(t.flags)))
		case t.nbytes < 0 || t.rows < 0:
			return fail(fmt.Errorf("%w: key %q: negative size", errArgument, e.keys[k].Name))
		case t.data == nil && t.nbytes == 0:
			o.Tensors[k] = omnicache.Tensor{} // omitted
		case t.data == nil:
			return fail(fmt.Errorf("%w: key %q: NULL data with %d bytes", errArgument, e.keys[k].Name, int64(t.nbytes)))
		case t.event != 0 && t.flags&C.OMNICACHE_TENSOR_CUDA == 0:
			return fail(fmt.Errorf("%w: key %q: an event with a host tensor", errArgument, e.keys[k].Name))
		case t.flags&C.OMNICACHE_TENSOR_CUDA != 0:
			o.Tensors[k] = omnicache.Tensor{Dev: gpu.Buffer{Ptr: uintptr(t.data), Size: int(t.nbytes)}, Rows: int(t.rows)}
		default:
			o.Tensors[k] = omnicache.Tensor{Host: unsafe.Slice((*byte)(t.data), int(t.nbytes)), Rows: int(t.rows)}
		}
	}
	// The producers' events first: the clones Save issues on the device's
	// stream start once they completed (a wait enqueued for a Save that
	// then fails delays nothing but the stream).
	for k := range ts {
		if err := e.waitEvent(uintptr(ts[k].event)); err != nil {
			clear(o.Tensors)
			return fail(fmt.Errorf("key %q: %w", e.keys[k].Name, err))
		}
	}
	o.Accepted = acc
	id, err := e.c.Save(o)
	clear(o.Tensors) // borrowed for the call: the cache copied the rows
	o.Accepted = nil
	if err != nil {
		return m.fail(err)
	}
	*step = C.uint64_t(id)
	return C.OMNICACHE_OK
}

//export ocgo_abort
func ocgo_abort(h C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Abort())
}

//export ocgo_sync
func ocgo_sync(h C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Sync())
}

//export ocgo_reset
func ocgo_reset(h C.uint64_t, purge C.int, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Reset(context.Background(), omnicache.ResetOptions{PurgeTier: purge != 0}))
}

//export ocgo_discard
func ocgo_discard(h C.uint64_t, step C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(uint64(h))
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Discard(omnicache.StepID(step)))
}
