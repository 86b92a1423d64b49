// Materialize into the engine's buffers: the caller's (Result.Into),
// the plan's (Plan.ResultInto), the plan's device buffers (ResultDev).

package cachetest

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// matDev is MatCall of the whole step id into its ResultDev buffers dev
// (host memory: the host device's): MaterializeDev, then every request's
// rows must lie in dev, in place at its Offset, and Rows views them there.
// Buffers the step's rows outgrew (a hit the plan did not show) are
// replaced by buffers of the right size, which MaterializeDev fills by
// copying every row up.
func (h *Harness) matDev(id omnicache.StepID, res *omnicache.Result, dev []gpu.Buffer) error {
	h.T.Helper()
	h.dmu.Lock()
	delete(h.resultDev, id)
	h.dmu.Unlock()
	n, rows, serr := h.C.StepRows(id, nil)
	for k, key := range h.Cfg.Keys {
		if dev[k].Size < rows*key.RowBytes {
			dev = nil
			for _, key := range h.Cfg.Keys {
				b := bytes.Repeat([]byte{0xA5}, rows*key.RowBytes)
				dev = append(dev, gpu.Buffer{Host: b, Size: len(b)})
			}
			break
		}
	}
	err := Guard(h.T, fmt.Sprintf("%sMaterializeDev(%v)", h.prefix(), id), func() error {
		return h.C.MaterializeDev(id, dev, res, func() error { h.DevReady++; return nil })
	})
	if err == nil || !errors.Is(err, omnicache.ErrUnknownStep) {
		h.dmu.Lock()
		h.consumed[id] = true
		h.dmu.Unlock()
	}
	var re *omnicache.RequestError
	if serr != nil || err != nil && !errors.As(err, &re) {
		return err
	}
	require.Equal(h.T, n, res.Len(), "%sStepRows(%v): requests", h.prefix(), id)
	for k, key := range h.Cfg.Keys {
		for i := 0; i < res.Len(); i++ {
			if m := res.Tokens(i); m > 0 {
				got, lo := res.Rows(i, k), res.Offset(i)*key.RowBytes
				require.LessOrEqual(h.T, res.Offset(i)+m, rows, "%srequest %d's rows past the %d rows StepRows(%v) said", h.prefix(), res.ID(i), rows, id)
				require.True(h.T, &got[0] == &dev[k].Host[lo], "%skey %q of request %d not in the device buffer", h.prefix(), key.Name, res.ID(i))
			}
		}
	}
	return err
}

// into hands res buffers of its own for key rows (Result.Into), as many
// rows as Cache.StepRows says, filled with a pattern no row has; the
// returned check, given Materialize's error, requires that it failed as
// StepRows did, or that every request's rows lie inside those buffers,
// after each other (no copy into the Result's own memory), and no more
// rows than StepRows said.
func (h *Harness) into(id omnicache.StepID, reqs []int64, res *omnicache.Result) func(error) {
	_, rows, _ := h.C.StepRows(id, reqs)
	bufs := make([][]byte, len(h.Cfg.Keys))
	for k, key := range h.Cfg.Keys {
		bufs[k] = bytes.Repeat([]byte{0xA5}, rows*key.RowBytes)
	}
	return h.intoBufs(id, reqs, res, bufs)
}

// intoBufs is into with the buffers given: the step's ResultInto buffers
// for a whole-step read (Harness.ResultInto).
func (h *Harness) intoBufs(id omnicache.StepID, reqs []int64, res *omnicache.Result, bufs [][]byte) func(error) {
	n, rows, serr := h.C.StepRows(id, reqs)
	for k, key := range h.Cfg.Keys {
		if len(bufs[k]) < rows*key.RowBytes { // a hit the plan did not show: buffers of the right size
			bufs = make([][]byte, len(h.Cfg.Keys))
			for k, key := range h.Cfg.Keys {
				bufs[k] = bytes.Repeat([]byte{0xA5}, rows*key.RowBytes)
			}
			break
		}
	}
	res.Into(bufs)
	return func(err error) {
		h.T.Helper()
		if serr != nil {
			require.Error(h.T, err, "%sMaterialize(%v) after StepRows failed with %v", h.prefix(), id, serr)
			return
		}
		var re *omnicache.RequestError
		if err != nil && !errors.As(err, &re) {
			return // a whole-call failure: nothing served
		}
		require.Equal(h.T, n, res.Len(), "%sStepRows(%v): requests", h.prefix(), id)
		for k, key := range h.Cfg.Keys {
			end := 0
			for i := 0; i < res.Len(); i++ {
				off, m := res.Offset(i), res.Tokens(i)
				require.GreaterOrEqual(h.T, off, end, "%srequest %d's rows overlap the one before", h.prefix(), res.ID(i))
				require.LessOrEqual(h.T, off+m, rows, "%srequest %d's rows past the %d rows StepRows(%v) said", h.prefix(), res.ID(i), rows, id)
				if m > 0 {
					got := res.Rows(i, k)
					lo := off * key.RowBytes
					require.True(h.T, &got[0] == &bufs[k][lo], "%skey %q of request %d not served in the caller's buffer", h.prefix(), key.Name, res.ID(i))
				}
				end = off + m
			}
		}
	}
}
