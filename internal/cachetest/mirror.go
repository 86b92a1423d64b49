package cachetest

// Discard, Sync, Stats, the mirror checks, and the follow-up step that
// shows the cache is still usable.

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

// TryDiscard calls Discard of step id; a step it consumed delivers nothing.
func (h *Harness) TryDiscard(id omnicache.StepID) error {
	h.T.Helper()
	err := Guard(h.T, fmt.Sprintf("%sDiscard(%v)", h.prefix(), id), func() error { return h.C.Discard(id) })
	if err == nil {
		h.dmu.Lock()
		h.discarded[id] = true
		h.consumed[id] = true
		h.dmu.Unlock()
	}
	return err
}

// Discard discards step id and fails the test on an error.
func (h *Harness) Discard(id omnicache.StepID) {
	h.T.Helper()
	require.NoError(h.T, h.TryDiscard(id), "%sDiscard(%v)", h.prefix(), id)
}

// TrySync calls Sync.
func (h *Harness) TrySync() error {
	h.T.Helper()
	return Guard(h.T, h.prefix()+"Sync", func() error { return h.C.Sync() })
}

// Sync calls Sync and fails the test on an error.
func (h *Harness) Sync() {
	h.T.Helper()
	require.NoError(h.T, h.TrySync(), h.prefix()+"Sync")
}

// Stats returns the cache's Stats.
func (h *Harness) Stats() omnicache.Stats {
	h.T.Helper()
	return Guard(h.T, h.prefix()+"Stats", func() omnicache.Stats { return h.C.Stats() })
}

// Drain finishes ids in a step that schedules nothing (zero tokens) and
// discards it: the way to finish the last requests of a schedule.
func (h *Harness) Drain(ids ...int64) {
	h.T.Helper()
	h.Discard(h.Step(Step{Finished: ids}))
}

// Peek reads committed mirror rows of key k (call Sync first).
func (h *Harness) Peek(k int, slots []int32) []byte {
	h.T.Helper()
	dst := make([]byte, len(slots)*h.Cfg.Keys[k].RowBytes)
	err := Guard(h.T, h.prefix()+"Peek", func() error { return h.C.Peek(k, slots, dst) })
	require.NoError(h.T, err, "%sPeek key %q", h.prefix(), h.Cfg.Keys[k].Name)
	return dst
}

func (h *Harness) allSlots() []int32 {
	s := make([]int32, h.Cfg.NumBlocks*h.Cfg.BlockSize)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// Mirror syncs and returns the whole mirror of key k.
func (h *Harness) Mirror(k int) []byte {
	h.T.Helper()
	h.Sync()
	return h.Peek(k, h.allSlots())
}

// KeyIndex is the index of the configured key named name.
func (h *Harness) KeyIndex(name string) int {
	for k, key := range h.Cfg.Keys {
		if key.Name == name {
			return k
		}
	}
	h.T.Fatalf("harness: no key %q", name)
	return -1
}

// AllKeys lists every configured key's index.
func (h *Harness) AllKeys() []int {
	ks := make([]int, len(h.Cfg.Keys))
	for k := range ks {
		ks[k] = k
	}
	return ks
}

// listBad joins failure lines, at most 12 of them, for one message.
func listBad(bad []string) string {
	more := ""
	if len(bad) > 12 {
		more = fmt.Sprintf("\n  ... and %d more", len(bad)-12)
		bad = bad[:12]
	}
	return strings.Join(bad, "\n  ") + more
}

// CheckMirror syncs and compares the mirror of the given keys (none: every
// non-deferred key) with the model, slot by slot.
func (h *Harness) CheckMirror(keys ...int) {
	h.T.Helper()
	if len(keys) == 0 {
		for k, key := range h.Cfg.Keys {
			if !key.Deferred {
				keys = append(keys, k)
			}
		}
	}
	h.Sync()
	slots := h.allSlots()
	var bad []string
	for _, k := range keys {
		rb := h.Cfg.Keys[k].RowBytes
		got := h.Peek(k, slots)
		for s := range slots {
			if h.unknown[s] {
				continue
			}
			g := got[s*rb : (s+1)*rb]
			if !bytes.Equal(g, RowOf(h.model[k][s], rb)) {
				bad = append(bad, fmt.Sprintf("key %q slot %d (block %d): got %s, want %s",
					h.Cfg.Keys[k].Name, s, s/h.Cfg.BlockSize, Describe(g), h.model[k][s]))
			}
		}
	}
	if len(bad) > 0 {
		h.T.Fatalf("%smirror differs from the model (latest write per slot):\n  %s", h.prefix(), listBad(bad))
	}
}

// ExpectBlock syncs and checks block b of key k against rows written by
// request id at positions pos0.. with version ver (id < 0: zeros).
func (h *Harness) ExpectBlock(k int, b int32, id int64, pos0, ver int) {
	h.T.Helper()
	h.Sync()
	bs := h.Cfg.BlockSize
	rb := h.Cfg.Keys[k].RowBytes
	slots := make([]int32, bs)
	for j := range slots {
		slots[j] = b*int32(bs) + int32(j)
	}
	got := h.Peek(k, slots)
	for j := range slots {
		var w Tag
		if id >= 0 {
			w = MkTag(k, id, pos0+j, ver)
		}
		g := got[j*rb : (j+1)*rb]
		if !bytes.Equal(g, RowOf(w, rb)) {
			h.T.Fatalf("%smirror key %q block %d slot %d: got %s, want %s", h.prefix(), h.Cfg.Keys[k].Name, b, slots[j], Describe(g), w)
		}
	}
}

// Usable runs a correct step with a fresh request on the last block and
// checks its rows and the mirror: after a misuse the cache must stay
// usable.
func (h *Harness) Usable() {
	h.T.Helper()
	h.usableID++
	id := h.usableID
	h.Assign(id, int32(h.Cfg.NumBlocks-1))
	err := h.TryBegin(Step{Sched: []S{{id, 0, 3}}, Arrive: []A{{ID: id}}})
	require.NoError(h.T, err, "Begin of a correct step after the misuse: the cache must stay usable")
	sid, err := h.TrySave(h.Outs())
	require.NoError(h.T, err, "Save of a correct step after the misuse: the cache must stay usable")
	h.Mat(sid)
	h.CheckMirror()
}

// CheckConsumed checks that a step whose read failed is consumed: a later
// Discard fails with ErrUnknownStep (or succeeds, if the failed read left
// it unconsumed).
func (h *Harness) CheckConsumed(id omnicache.StepID) {
	h.T.Helper()
	if err := h.TryDiscard(id); err != nil {
		require.ErrorIs(h.T, err, omnicache.ErrUnknownStep, "%sDiscard(%v) after a failed read", h.prefix(), id)
	}
}
