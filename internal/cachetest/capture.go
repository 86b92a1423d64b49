package cachetest

// Runs of one schedule on two caches compared, and a decode script's
// position tracker.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/omnicache/omnicache"
)

// Capture is what one run leaves behind: the synced mirror of every key
// and, with Harness.KeepRows, every materialized row.
type Capture struct {
	mirrors    [][]byte
	rows       map[rowKey][]byte
	reassigned map[int]bool
}

// Capture syncs and captures the mirrors and the rows kept so far.
func (h *Harness) Capture() Capture {
	h.T.Helper()
	var c Capture
	for k := range h.Cfg.Keys {
		c.mirrors = append(c.mirrors, h.Mirror(k))
	}
	c.rows = h.rows
	c.reassigned = h.reassigned
	return c
}

// ReassignedReads is the number of steps whose delayed read failed with
// ErrReassigned (a Runner's late reads).
func (h *Harness) ReassignedReads() int { return len(h.reassigned) }

// RunBufferOnOff runs script on a cache of cfg with the decode buffer on
// and on one with it off (DisableDecodeBuffer), then compares the two
// mirrors byte for byte, slot by slot, and every materialized row.
func RunBufferOnOff(t *testing.T, cfg omnicache.Config, script func(h *Harness, buffered bool)) {
	t.Helper()
	var caps [2]Capture
	for i, off := range []bool{false, true} {
		name := "buffer on"
		if off {
			name = "buffer off"
		}
		ok := t.Run(name, func(t *testing.T) {
			c := cfg
			c.DisableDecodeBuffer = off
			h := New(t, c)
			h.Label = name
			h.KeepRows = true
			script(h, !off)
			caps[i] = h.Capture()
		})
		if !ok {
			return
		}
	}
	CompareCaptures(t, cfg, caps[0], caps[1], "buffer on", "buffer off")
}

// CompareCaptures fails the test unless runs x and y (named xn and yn) of
// one schedule on caches of cfg's keys left the same mirrors and
// materialized the same rows.
func CompareCaptures(t testing.TB, cfg omnicache.Config, x, y Capture, xn, yn string) {
	t.Helper()
	var bad []string
	for k, key := range cfg.Keys {
		rb := key.RowBytes
		mx, my := x.mirrors[k], y.mirrors[k]
		if len(mx) != len(my) {
			bad = append(bad, fmt.Sprintf("key %q: mirror sizes %d and %d", key.Name, len(mx), len(my)))
			continue
		}
		for s := 0; s*rb < len(mx); s++ {
			gx, gy := mx[s*rb:(s+1)*rb], my[s*rb:(s+1)*rb]
			if !bytes.Equal(gx, gy) {
				bad = append(bad, fmt.Sprintf("key %q slot %d: %s has %s, %s has %s", key.Name, s, xn, Describe(gx), yn, Describe(gy)))
			}
		}
	}
	// A delayed read may fail with ErrReassigned in one run and not in the
	// other (timing); such steps are compared only where both have rows.
	skip := func(r rowKey) bool { return x.reassigned[r.ord] || y.reassigned[r.ord] }
	for name, rx := range x.rows {
		ry, ok := y.rows[name]
		switch {
		case !ok && skip(name):
		case !ok:
			bad = append(bad, fmt.Sprintf("%s materialized only with %s", name, xn))
		case !sameRows(rx, ry, cfg, name.key):
			bad = append(bad, fmt.Sprintf("%s: materialized rows differ", name))
		}
	}
	for name := range y.rows {
		if _, ok := x.rows[name]; !ok && !skip(name) {
			bad = append(bad, fmt.Sprintf("%s materialized only with %s", name, yn))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%s and %s disagree:\n  %s", xn, yn, listBad(bad))
	}
}

// sameRows compares two captured results (a 4-byte start position, then
// the rows) over the positions both hold.
func sameRows(x, y []byte, cfg omnicache.Config, key string) bool {
	rb := 0
	for _, k := range cfg.Keys {
		if k.Name == key {
			rb = k.RowBytes
		}
	}
	fx, fy := int(binary.LittleEndian.Uint32(x)), int(binary.LittleEndian.Uint32(y))
	x, y = x[4:], y[4:]
	lo := max(fx, fy)
	hi := min(fx+len(x)/rb, fy+len(y)/rb)
	if lo >= hi {
		return true
	}
	return bytes.Equal(x[(lo-fx)*rb:(hi-fx)*rb], y[(lo-fy)*rb:(hi-fy)*rb])
}

// Decoder tracks each request's next position for a script of steps.
type Decoder struct {
	H *Harness // the harness whose requests it schedules
	// Next is, per request, the position its next scheduled token is at.
	Next map[int64]int
}

// NewDecoder returns a Decoder of h's requests, all at position 0.
func NewDecoder(h *Harness) *Decoder { return &Decoder{H: h, Next: map[int64]int{}} }

// S schedules n tokens of request id from its next position.
func (d *Decoder) S(id int64, n int) S {
	s := S{id, int64(d.Next[id]), int64(n)}
	d.Next[id] += n
	return s
}

// Decode is one pure decode step of ids (one token each, in that order).
func (d *Decoder) Decode(ids ...int64) Step {
	var st Step
	for _, id := range ids {
		st.Sched = append(st.Sched, d.S(id, 1))
	}
	return st
}
