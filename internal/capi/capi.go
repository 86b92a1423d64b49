// Command capi is omnicache's C ABI: built with
//
//	go build -buildmode=c-shared -o libomnicache.so ./internal/capi
//
// (make python) it is the shared library the Python package loads. The
// public header is omnicache.h; the exported entry points are the C
// functions of abi.c, which refuse calls in a forked child before they
// enter Go and then call the ocgo_* functions here. A linker version
// script (omnicache.map) keeps every symbol but omnicache_* local.
//
// Handles: a cache is named by an integer handle into a fixed table
// (slot index and generation); no Go pointer crosses the ABI. Close
// replaces the slot's entry with a tombstone that keeps only the handle
// (a closed handle answers OMNICACHE_ERR_CLOSED until the slot is reused):
// nothing of a closed cache stays reachable from the table. Plans,
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
	"errors"
	"fmt"
	"math"
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

	tier *tier.Tier
	back tier.Backend
	dev  gpu.Device // nil: the host device
}

var (
	table   [1 << tableBits]atomic.Pointer[entry]
	tableMu sync.Mutex // New and slot reuse
	gen     uint64     // under tableMu
	nextIdx int        // under tableMu
)

var errBadHandle = errors.New("omnicache: no such cache handle")

func lookup(h uint64) (*entry, error) {
	e := table[h&(1<<tableBits-1)].Load()
	if e == nil || e.h != h || h == 0 {
		return nil, fmt.Errorf("%w: %d", errBadHandle, h)
	}
	if e.c == nil { // a closed cache's tombstone
		return nil, fmt.Errorf("%w: handle %d", omnicache.ErrClosed, h)
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
	if cc.flags&^(C.OMNICACHE_DISABLE_DECODE_BUFFER|C.OMNICACHE_DISABLE_PREFETCH|C.OMNICACHE_ALLOC_STAGING_AT_NEW|C.OMNICACHE_ALLOC_STAGING_AHEAD|C.OMNICACHE_DEVICE_CUDA|C.OMNICACHE_TIER_PUBLISH_BARRIER) != 0 {
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
	e := &entry{keys: cfg.Keys}
	if cc.flags&C.OMNICACHE_TIER_PUBLISH_BARRIER != 0 && cc.tier_spec == nil {
		return nil, fmt.Errorf("%w: OMNICACHE_TIER_PUBLISH_BARRIER without a tier", omnicache.ErrConfig)
	}
	importTimeout, err := seconds(cc.tier_import_timeout_s)
	if err != nil || importTimeout < 0 {
		return nil, fmt.Errorf("%w: tier_import_timeout_s %v", errArgument, float64(cc.tier_import_timeout_s))
	}
	if cc.tier_spec != nil {
		back, err := openBackend(C.GoString(cc.tier_spec))
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
		cfg.Tier = &omnicache.TierConfig{Tier: t, ImportTimeout: importTimeout,
			PublishBarrier: cc.flags&C.OMNICACHE_TIER_PUBLISH_BARRIER != 0}
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

// streamWaiter is the CUDA device's WaitStream (gpu/cuda_wait.go).
type streamWaiter interface{ WaitStream(stream uintptr) error }

//export ocgo_close
func ocgo_close(h C.uint64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	return m.fail(closeHandle(uint64(h)))
}

// closeHandle closes the cache of handle h and everything New opened
// with it, then puts a tombstone in its table slot, so that the table
// keeps nothing of it (its block tables, staging pages, mirror, the
// tier's value pools): a closed handle answers ErrClosed until the slot
// is reused, and the cache is garbage once the calls in flight on it
// returned. A second Close returns nil.
func closeHandle(h uint64) error {
	e, err := lookup(h)
	if errors.Is(err, omnicache.ErrClosed) {
		return nil // a second Close
	}
	if err != nil {
		return err
	}
	if e.closed.Swap(true) {
		return nil // a second Close, racing the first
	}
	err = e.c.Close()
	e.closeTier()
	tomb := &entry{h: h}
	tomb.closed.Store(true)
	table[h&(1<<tableBits-1)].CompareAndSwap(e, tomb)
	return err
}
