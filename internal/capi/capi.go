// Command capi is omnicache's C ABI: built with
//
//	go build -buildmode=c-shared -o libomnicache.so ./capi
//
// (make python) it is the shared library the Python package loads. The
// public header is omnicache.h; the exported entry points are the C
// functions of abi.c, which refuse calls in a forked child before they
// enter Go and then call the ocgo_* functions here. A linker version
// script (omnicache.map) keeps every symbol but omnicache_* local.
//
// Handles: a cache is named by an integer handle into a fixed table
// (slot index and generation); no Go pointer crosses the ABI. Plans,
// outputs and result buffers are the caller's memory, viewed as Go slices
// (unsafe.Slice) for the duration of a call: the cache borrows plans and
// outputs for the call only, and copies non-owned host outputs before Save
// returns, so nothing retains the caller's memory after the call.
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
	"math"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/tier"
)

func main() {}

// ---- handles ----

// tableBits bounds the caches open at once (1<<tableBits).
const tableBits = 12

type entry struct {
	h      uint64
	c      *omnicache.Cache
	keys   []omnicache.Key
	closed atomic.Bool

	// engine-goroutine scratch: Begin's plan and Save's outputs, reused so
	// that a steady step allocates nothing (one engine thread at a time).
	plan omnicache.Plan
	outs omnicache.Outputs

	// parked holds results a Materialize could not fit in the caller's
	// buffers (OMNICACHE_ERR_SHORT_BUFFER), by step, until asked again;
	// nparked is its length, so that a step's discard takes no lock when
	// nothing is parked (the usual case).
	mu      sync.Mutex
	parked  map[uint64]*parkedResult
	nparked atomic.Int32
	tier    *tier.Tier
	back    tier.Backend
	dev     gpu.Device // nil: the host device
}

type parkedResult struct {
	res *omnicache.Result
	err error
}

var (
	table   [1 << tableBits]atomic.Pointer[entry]
	tableMu sync.Mutex // New and slot reuse
	gen     uint64     // under tableMu
	nextIdx int        // under tableMu
)

var errBadHandle = errors.New("omnicache: no such cache handle")

func lookup(h C.uint64_t) (*entry, error) {
	e := table[uint64(h)&(1<<tableBits-1)].Load()
	if e == nil || e.h != uint64(h) || h == 0 {
		return nil, fmt.Errorf("%w: %d", errBadHandle, uint64(h))
	}
	return e, nil
}

func register(e *entry) error {
	tableMu.Lock()
	defer tableMu.Unlock()
	for i := 0; i < len(table); i++ {
		idx := (nextIdx + i) % len(table)
		old := table[idx].Load()
		if old != nil && !old.closed.Load() {
			continue
		}
		gen++
		e.h = gen<<tableBits | uint64(idx)
		table[idx].Store(e)
		nextIdx = idx + 1
		return nil
	}
	return fmt.Errorf("%w: %d caches open at once", errArgument, len(table))
}

// ---- errors ----

var (
	errArgument    = errors.New("omnicache: bad argument")
	errShortBuffer = errors.New("omnicache: result buffers too small")
	errUnsupported = errors.New("omnicache: not supported by this build")
	errPanic       = errors.New("omnicache: panic in the library")
)

