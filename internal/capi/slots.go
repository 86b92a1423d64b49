// The slot mapping call: a step's KV slots from a block table.

package main

/*
#include <stdint.h>
#include "omnicache.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/omnicache/omnicache/slots"
)

//export ocgo_slots
func ocgo_slots(table *C.int32_t, tableLen, stride C.int64_t, rows, start, count *C.int32_t, n, blockSize C.int64_t,
	dst *C.int64_t, capacity C.int64_t, written *C.int64_t, mp *C.char, mcap C.int64_t, mn *C.int64_t) (rc C.int) {
	m := msgBuf{mp, mcap, mn}
	defer m.recoverInto(&rc)
	if written == nil {
		return m.fail(fmt.Errorf("%w: NULL written", errArgument))
	}
	var b slots.Batch
	var err error
	if b.Table, err = view[int32](table, tableLen, "table"); err != nil {
		return m.fail(err)
	}
	if b.Rows, err = view[int32](rows, n, "rows"); err != nil {
		return m.fail(err)
	}
	if b.Start, err = view[int32](start, n, "start"); err != nil {
		return m.fail(err)
	}
	if b.Count, err = view[int32](count, n, "count"); err != nil {
		return m.fail(err)
	}
	out, err := view[int64](dst, capacity, "dst")
	if err != nil {
		return m.fail(err)
	}
	if int64(stride) != int64(int(stride)) || int64(blockSize) != int64(int(blockSize)) {
		return m.fail(fmt.Errorf("%w: stride %d, block size %d overflow int", errArgument, int64(stride), int64(blockSize)))
	}
	b.Stride = int(stride)
	// Map writes int32 slots: into the upper half of dst's bytes (cap
	// int32s), widened from there in place. Slot i of the int64 result
	// covers the int32 words 2i and 2i+1, which are at most word cap+i,
	// the one read for it: the widening never overwrites a word it has
	// not read yet.
	var half []int32
	if len(out) > 0 {
		half = unsafe.Slice((*int32)(unsafe.Pointer(&out[0])), 2*len(out))[len(out):]
	}
	k, err := slots.Map(half, b, int(blockSize))
	if errors.Is(err, slots.ErrShortDst) {
		total, _ := slots.Total(b, int(blockSize))
		*written = C.int64_t(total)
		return m.fail(fmt.Errorf("%w: %d slots, dst holds %d", errShortBuffer, total, len(out)))
	}
	if err != nil {
		*written = 0
		return m.fail(fmt.Errorf("%w: %w", errArgument, err))
	}
	widen(out[:k], half[:k])
	*written = C.int64_t(k)
	return C.OMNICACHE_OK
}

// widen sets out[i] = int64(half[i]), front to back (half may lie in
// out's upper bytes; see ocgo_slots).
func widen(out []int64, half []int32) {
	half = half[:len(out)]
	for i, v := range half {
		out[i] = int64(v)
	}
}
