// Device results (Plan.ResultDev, MaterializeDev): the step's Result put
// in the engine's device buffers while it works, so that Materialize
// waits for rows there rather than copies them.

package omnicache

import (
	"fmt"
	"unsafe"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/internal/tierlink"
)

// checkResultDev validates the plan's ResultDev buffers (Begin, before
// anything is applied).
func (c *Cache) checkResultDev(p *Plan) error {
	if len(p.ResultDev) == 0 {
		return nil
	}
	if len(p.ResultDev) != len(c.cfg.Keys) {
		return fmt.Errorf("%w: %d ResultDev buffers for %d keys", ErrPlan, len(p.ResultDev), len(c.cfg.Keys))
	}
	if len(p.ResultInto) != 0 {
		return fmt.Errorf("%w: ResultDev and ResultInto together: give one of them", ErrPlan)
	}
	for k, b := range p.ResultDev {
		if b.IsZero() {
			return fmt.Errorf("%w: key %q: a zero ResultDev buffer", ErrPlan, c.cfg.Keys[k].Name)
		}
		if err := c.cfg.Device.Check(b); err != nil {
			return fmt.Errorf("%w: key %q: ResultDev: %w", ErrPlan, c.cfg.Keys[k].Name, err)
		}
	}
	return nil
}

// resultDevFor keeps the begun step's ResultDev buffers when each holds
// the step's Result (its scheduled tokens and the hit prefixes it serves,
// e.hits), else none (left unused, as ResultInto's).
func (c *Cache) resultDevFor(dev []gpu.Buffer) {
	e := &c.eng
	e.resultDev = scratch.Empty(e.resultDev)
	if len(dev) == 0 {
		return
	}
	rows := e.tokens
	for _, h := range e.hits {
		rows += int(h.Tokens)
	}
	for k, rb := range c.lay.RowBytes {
		if dev[k].Size < rows*rb {
			return
		}
	}
	e.resultDev = append(e.resultDev, dev...)
}

// saveDev copies the step's own rows into its ResultDev buffers, each
// request's after its hit prefix, from the outputs (checked): device
// tensors device to device, host tensors host to device, an omitted key's
// rows zeroed. Issued on the device's stream before the write path sees
// the step, so that Save's wait for its clones (or the wait that follows)
// covers them; it returns the event that marks them done, which Save
// waits for (an event of its own: the committer's copies of the step
// that follow on the stream are not waited for). A copy that fails is the
// sticky failure.
func (c *Cache) saveDev(o *Outputs, rec *reader.Step) (gpu.Event, error) {
	e := &c.eng
	if len(rec.ResultDev()) == 0 { // a hit step planned at Begin has them (its committer may be reading them)
		rec.SetResultDev(e.resultDev)
	}
	n := len(rec.IDs)
	e.devOff = scratch.Grow(e.devOff, n)
	clear(e.devOff)
	for _, h := range e.hits { // devOff holds the prefixes for a moment
		e.devOff[h.Index] = h.Tokens
	}
	row := int32(0)
	for i := 0; i < n; i++ {
		row += e.devOff[i]
		e.devOff[i] = row
		row += rec.Count[i]
	}
	d := c.cfg.Device
	for k, rb := range c.lay.RowBytes {
		t := &o.Tensors[k]
		dst := e.resultDev[k]
		// Runs of requests with no prefix between them are one copy.
		src := 0
		for i := 0; i < n; {
			j, cnt := i+1, int(rec.Count[i])
			for j < n && e.devOff[j] == e.devOff[j-1]+rec.Count[j-1] {
				cnt += int(rec.Count[j])
				j++
			}
			at, nb := int(e.devOff[i])*rb, cnt*rb
			var err error
			switch {
			case nb == 0:
			case t.Host != nil:
				err = d.CopyHtoD(dst, at, t.Host[src:src+nb])
			case !t.Dev.IsZero():
				err = d.CopyDtoD(dst, at, t.Dev, src, nb)
			default:
				err = c.zeroDev(dst, at, nb)
			}
			if err != nil {
				return 0, c.path.Fail(fmt.Errorf("copying step rows into ResultDev: %w", err))
			}
			src += nb
			i = j
		}
	}
	ev, err := d.Record()
	if err != nil {
		return 0, c.path.Fail(fmt.Errorf("copying step rows into ResultDev: %w", err))
	}
	return ev, nil
}