// codes maps every error the ABI returns to its stable code; the first
// match wins (a sticky write failure before the device timeout it wraps).
var codes = []struct {
	err  error
	code C.int
}{
	{omnicache.ErrWriteFailed, C.OMNICACHE_ERR_WRITE_FAILED},
	{omnicache.ErrConfig, C.OMNICACHE_ERR_CONFIG},
	{omnicache.ErrClosed, C.OMNICACHE_ERR_CLOSED},
	{omnicache.ErrSequence, C.OMNICACHE_ERR_SEQUENCE},
	{omnicache.ErrPlan, C.OMNICACHE_ERR_PLAN},
	{omnicache.ErrUnalignedHit, C.OMNICACHE_ERR_UNALIGNED_HIT},
	{omnicache.ErrHitBlocks, C.OMNICACHE_ERR_HIT_BLOCKS},
	{omnicache.ErrTokenCount, C.OMNICACHE_ERR_TOKEN_COUNT},
	{omnicache.ErrOutputs, C.OMNICACHE_ERR_OUTPUTS},
	{omnicache.ErrStepTooLarge, C.OMNICACHE_ERR_STEP_TOO_LARGE},
	{omnicache.ErrStagingTimeout, C.OMNICACHE_ERR_STAGING_TIMEOUT},
	{omnicache.ErrUnknownStep, C.OMNICACHE_ERR_UNKNOWN_STEP},
	{omnicache.ErrNotInStep, C.OMNICACHE_ERR_NOT_IN_STEP},
	{omnicache.ErrAbsentRequired, C.OMNICACHE_ERR_ABSENT_REQUIRED},
	{omnicache.ErrReassigned, C.OMNICACHE_ERR_REASSIGNED},
	{omnicache.ErrBudget, C.OMNICACHE_ERR_BUDGET},
	{omnicache.ErrDeviceTimeout, C.OMNICACHE_ERR_DEVICE_TIMEOUT},
	{omnicache.ErrTierMiss, C.OMNICACHE_ERR_TIER_MISS},
	{omnicache.ErrReset, C.OMNICACHE_ERR_RESET},
	{tier.ErrCircuitOpen, C.OMNICACHE_ERR_TIER_CIRCUIT_OPEN}, // before ErrUnavailable, which it wraps
	{tier.ErrUnavailable, C.OMNICACHE_ERR_TIER_UNAVAILABLE},
	{tier.ErrAuth, C.OMNICACHE_ERR_TIER_AUTH},
	{tier.ErrConfig, C.OMNICACHE_ERR_TIER_CONFIG},
	{tier.ErrClosed, C.OMNICACHE_ERR_TIER_CLOSED},
	{tier.ErrMiss, C.OMNICACHE_ERR_TIER_MISS},
	{tier.ErrCorrupt, C.OMNICACHE_ERR_TIER_MISS}, // a corrupt value is a miss
	{errArgument, C.OMNICACHE_ERR_ARGUMENT},
	{errBadHandle, C.OMNICACHE_ERR_BAD_HANDLE},
	{errShortBuffer, C.OMNICACHE_ERR_SHORT_BUFFER},
	{errPanic, C.OMNICACHE_ERR_PANIC},
	{errUnsupported, C.OMNICACHE_ERR_UNSUPPORTED},
	{gpu.ErrNoCUDA, C.OMNICACHE_ERR_UNSUPPORTED},
	{gpu.ErrNoDevice, C.OMNICACHE_ERR_NO_DEVICE},
}

func code(err error) C.int {
	if err == nil {
		return C.OMNICACHE_OK
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return C.OMNICACHE_ERR_INTERNAL
}

// msgBuf is the calling thread's message buffer (abi.c).
type msgBuf struct {
	p   *C.char
	cap C.int64_t
	n   *C.int64_t
}

// fail stores err's message and returns its code.
func (m msgBuf) fail(err error) C.int {
	if err == nil {
		return C.OMNICACHE_OK
	}
	s := err.Error()
	if m.p != nil && m.cap > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(m.p)), int(m.cap))
		n := copy(dst[:len(dst)-1], s)
		dst[n] = 0
	}
	if m.n != nil {
		*m.n = C.int64_t(len(s))
	}
	return code(err)
}

// recoverInto turns a panic into OMNICACHE_ERR_PANIC (deferred by every
// export).
func (m msgBuf) recoverInto(rc *C.int) {
	if r := recover(); r != nil {
		*rc = m.fail(fmt.Errorf("%w: %v", errPanic, r))
	}
}

// ---- memory views ----

// view is the caller's n elements at p as a Go slice (nil when n is 0),
// valid for the call.
func view[T any, P any](p *P, n C.int64_t, what string) ([]T, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: %s: negative length %d", errArgument, what, int64(n))
	}
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, fmt.Errorf("%w: %s: NULL with length %d", errArgument, what, int64(n))
	}
	return unsafe.Slice((*T)(unsafe.Pointer(p)), int(n)), nil
}

func goString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

func seconds(s C.double) (time.Duration, error) {
	f := float64(s)
	if math.IsNaN(f) || math.Abs(f) > float64(math.MaxInt64)/1e9 {
		return 0, fmt.Errorf("%w: duration %v s", errArgument, f)
	}
	return time.Duration(f * 1e9), nil
}

// ---- entry points (called by abi.c) ----

//export ocgo_new
func ocgo_new(cc *C.omnicache_config, out *C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	if cc == nil || out == nil {
		return m.fail(fmt.Errorf("%w: NULL config or handle", errArgument))
	}
	e, err := newEntry(cc)
	if err != nil {
		return m.fail(err)
	}
	*out = C.uint64_t(e.h)
	return C.OMNICACHE_OK
}

