package omnicache_test

// The decode buffer (scenario 25) and owned outputs (scenario 26).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// capture is what one run leaves behind: the synced mirror of every key
// and every materialized row.
type capture struct {
	mirrors    [][]byte
	rows       map[rowKey][]byte
	reassigned map[int]bool
}

func (h *harness) capture() capture {
	h.t.Helper()
	var c capture
	for k := range h.cfg.Keys {
		c.mirrors = append(c.mirrors, h.mirror(k))
	}
	c.rows = h.rows
	c.reassigned = h.reassigned
	return c
}

// runBufferOnOff runs script on a cache with the decode buffer on and on
// one with it off (DisableDecodeBuffer), then compares the two mirrors byte
// for byte, slot by slot, and every materialized row.
func runBufferOnOff(t *testing.T, cfg omnicache.Config, script func(h *harness, buffered bool)) {
	t.Helper()
	var caps [2]capture
	for i, off := range []bool{false, true} {
		name := "buffer on"
		if off {
			name = "buffer off"
		}
		ok := t.Run(name, func(t *testing.T) {
			c := cfg
			c.DisableDecodeBuffer = off
			h := newHarness(t, c)
			h.label = name
			h.keepRows = true
			script(h, !off)
			caps[i] = h.capture()
		})
		if !ok {
			return
		}
	}
	compareCaptures(t, cfg, caps[0], caps[1], "buffer on", "buffer off")
}

func compareCaptures(t testing.TB, cfg omnicache.Config, x, y capture, xn, yn string) {
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
				bad = append(bad, fmt.Sprintf("key %q slot %d: %s has %s, %s has %s", key.Name, s, xn, describe(gx), yn, describe(gy)))
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
		if len(bad) > 12 {
			bad = append(bad[:12], fmt.Sprintf("... and %d more", len(bad)-12))
		}
		t.Fatalf("%s and %s disagree:\n  %s", xn, yn, strings.Join(bad, "\n  "))
	}
}

// decoder is a small per-request position tracker for the buffer scripts.
type decoder struct {
	h    *harness
	next map[int64]int
}

func (d *decoder) s(id int64, n int) S {
	s := S{id, d.next[id], n}
	d.next[id] += n
	return s
}

// decode is one pure decode step of ids (one token each, in that order).
func (d *decoder) decode(ids ...int64) step {
	var st step
	for _, id := range ids {
		st.Sched = append(st.Sched, d.s(id, 1))
	}
	return st
}

