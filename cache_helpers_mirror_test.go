package omnicache_test

// Harness helpers for Discard, Sync, stats and mirror checks, and the gated test device.

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

func (h *harness) tryDiscard(id omnicache.StepID) error {
	h.t.Helper()
	err := guard(h.t, fmt.Sprintf("%sDiscard(%v)", h.prefix(), id), func() error { return h.c.Discard(id) })
	if err == nil {
		h.dmu.Lock()
		h.discarded[id] = true
		h.consumed[id] = true
		h.dmu.Unlock()
	}
	return err
}

func (h *harness) discard(id omnicache.StepID) {
	h.t.Helper()
	require.NoError(h.t, h.tryDiscard(id), "%sDiscard(%v)", h.prefix(), id)
}

func (h *harness) trySync() error {
	h.t.Helper()
	return guard(h.t, h.prefix()+"Sync", func() error { return h.c.Sync() })
}

func (h *harness) sync() {
	h.t.Helper()
	require.NoError(h.t, h.trySync(), h.prefix()+"Sync")
}

func (h *harness) stats() omnicache.Stats {
	h.t.Helper()
	return guard(h.t, h.prefix()+"Stats", func() omnicache.Stats { return h.c.Stats() })
}

// drain finishes ids in a step that schedules nothing (zero tokens) and
// discards it: the way to finish the last requests of a schedule.
func (h *harness) drain(ids ...int64) {
	h.t.Helper()
	h.discard(h.step(step{Finished: ids}))
}

// peek reads committed mirror rows of key k (call sync first).
func (h *harness) peek(k int, slots []int32) []byte {
	h.t.Helper()
	dst := make([]byte, len(slots)*h.cfg.Keys[k].RowBytes)
	err := guard(h.t, h.prefix()+"Peek", func() error { return h.c.Peek(k, slots, dst) })
	require.NoError(h.t, err, "%sPeek key %q", h.prefix(), h.cfg.Keys[k].Name)
	return dst
}

func (h *harness) allSlots() []int32 {
	s := make([]int32, h.cfg.NumBlocks*h.cfg.BlockSize)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// mirror syncs and returns the whole mirror of key k.
func (h *harness) mirror(k int) []byte {
	h.t.Helper()
	h.sync()
	return h.peek(k, h.allSlots())
}

func (h *harness) keyIndex(name string) int {
	for k, key := range h.cfg.Keys {
		if key.Name == name {
			return k
		}
	}
	h.t.Fatalf("harness: no key %q", name)
	return -1
}

// checkMirror syncs and compares the mirror of the given keys (none: every
// non-deferred key) with the model, slot by slot.
func (h *harness) checkMirror(keys ...int) {
	h.t.Helper()
	if len(keys) == 0 {
		for k, key := range h.cfg.Keys {
			if !key.Deferred {
				keys = append(keys, k)
			}
		}
	}
	h.sync()
	slots := h.allSlots()
	var bad []string
	for _, k := range keys {
		rb := h.cfg.Keys[k].RowBytes
		got := h.peek(k, slots)
		for s := range slots {
			if h.unknown[s] {
				continue
			}
			g := got[s*rb : (s+1)*rb]
			if !bytes.Equal(g, rowOf(h.model[k][s], rb)) {
				bad = append(bad, fmt.Sprintf("key %q slot %d (block %d): got %s, want %s",
					h.cfg.Keys[k].Name, s, s/h.cfg.BlockSize, describe(g), h.model[k][s]))
			}
		}
	}
	if len(bad) > 0 {
		more := ""
		if len(bad) > 12 {
			more = fmt.Sprintf("\n  ... and %d more", len(bad)-12)
			bad = bad[:12]
		}
		h.t.Fatalf("%smirror differs from the model (latest write per slot):\n  %s%s", h.prefix(), strings.Join(bad, "\n  "), more)
	}
}

// expectBlock syncs and checks block b of key k against rows written by
// request id at positions pos0.. with version ver (id < 0: zeros).
func (h *harness) expectBlock(k int, b int32, id int64, pos0, ver int) {
	h.t.Helper()
	h.sync()
	bs := h.cfg.BlockSize
	rb := h.cfg.Keys[k].RowBytes
	slots := make([]int32, bs)
	for j := range slots {
		slots[j] = b*int32(bs) + int32(j)
	}
	got := h.peek(k, slots)
	for j := range slots {
		var w tag
		if id >= 0 {
			w = mkTag(k, id, pos0+j, ver)
		}
		g := got[j*rb : (j+1)*rb]
		if !bytes.Equal(g, rowOf(w, rb)) {
			h.t.Fatalf("%smirror key %q block %d slot %d: got %s, want %s", h.prefix(), h.cfg.Keys[k].Name, b, slots[j], describe(g), w)
		}
	}
}

// ---------------------------------------------------------------- devices

// gatedDevice is a device whose events recorded while the gate is armed
// block in Wait until the test opens the gate: it holds a write "in
// transit". Events recorded before arming (already complete) never block.
type gatedDevice struct {
	gpu.Device
	mu      sync.Mutex
	armed   bool
	next    gpu.Event
	gated   map[gpu.Event]bool
	entered chan struct{}
	release chan struct{}
}

func newGatedDevice() *gatedDevice {
	return &gatedDevice{Device: gpu.NewHost(), gated: map[gpu.Event]bool{}}
}

// arm gates every event recorded from now on until open is called.
func (d *gatedDevice) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = true
	d.entered = make(chan struct{}, 1)
	d.release = make(chan struct{})
}

// open releases the blocked Waits and disarms the gate.
func (d *gatedDevice) open() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed {
		d.armed = false
		close(d.release)
	}
}

// waitEntered reports whether a Wait blocked on the armed gate within d.
func (d *gatedDevice) waitEntered(timeout time.Duration) bool {
	d.mu.Lock()
	ch := d.entered
	d.mu.Unlock()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-ch:
		return true
	case <-tm.C:
		return false
	}
}

func (d *gatedDevice) Record() (gpu.Event, error) {
	if _, err := d.Device.Record(); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	if d.armed {
		d.gated[d.next] = true
	}
	return d.next, nil
}

func (d *gatedDevice) Wait(e gpu.Event) error {
	d.mu.Lock()
	block := d.armed && d.gated[e]
	entered, release := d.entered, d.release
	d.mu.Unlock()
	if block {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}
	return d.Device.Wait(0)
}