func newEntry(cc *C.omnicache_config) (*entry, error) {
	if cc.flags&^(C.OMNICACHE_DISABLE_DECODE_BUFFER|C.OMNICACHE_DISABLE_PREFETCH|C.OMNICACHE_ALLOC_STAGING_AT_NEW|C.OMNICACHE_ALLOC_STAGING_AHEAD|C.OMNICACHE_DEVICE_CUDA) != 0 {
		return nil, fmt.Errorf("%w: unknown config flags %#x", errArgument, uint32(cc.flags))
	}
	ck, err := view[C.omnicache_key](cc.keys, cc.nkeys, "keys")
	if err != nil {
		return nil, err
	}
	cfg := omnicache.Config{
		NumBlocks:             int(cc.num_blocks),
		BlockSize:             int(cc.block_size),
		StagingDepth:          int(cc.staging_depth),
		StagingCapacityTokens: int(cc.staging_capacity_tokens),
		DeviceBudgetBytes:     int64(cc.device_budget_bytes),
		DeferredChunkBytes:    int64(cc.deferred_chunk_bytes),
		ReadAheadBytes:        int64(cc.read_ahead_bytes),
		CopyWorkers:           int(cc.copy_workers),
		DisableDecodeBuffer:   cc.flags&C.OMNICACHE_DISABLE_DECODE_BUFFER != 0,
		DisablePrefetch:       cc.flags&C.OMNICACHE_DISABLE_PREFETCH != 0,
		AllocStagingAtNew:     cc.flags&C.OMNICACHE_ALLOC_STAGING_AT_NEW != 0,
		AllocStagingAhead:     cc.flags&C.OMNICACHE_ALLOC_STAGING_AHEAD != 0,
	}
	if int64(cc.num_blocks) != int64(cfg.NumBlocks) || int64(cc.block_size) != int64(cfg.BlockSize) {
		return nil, fmt.Errorf("%w: sizes overflow int", omnicache.ErrConfig)
	}
	if cfg.StagingClaimTimeout, err = seconds(cc.staging_claim_timeout_s); err != nil {
		return nil, err
	}
	if cc.staging_claim_timeout_s < 0 {
		cfg.StagingClaimTimeout = omnicache.NoWait
	}
	if cfg.WaitTimeout, err = seconds(cc.wait_timeout_s); err != nil {
		return nil, err
	}
	if cc.wait_timeout_s < 0 {
		cfg.WaitTimeout = -1
	}
	for i := range ck {
		k := &ck[i]
		if k.flags&^(C.OMNICACHE_KEY_OPTIONAL|C.OMNICACHE_KEY_DEFERRED) != 0 || k.reserved != 0 {
			return nil, fmt.Errorf("%w: key %d: unknown flags %#x", errArgument, i, uint32(k.flags))
		}
		if k.name == nil {
			return nil, fmt.Errorf("%w: key %d: NULL name", errArgument, i)
		}
		cfg.Keys = append(cfg.Keys, omnicache.Key{
			Name:     C.GoString(k.name),
			RowBytes: int(k.row_bytes),
			Optional: k.flags&C.OMNICACHE_KEY_OPTIONAL != 0,
			Deferred: k.flags&C.OMNICACHE_KEY_DEFERRED != 0,
		})
	}
	e := &entry{keys: cfg.Keys, parked: map[uint64]*parkedResult{}}
	if cc.tier_spec != nil {
		back, err := tier.Open(C.GoString(cc.tier_spec), tier.RedisOptions{})
		if err != nil {
			return nil, err
		}
		ns := tier.Namespace{Model: goString(cc.tier_model), BlockSize: cfg.BlockSize}
		for _, k := range cfg.Keys {
			ns.Keys = append(ns.Keys, tier.Key{Name: k.Name, RowBytes: k.RowBytes})
		}
		t, err := tier.New(back, ns, tier.Options{})
		if err != nil {
			back.Close()
			return nil, err
		}
		e.tier, e.back = t, back
		cfg.Tier = &omnicache.TierConfig{Tier: t}
	}
	if cc.flags&C.OMNICACHE_DEVICE_CUDA != 0 {
		dev, err := gpu.NewCUDA(int(cc.cuda_device))
		if err != nil {
			e.closeTier()
			return nil, fmt.Errorf("CUDA device %d: %w", int(cc.cuda_device), err)
		}
		e.dev, cfg.Device = dev, dev
	}
	c, err := omnicache.New(cfg)
	if err != nil {
		e.closeTier()
		return nil, err
	}
	e.c = c
	e.outs.Tensors = make([]omnicache.Tensor, len(cfg.Keys))
	if err := register(e); err != nil {
		c.Close()
		e.closeTier()
		return nil, err
	}
	return e, nil
}