// Scenario 25: fewer than block_size pure-decode steps write nothing until
// a trigger; each trigger (arrival, finish, abort, preemption, resume, a
// non-pure step, block_size steps, the staging capacity, the byte budget)
// writes the buffer before the next Begin's work; afterwards the mirror
// equals the mirror of the same schedule with the buffer off.
func TestScenario25_DecodeBufferTriggers(t *testing.T) {
	const a, b, c = 1, 2, 3
	rowBytes := int64(keyHidden.RowBytes + keyAux.RowBytes)
	for _, tc := range []struct {
		name     string
		cfg      func(*omnicache.Config)
		device   bool
		preemptB bool // b is preempted (in a non-pure step) before the pure run
		pure     int  // pure decode steps before the trigger
		quiet    int  // after this many pure steps nothing may be written
		flushes  int  // BufferFlushes at the trigger's Begin; 0: at least one before the trigger
		trigger  func(d *decoder) step
		after    []int64 // requests decoding after the trigger
		idle     []int64 // live requests not decoding after the trigger
	}{
		{name: "arrival", pure: 3, quiet: 3, flushes: 1, after: []int64{a, b, c},
			trigger: func(d *decoder) step {
				d.h.assign(c, 9, 10)
				return step{Sched: []S{d.s(a, 1), d.s(b, 1), d.s(c, 2)}, Arrive: []A{{ID: c}}}
			}},
		{name: "arrival hitting parked rows", pure: 3, quiet: 3, flushes: 1, after: []int64{a, b, c},
			trigger: func(d *decoder) step {
				d.h.assign(c, 1, 9) // a's block 1: positions 2 and 3 are parked
				d.next[c] = 4
				return step{Sched: []S{d.s(a, 1), d.s(b, 1), d.s(c, 2)}, Arrive: []A{{ID: c, Hit: 4}}}
			}},
		{name: "finish", pure: 3, quiet: 3, flushes: 1, after: []int64{a},
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(a, 1)}, Finished: []int64{b}} }},
		{name: "abort", pure: 3, quiet: 3, flushes: 1, after: []int64{b},
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(b, 1)}, Finished: []int64{a}} }},
		{name: "finish and block reuse", pure: 3, quiet: 3, flushes: 1, after: []int64{a, c},
			trigger: func(d *decoder) step {
				// b's block 6 holds its parked position 4; c takes it over.
				d.h.assign(c, 6, 10)
				return step{Sched: []S{d.s(a, 1), d.s(c, 4)}, Arrive: []A{{ID: c}}, Finished: []int64{b}}
			}},
		{name: "preemption", pure: 3, quiet: 3, flushes: 1, after: []int64{a}, idle: []int64{b},
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(a, 1)}, Preempted: []int64{b}} }},
		{name: "resume", preemptB: true, pure: 3, quiet: 3, flushes: 1, after: []int64{a, b},
			trigger: func(d *decoder) step {
				d.h.bump(b)
				d.next[b] = 0
				return step{Sched: []S{d.s(a, 1), d.s(b, 2)}, Resumed: []int64{b}}
			}},
		{name: "non-pure step", pure: 3, quiet: 3, flushes: 1, after: []int64{a, b},
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(a, 2), d.s(b, 1)}} }},
		{name: "order changed", pure: 3, quiet: 3, flushes: 1, after: []int64{b, a},
			trigger: func(d *decoder) step { return d.decode(b, a) }},
		{name: "other ids", pure: 3, quiet: 3, flushes: 1, after: []int64{a}, idle: []int64{b},
			trigger: func(d *decoder) step { return d.decode(a) }},
		{name: "block_size steps", pure: 8, quiet: 3, flushes: 2, after: []int64{a, b},
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(a, 2), d.s(b, 1)}} }},
		{name: "staging capacity", pure: 6, quiet: 2, flushes: 2, after: []int64{a, b},
			cfg:     func(c *omnicache.Config) { c.StagingCapacityTokens = 6 }, // 3 steps of 2 tokens
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(a, 2), d.s(b, 1)}} }},
		{name: "byte budget", pure: 3, quiet: 1, flushes: 0, device: true, after: []int64{a, b},
			cfg: func(c *omnicache.Config) { // room for 2 steps of 2 tokens
				c.DeviceBudgetBytes = 4 * rowBytes
				c.DeferredChunkBytes = c.DeviceBudgetBytes
			},
			trigger: func(d *decoder) step { return step{Sched: []S{d.s(a, 2), d.s(b, 1)}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.StagingDepth = 16
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			runBufferOnOff(t, cfg, func(h *harness, buffered bool) {
				t := h.t
				h.device = tc.device
				d := &decoder{h: h, next: map[int64]int{}}
				h.assign(a, 1, 2, 3, 4)
				h.assign(b, 5, 6, 7, 8)
				h.mat(h.step(step{Sched: []S{d.s(a, 2), d.s(b, 2)}, Arrive: []A{{ID: a}, {ID: b}}}))
				decoding := []int64{a, b}
				if tc.preemptB {
					h.mat(h.step(step{Sched: []S{d.s(a, 1)}, Preempted: []int64{b}}))
					decoding = []int64{a}
				}
				h.sync() // nothing pending: the budget is free again
				base := h.stats()
				var late []omnicache.StepID // consumed after the trigger
				for i := 0; i < tc.pure; i++ {
					late = append(late, h.step(d.decode(decoding...)))
					st := h.stats()
					if i+1 == tc.quiet {
						if buffered {
							require.EqualValues(t, tc.quiet, st.BufferedSteps-base.BufferedSteps, "Stats.BufferedSteps after %d pure decode steps", tc.quiet)
							require.EqualValues(t, 0, st.WriteTasks-base.WriteTasks, "Stats.WriteTasks: %d pure decode steps must write nothing yet", tc.quiet)
							require.EqualValues(t, 0, st.BufferFlushes-base.BufferFlushes, "Stats.BufferFlushes after %d pure decode steps", tc.quiet)
						} else {
							require.EqualValues(t, 0, st.BufferedSteps-base.BufferedSteps, "Stats.BufferedSteps with the buffer off")
							require.EqualValues(t, tc.quiet, st.WriteTasks-base.WriteTasks, "Stats.WriteTasks with the buffer off: one task per step")
						}
					}
					require.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak")
				}
				if buffered && tc.flushes == 0 {
					st := h.stats()
					require.Positive(t, st.BufferFlushes-base.BufferFlushes, "the byte budget must force the parked rows out before the trigger")
				}

				h.begin(tc.trigger(d))
				if buffered && tc.flushes > 0 {
					st := h.stats()
					require.EqualValues(t, tc.flushes, st.BufferFlushes-base.BufferFlushes,
						"Stats.BufferFlushes once the trigger's Begin returned (%d parked steps, at most block_size per flush)", tc.pure)
					require.EqualValues(t, tc.pure, st.BufferedSteps-base.BufferedSteps, "Stats.BufferedSteps")
					require.GreaterOrEqual(t, st.WriteTasks-base.WriteTasks, int64(tc.flushes), "Stats.WriteTasks: one per flush")
				}
				trig := h.save()

				h.mat(trig)
				for _, id := range late {
					h.mat(id)
				}
				for i := 0; i < 2; i++ {
					h.mat(h.step(d.decode(tc.after...)))
				}
				h.checkMirror()
				h.drain(append(append([]int64{}, tc.after...), tc.idle...)...)
				st := h.stats()
				assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak")
				h.checkMirror()
			})
		})
	}
}