// zeroDev zeroes n bytes of b from off (host to device, from a zero
// buffer kept for it).
func (c *Cache) zeroDev(b gpu.Buffer, off, n int) error {
	const chunk = 1 << 20
	c.devZero.Do(func() { c.zeros = make([]byte, chunk) })
	for n > 0 {
		m := min(n, chunk)
		if err := c.cfg.Device.CopyHtoD(b, off, c.zeros[:m]); err != nil {
			return err
		}
		off, n = off+m, n-m
	}
	return nil
}

// waitDev waits for the device copies issued up to ev (0: all issued so
// far); a failure is sticky.
func (c *Cache) waitDev(ev gpu.Event) error {
	d := c.cfg.Device
	var err error
	if ev == 0 {
		ev, err = d.Record()
	}
	if err == nil {
		err = d.Wait(ev)
	}
	if err != nil {
		return c.path.Fail(fmt.Errorf("device copies of a ResultDev: %w", err))
	}
	return nil
}

// MaterializeDev is Materialize of the whole step (every request, in batch
// order) into device memory of the cache's device: bufs holds per key
// (Config.Keys order) a buffer of at least StepRows(id, nil) rows of the
// key's RowBytes. dst receives what a Materialize gives but the rows: per
// request ID, Prefix, Tokens, From, Err and Offset, the row of every
// key's buffer at which its rows begin (Rows views them only where the
// buffers are host memory, a host device's; else it returns nil).
// Into the step's own Plan.ResultDev buffers it waits for the rows that
// moved while the engine worked, and copies only what did not (a hit not
// prefetched: read, then copied up); into other buffers it reads the step
// and copies every row up. A request not served has its rows zeroed and
// Err set, as with Materialize (*RequestError). The copies are complete
// when it returns. Buffers too small (or not the device's), or as many as
// the keys, are ErrOutputs and consume nothing.
//
// ready, when not nil, runs once before the first copy MaterializeDev
// issues into bufs, and not at all when every row is in place already:
// the C ABI makes the device's stream wait for the caller's stream there
// (gpu.CUDA.WaitStream), so that only a call that writes pays for it. Its
// error fails the call (ErrOutputs wrapping it; the step is consumed,
// nothing delivered). Any goroutine.
func (c *Cache) MaterializeDev(id StepID, bufs []gpu.Buffer, dst *Result, ready func() error) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if dst == nil {
		return fmt.Errorf("%w: nil Result (the step stays unconsumed)", ErrOutputs)
	}
	if len(bufs) != len(c.cfg.Keys) {
		return fmt.Errorf("%w: %d device buffers for %d keys (the step stays unconsumed)", ErrOutputs, len(bufs), len(c.cfg.Keys))
	}
	_, rows, err := c.StepRows(id, nil)
	if err != nil {
		return err
	}
	for k, rb := range c.lay.RowBytes {
		if need := rows * rb; bufs[k].Size < need {
			return fmt.Errorf("%w: key %q: a %d-byte device buffer for %d rows of %d bytes (the step stays unconsumed)",
				ErrOutputs, c.cfg.Keys[k].Name, bufs[k].Size, rows, rb)
		} else if need > 0 {
			if err := c.cfg.Device.Check(bufs[k]); err != nil {
				return fmt.Errorf("%w: key %q: %w (the step stays unconsumed)", ErrOutputs, c.cfg.Keys[k].Name, err)
			}
		}
	}
	into := dst.into
	dst.into = nil // no host buffers to clash with the step's; rows read on the host go to dst's own memory
	sv, imp, err := c.take(id, nil, dst)
	if err == nil {
		err = c.readDev(sv.rec, bufs, dst, imp, ready)
	}
	dst.into = into
	if sv.rec == nil {
		return err // not taken: nothing changed
	}
	dst.dev = true
	for k, rb := range c.lay.RowBytes {
		dst.keys[k] = nil
		if h := bufs[k].Host; h != nil && err == nil {
			dst.keys[k] = h[:rows*rb] // a host device's buffers are host memory: Rows views them
		}
	}
	return c.served(id, dst, err)
}