// closeTier closes what New opened besides the cache: the tier's backend
// and the CUDA device.
func (e *entry) closeTier() {
	if e.back != nil {
		e.back.Close()
	}
	if e.dev != nil {
		e.dev.Close()
	}
}

// waiter is the CUDA device's WaitExternal (gpu/cuda_wait.go).
type waiter interface{ WaitExternal(ev uintptr) error }

//export ocgo_close
func ocgo_close(h C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	if e.closed.Swap(true) {
		return C.OMNICACHE_OK // a second Close
	}
	err = e.c.Close()
	e.closeTier()
	e.mu.Lock()
	e.parked = map[uint64]*parkedResult{}
	e.nparked.Store(0)
	e.mu.Unlock()
	return m.fail(err)
}

//export ocgo_discard_begin
func ocgo_discard_begin(h C.uint64_t, step C.uint64_t, cp *C.omnicache_plan, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	if step != 0 && e.unpark(uint64(step)) == nil {
		if err := e.c.Discard(omnicache.StepID(step)); err != nil {
			return m.fail(err) // nothing begun
		}
	}
	return m.fail(e.begin(cp))
}

//export ocgo_begin
func ocgo_begin(h C.uint64_t, cp *C.omnicache_plan, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
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
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	if co == nil || step == nil {
		return m.fail(fmt.Errorf("%w: NULL outputs or step", errArgument))
	}
	ts, err := view[C.omnicache_tensor](co.tensors, co.ntensors, "tensors")
	if err != nil {
		return m.fail(err)
	}
	if len(ts) != len(e.keys) {
		return m.fail(fmt.Errorf("%w: %d tensors for %d keys", omnicache.ErrOutputs, len(ts), len(e.keys)))
	}
	acc, err := view[int32](co.accepted, co.n_accepted, "accepted")
	if err != nil {
		return m.fail(err)
	}
	o := &e.outs
	o.Tokens, o.Padded = int(co.tokens), int(co.padded)
	for k := range ts {
		t := &ts[k]
		switch {
		case t.flags&C.OMNICACHE_TENSOR_CUDA != 0 && e.dev == nil:
			return m.fail(fmt.Errorf("%w: key %q: a CUDA tensor for a cache on the host device (OMNICACHE_DEVICE_CUDA, a cuda build)", errUnsupported, e.keys[k].Name))
		case t.flags&^C.OMNICACHE_TENSOR_CUDA != 0 || t.reserved != 0:
			return m.fail(fmt.Errorf("%w: key %q: unknown tensor flags %#x", errArgument, e.keys[k].Name, uint32(t.flags)))
		case t.nbytes < 0 || t.rows < 0:
			return m.fail(fmt.Errorf("%w: key %q: negative size", errArgument, e.keys[k].Name))
		case t.data == nil && t.nbytes == 0:
			o.Tensors[k] = omnicache.Tensor{} // omitted
		case t.data == nil:
			return m.fail(fmt.Errorf("%w: key %q: NULL data with %d bytes", errArgument, e.keys[k].Name, int64(t.nbytes)))
		case t.event != 0 && t.flags&C.OMNICACHE_TENSOR_CUDA == 0:
			return m.fail(fmt.Errorf("%w: key %q: an event with a host tensor", errArgument, e.keys[k].Name))
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
		if ev := uintptr(ts[k].event); ev != 0 {
			w, ok := e.dev.(waiter)
			if !ok {
				clear(o.Tensors)
				return m.fail(fmt.Errorf("%w: key %q: the device cannot wait for an event", errUnsupported, e.keys[k].Name))
			}
			if err := w.WaitExternal(ev); err != nil {
				clear(o.Tensors)
				return m.fail(fmt.Errorf("%w: key %q: %w", omnicache.ErrOutputs, e.keys[k].Name, err))
			}
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
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Abort())
}

//export ocgo_sync
func ocgo_sync(h C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Sync())
}

//export ocgo_reset
func ocgo_reset(h C.uint64_t, purge C.int, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	return m.fail(e.c.Reset(context.Background(), omnicache.ResetOptions{PurgeTier: purge != 0}))
}

//export ocgo_discard
func ocgo_discard(h C.uint64_t, step C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	e, err := lookup(h)
	if err != nil {
		return m.fail(err)
	}
	if e.unpark(uint64(step)) != nil {
		return C.OMNICACHE_OK // consumed by the Materialize that parked it
	}
	return m.fail(e.c.Discard(omnicache.StepID(step)))
}

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
