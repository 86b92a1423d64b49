package writer

import (
	"time"

	"github.com/omnicache/omnicache/gpu"
)

// directCopier holds the committer's scratch for a direct write's copies:
// one device→host copy per run of consecutive slots inside one mirror
// chunk.
type directCopier struct {
	dst [][]byte
	src []gpu.Buffer
}

// commitDirect lands a direct write (Write.Direct): the device rows of each
// immediate key are copied by the device straight into the mirror, a run
// of consecutive kept slots inside one mirror chunk per copy, all issued as
// one batch, and waited for; host rows (a key the engine handed over in
// host memory) are scattered as commitImm does. Rows a newer queued write
// replaces, and those of rejected draft tokens, are copied nowhere. The
// epoch is odd from the first copy issued until the tenancy is published,
// so a reader whose copy from the mirror overlapped the device's writes
// re-checks the owners, as with a scatter. The device rows stay live (the
// write's reads take them there) until the write is released.
func (c *Committer) commitDirect(w *Write) error {
	// The mirror memory the rows land in is made (and registered) first: a
	// chunk the OS refuses fails the write (sticky) before any copy.
	for ki, k := range c.cfg.Imm {
		if !(w.NAbsent > 0 && w.Absent[ki]) {
			if err := c.cfg.Mirrors.Make(k).Prepare(w.Slots[:w.N]); err != nil {
				return err
			}
		}
	}
	if len(w.Pub) == 0 {
		c.scanQueued()
	} // else blocks ride on w: no newer write may make it skip rows (see scanQueued)
	c.curID = w.ID
	sl := w.Slots[:w.N]
	mk, kept, skipped := c.newerMask(sl)
	if len(w.Reject) > 0 {
		mk, kept, skipped = c.rejectMask(mk, sl, w.Reject)
	}
	c.count(w, 0, kept, skipped)
	ten := c.cfg.Tenancy
	dc := &c.direct
	var nb int64
	c.prog.BeginScatter()
	for ki, k := range c.cfg.Imm {
		if w.NAbsent > 0 && w.Absent[ki] {
			ten.SetAbsent(ki, mk)
			continue
		}
		m := c.cfg.Mirrors.Make(k)
		rb := c.cfg.RowBytes[k]
		if rows := w.Host[ki]; rows != nil {
			m.WriteSplitPoll(c.workers, mk, rows[:w.N*rb], nil)
			continue
		}
		buf := w.Dev[ki]
		for i := 0; i < len(mk); {
			s := mk[i]
			if s < 0 {
				i++
				continue
			}
			end := m.ChunkEnd(s)
			j := i + 1
			for j < len(mk) && mk[j] == s+int32(j-i) && mk[j] < end {
				j++
			}
			dc.dst = append(dc.dst, m.Span(s, j-i))
			dc.src = append(dc.src, buf.Slice(i*rb, (j-i)*rb))
			nb += int64((j - i) * rb)
			i = j
		}
	}
	err := c.copyDirect(dc, nb)
	clear(dc.dst)
	clear(dc.src)
	dc.dst, dc.src = dc.dst[:0], dc.src[:0]
	if err == nil {
		for ki := range c.cfg.Imm {
			if !(w.NAbsent > 0 && w.Absent[ki]) {
				ten.ClearAbsent(ki, mk)
			}
		}
		ten.Publish(sl, mk, w.ID)
	}
	c.prog.EndScatter()
	return err
}

// copyDirect issues dc's copies (nb bytes) and waits for them.
func (c *Committer) copyDirect(dc *directCopier, nb int64) error {
	if len(dc.dst) == 0 {
		return nil
	}
	dev := c.cfg.Dev
	h := c.cfg.Hists
	var t0 time.Time
	if h != nil {
		t0 = time.Now()
		h.CopyBytes.Observe(nb)
	}
	var err error
	if r, ok := dev.(gpu.HostRegistrar); ok && c.cfg.Mirrors.Registered() {
		err = r.CopyDtoHRegistered(dc.dst, dc.src)
	} else {
		err = gpu.CopyDtoHAll(dev, dc.dst, dc.src)
	}
	if err != nil {
		return err
	}
	ev, err := dev.Record()
	if err == nil {
		err = dev.Wait(ev)
	}
	if err == nil && h != nil {
		h.CopyTime.Observe(int64(time.Since(t0)))
	}
	return err
}