// Scenario 26: owned outputs are used without a defensive copy (ClonedBytes
// does not grow); non-owned outputs are copied (ClonedBytes grows by the
// bytes copied) and isolated from later overwrites of the engine's buffers
// (the harness overwrites every non-owned buffer right after Save).
func TestScenario26_OwnedOutputs(t *testing.T) {
	const a, b = 1, 2
	rowBytes := int64(keyHidden.RowBytes + keyAux.RowBytes)
	for _, device := range []bool{false, true} {
		for _, owned := range []bool{true, false} {
			name := fmt.Sprintf("device=%v owned=%v", device, owned)
			t.Run(name, func(t *testing.T) {
				cfg := testConfig()
				cfg.StagingDepth = 8 // five steps are consumed at the end
				h := newHarness(t, cfg)
				h.device, h.owned = device, owned
				d := &decoder{h: h, next: map[int64]int{}}
				h.assign(a, 1, 2, 5)
				h.assign(b, 3, 4)
				base := h.stats().ClonedBytes
				s1 := h.step(step{Sched: []S{d.s(a, 4), d.s(b, 2)}, Arrive: []A{{ID: a}, {ID: b}}})
				cloned := h.stats().ClonedBytes - base
				if owned {
					assert.Zero(t, cloned, "Stats.ClonedBytes after an owned step")
				} else {
					assert.Equal(t, 6*rowBytes, cloned, "Stats.ClonedBytes after a non-owned 6-token step")
				}
				var ids []omnicache.StepID
				for i := 0; i < 3; i++ { // pure decode: parked rows
					ids = append(ids, h.step(d.decode(a, b)))
				}
				ids = append(ids, h.step(step{Sched: []S{d.s(a, 2), d.s(b, 1)}}))
				cloned = h.stats().ClonedBytes - base
				if owned {
					assert.Zero(t, cloned, "Stats.ClonedBytes after owned steps")
				} else {
					assert.GreaterOrEqual(t, cloned, (6+6+3)*rowBytes, "Stats.ClonedBytes after non-owned steps")
				}
				h.mat(s1)
				for _, id := range ids {
					h.mat(id)
				}
				h.checkMirror()
			})
		}
	}
}

// batchDevice is the host device with a batch copy (gpu.BatchCopier), as
// CUDA's cuMemcpyBatchAsync: it counts batches and single copies, and a
// batch waits for hold to be closed when it is set.
type batchDevice struct {
	*gpu.Host
	batches, batched, singles atomic.Int64
	hold                      chan struct{}
}

func (d *batchDevice) CopyDtoH(dst []byte, src gpu.Buffer, off int) error {
	d.singles.Add(1)
	return d.Host.CopyDtoH(dst, src, off)
}

func (d *batchDevice) CopyDtoHBatch(dst [][]byte, src []gpu.Buffer) error {
	if d.hold != nil {
		<-d.hold
	}
	for i := range dst {
		if len(src[i].Host) < len(dst[i]) {
			return fmt.Errorf("%w: batch copy %d", gpu.ErrRange, i)
		}
	}
	for i := range dst {
		copy(dst[i], src[i].Host)
	}
	d.batches.Add(1)
	d.batched.Add(int64(len(dst)))
	return nil
}