// readDev serves the taken step rec into bufs (MaterializeDev) and
// releases rec.
func (c *Cache) readDev(rec *reader.Step, bufs []gpu.Buffer, dst *Result, imp *tierlink.Import, ready func() error) error {
	if err := c.readable(rec); err != nil {
		return err
	}
	_, nq := c.layout(rec, nil, dst)
	trimmed := rec.Trimmed // stable until rec is released
	for k := range dst.keys {
		dst.keys[k] = nil // no host rows unless read below (a failed request clears none)
	}
	done, err := false, error(nil)
	if sameBuffers(rec.ResultDev(), bufs) {
		done, err = c.rd.ReadDev(rec, nq, dest{dst})
	}
	if err == nil && !done {
		dst.size()
		err = c.rd.Read(rec, true, nq, dest{dst})
	}
	c.drop(rec)
	if err != nil {
		return err
	}
	if imp != nil {
		c.failImports(imp, dst)
	}
	// Copies only where rows did not move already (a fallback read, a
	// failed request): the rows that moved were waited for (Save, ReadDev),
	// and a wait here would also wait for the committer's copies of later
	// steps on the same stream.
	d, issued := c.cfg.Device, !done || dst.nfail > 0
	if issued && ready != nil {
		if err := ready(); err != nil {
			return fmt.Errorf("%w: before copying into the device buffers: %w", ErrOutputs, err)
		}
	}
	for k, rb := range c.lay.RowBytes {
		if !done {
			err = d.CopyHtoD(bufs[k], 0, dst.keys[k][:dst.rows()*rb]) // failed requests' rows are zeros
		} else if dst.nfail > 0 {
			for qi, e := range dst.errs {
				if e != nil && err == nil {
					err = c.zeroDev(bufs[k], dst.Offset(qi)*rb, dst.Tokens(qi)*rb)
				}
			}
		}
		if err != nil {
			return c.path.Fail(fmt.Errorf("copying a Result up into device buffers: %w", err))
		}
	}
	if issued {
		if err := c.waitDev(0); err != nil {
			return err
		}
	}
	c.cutRows(trimmed, dst)
	return c.check()
}

// OwnResultDev reports whether bufs are the Plan.ResultDev buffers step id
// keeps (begun with them, each holding the step's rows): MaterializeDev
// into them finds the rows that moved while the engine worked.
// ErrUnknownStep as Materialize. Any goroutine.
func (c *Cache) OwnResultDev(id StepID, bufs []gpu.Buffer) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sv := range c.steps {
		if sv.rec.ID == uint64(id) {
			return sameBuffers(sv.rec.ResultDev(), bufs), nil
		}
	}
	return false, fmt.Errorf("%w: %d", ErrUnknownStep, id)
}

// sameBuffers reports whether bufs are the step's ResultDev buffers (the
// same memory from the same start, per key).
func sameBuffers(dev, bufs []gpu.Buffer) bool {
	if len(dev) == 0 || len(dev) != len(bufs) {
		return false
	}
	for k := range dev {
		if bufStart(dev[k]) != bufStart(bufs[k]) {
			return false
		}
	}
	return true
}

// bufStart is the address b starts at (its host memory's for a host
// device's buffer).
func bufStart(b gpu.Buffer) uintptr {
	if len(b.Host) > 0 {
		return uintptr(unsafe.Pointer(&b.Host[0]))
	}
	return b.Ptr
}