// A step's device rows and a decode-buffer flush of device-parked rows
// cost the engine goroutine no device copy: the committer issues them, as
// one batch per write on a device that has one (one driver call on CUDA
// instead of one per parked step and key). The Saves return while those
// batches are held back; every row lands exactly: a mixed step, the flush
// at block_size steps and the one an arrival forces, owned tensors or not.
func TestDecodeFlushIsOneBatch(t *testing.T) {
	const a, b, c = 1, 2, 3
	for _, owned := range []bool{false, true} {
		t.Run(fmt.Sprintf("owned=%v", owned), func(t *testing.T) {
			dev := &batchDevice{Host: gpu.NewHost()}
			cfg := testConfig()
			cfg.Device = dev
			h := newHarness(t, cfg)
			h.device, h.owned = true, owned
			d := &decoder{h: h, next: map[int64]int{}}
			h.assign(a, 1, 2, 3)
			h.assign(b, 4, 5, 6)
			h.mat(h.step(step{Sched: []S{d.s(a, 2), d.s(b, 2)}, Arrive: []A{{ID: a}, {ID: b}}}))
			h.sync()
			require.EqualValues(t, 1, dev.batches.Load(), "the first step's rows: one batch")
			require.EqualValues(t, 2, dev.batched.Load(), "of its two keys")
			singles := dev.singles.Load() // its Materialize may have read its rows from the device
			dev.hold = make(chan struct{})
			for range testBlockSize { // block_size pure steps: the last one flushes
				id := guard(t, "a pure decode step whose flush's copies are held back", func() omnicache.StepID { return h.step(d.decode(a, b)) })
				h.discard(id) // (a read of parked rows would copy them)
			}
			require.EqualValues(t, 1, h.c.Stats().BufferFlushes, "BufferFlushes after block_size parked steps")
			close(dev.hold)
			h.sync()
			require.EqualValues(t, 2, dev.batches.Load(), "batches after block_size parked steps")
			require.EqualValues(t, 2+testBlockSize*2, dev.batched.Load(), "copies in the flush's batch: steps × keys")
			for range 2 {
				h.discard(h.step(d.decode(a, b)))
			}
			h.assign(c, 7)
			hold := make(chan struct{})
			dev.hold = hold
			id := guard(t, "a mixed step whose copies are held back", func() omnicache.StepID {
				return h.step(step{Sched: []S{d.s(a, 1), d.s(b, 1), d.s(c, 3)}, Arrive: []A{{ID: c}}}) // flushes 2 parked steps
			})
			close(hold)
			h.discard(id)
			h.sync()
			require.EqualValues(t, 4, dev.batches.Load(), "batches after the arrival: its flush, then its own rows")
			require.EqualValues(t, 2+testBlockSize*2+2*2+2, dev.batched.Load(), "copies in every batch")
			require.Equal(t, singles, dev.singles.Load(), "no single copy since: nothing read device rows")
			h.checkMirror()
		})
	}
}

// waitDevice is batchDevice whose first Wait after armed is closed blocks
// until release is closed, and which notes, at each batch, how many rows
// the mirror had taken so far.
type waitDevice struct {
	batchDevice
	c       *omnicache.Cache
	armed   chan struct{} // closed: the next Wait blocks (once)
	waiting chan struct{} // closed by that Wait
	release chan struct{}
	once    sync.Once
	rowsAt  []int64 // Stats().RowsWritten at each batch
	mu      sync.Mutex
}

func (d *waitDevice) CopyDtoHBatch(dst [][]byte, src []gpu.Buffer) error {
	d.mu.Lock()
	d.rowsAt = append(d.rowsAt, d.c.Stats().RowsWritten)
	d.mu.Unlock()
	return d.batchDevice.CopyDtoHBatch(dst, src)
}

func (d *waitDevice) Wait(ev gpu.Event) error {
	select {
	case <-d.armed:
		d.once.Do(func() {
			close(d.waiting)
			<-d.release
		})
	default:
	}
	return d.batchDevice.Wait(ev)
}

// A step handed over while the committer still waits for the copies of the
// step before it has its own device→host copies issued before that step is
// scattered into the mirror (and, for one handed over during the scatter,
// between the scatter's parts): back-to-back large steps overlap one's copy
// with the other's scatter instead of running them one after the other.
func TestNextWriteCopiedBeforeScatter(t *testing.T) {
	const a, b = 1, 2
	dev := &waitDevice{batchDevice: batchDevice{Host: gpu.NewHost()},
		armed: make(chan struct{}), waiting: make(chan struct{}), release: make(chan struct{})}
	cfg := testConfig()
	cfg.Device = dev
	cfg.DisableDecodeBuffer = true
	h := newHarness(t, cfg)
	dev.c = h.c
	h.device = true
	d := &decoder{h: h, next: map[int64]int{}}
	h.assign(a, 1, 2, 3)
	h.assign(b, 4, 5, 6)
	h.mat(h.step(step{Sched: []S{d.s(a, 2), d.s(b, 2)}, Arrive: []A{{ID: a}, {ID: b}}}))
	h.sync()
	before := h.c.Stats().RowsWritten
	require.Positive(t, before)

	close(dev.armed)
	id1 := h.step(d.decode(a, b))
	select {
	case <-dev.waiting:
	case <-time.After(deadlockTimeout):
		t.Fatal("the committer never waited for the first step's copies")
	}
	id2 := h.step(d.decode(a, b)) // handed over while those copies run
	close(dev.release)
	h.discard(id1)
	h.discard(id2)
	h.sync()
	dev.mu.Lock()
	rowsAt := slices.Clone(dev.rowsAt)
	dev.mu.Unlock()
	require.Len(t, rowsAt, 3, "one batch per step")
	require.Equal(t, before, rowsAt[2], "the second step's copies were issued before the first step's rows were scattered")
	h.checkMirror()
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
