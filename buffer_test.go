package omnicache_test

// The decode buffer: pure decode steps are parked until a trigger writes them, as one batch of device
// copies, and the next write's copies are issued before a scatter; the
// mirror and every row equal those of the same schedule with the buffer
// off.

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// Fewer than block_size pure-decode steps write nothing until
// a trigger; each trigger (arrival, finish, abort, preemption, resume, a
// non-pure step, block_size steps, the staging capacity, the byte budget)
// writes the buffer before the next Begin's work; afterwards the mirror
// equals the mirror of the same schedule with the buffer off.
func TestDecodeBufferTriggers(t *testing.T) {
	const a, b, c = 1, 2, 3
	rowBytes := int64(cachetest.KeyHidden.RowBytes + cachetest.KeyAux.RowBytes)
	for _, tc := range []struct {
		name     string
		cfg      func(*omnicache.Config)
		device   bool
		preemptB bool // b is preempted (in a non-pure step) before the pure run
		pure     int  // pure decode steps before the trigger
		quiet    int  // after this many pure steps nothing may be written
		flushes  int  // BufferFlushes at the trigger's Begin; 0: at least one before the trigger
		trigger  func(d *cachetest.Decoder) cachetest.Step
		after    []int64 // requests decoding after the trigger
		idle     []int64 // live requests not decoding after the trigger
	}{
		{name: "arrival", pure: 3, quiet: 3, flushes: 1, after: []int64{a, b, c},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				d.H.Assign(c, 9, 10)
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 1), d.S(b, 1), d.S(c, 2)}, Arrive: []cachetest.A{{ID: c}}}
			}},
		{name: "arrival hitting parked rows", pure: 3, quiet: 3, flushes: 1, after: []int64{a, b, c},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				d.H.Assign(c, 1, 9) // a's block 1: positions 2 and 3 are parked
				d.Next[c] = 4
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 1), d.S(b, 1), d.S(c, 2)}, Arrive: []cachetest.A{{ID: c, Hit: 4}}}
			}},
		{name: "finish", pure: 3, quiet: 3, flushes: 1, after: []int64{a},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 1)}, Finished: []int64{b}}
			}},
		{name: "abort", pure: 3, quiet: 3, flushes: 1, after: []int64{b},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(b, 1)}, Finished: []int64{a}}
			}},
		{name: "finish and block reuse", pure: 3, quiet: 3, flushes: 1, after: []int64{a, c},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				// b's block 6 holds its parked position 4; c takes it over.
				d.H.Assign(c, 6, 10)
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 1), d.S(c, 4)}, Arrive: []cachetest.A{{ID: c}}, Finished: []int64{b}}
			}},
		{name: "preemption", pure: 3, quiet: 3, flushes: 1, after: []int64{a}, idle: []int64{b},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 1)}, Preempted: []int64{b}}
			}},
		{name: "resume", preemptB: true, pure: 3, quiet: 3, flushes: 1, after: []int64{a, b},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				d.H.Bump(b)
				d.Next[b] = 0
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 1), d.S(b, 2)}, Resumed: []int64{b}}
			}},
		{name: "non-pure step", pure: 3, quiet: 3, flushes: 1, after: []int64{a, b},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 1)}}
			}},
		{name: "order changed", pure: 3, quiet: 3, flushes: 1, after: []int64{b, a},
			trigger: func(d *cachetest.Decoder) cachetest.Step { return d.Decode(b, a) }},
		{name: "other ids", pure: 3, quiet: 3, flushes: 1, after: []int64{a}, idle: []int64{b},
			trigger: func(d *cachetest.Decoder) cachetest.Step { return d.Decode(a) }},
		{name: "block_size steps", pure: 8, quiet: 3, flushes: 2, after: []int64{a, b},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 1)}}
			}},
		{name: "staging capacity", pure: 6, quiet: 2, flushes: 2, after: []int64{a, b},
			cfg: func(c *omnicache.Config) { c.StagingCapacityTokens = 6 }, // 3 steps of 2 tokens
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 1)}}
			}},
		{name: "byte budget", pure: 3, quiet: 1, flushes: 0, device: true, after: []int64{a, b},
			cfg: func(c *omnicache.Config) { // room for 2 steps of 2 tokens
				c.DeviceBudgetBytes = 4 * rowBytes
				c.DeferredChunkBytes = c.DeviceBudgetBytes
			},
			trigger: func(d *cachetest.Decoder) cachetest.Step {
				return cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 1)}}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cachetest.Config()
			cfg.StagingDepth = 16
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			cachetest.RunBufferOnOff(t, cfg, func(h *cachetest.Harness, buffered bool) {
				t := h.T
				h.Device = tc.device
				d := cachetest.NewDecoder(h)
				h.Assign(a, 1, 2, 3, 4)
				h.Assign(b, 5, 6, 7, 8)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 2)}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
				decoding := []int64{a, b}
				if tc.preemptB {
					h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 1)}, Preempted: []int64{b}}))
					decoding = []int64{a}
				}
				h.Sync() // nothing pending: the budget is free again
				base := h.Stats()
				var late []omnicache.StepID // consumed after the trigger
				for i := 0; i < tc.pure; i++ {
					late = append(late, h.Step(d.Decode(decoding...)))
					st := h.Stats()
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
					st := h.Stats()
					require.Positive(t, st.BufferFlushes-base.BufferFlushes, "the byte budget must force the parked rows out before the trigger")
				}

				h.Begin(tc.trigger(d))
				if buffered && tc.flushes > 0 {
					st := h.Stats()
					require.EqualValues(t, tc.flushes, st.BufferFlushes-base.BufferFlushes,
						"Stats.BufferFlushes once the trigger's Begin returned (%d parked steps, at most block_size per flush)", tc.pure)
					require.EqualValues(t, tc.pure, st.BufferedSteps-base.BufferedSteps, "Stats.BufferedSteps")
					require.GreaterOrEqual(t, st.WriteTasks-base.WriteTasks, int64(tc.flushes), "Stats.WriteTasks: one per flush")
				}
				trig := h.Save()

				h.Mat(trig)
				for _, id := range late {
					h.Mat(id)
				}
				for i := 0; i < 2; i++ {
					h.Mat(h.Step(d.Decode(tc.after...)))
				}
				h.CheckMirror()
				h.Drain(append(append([]int64{}, tc.after...), tc.idle...)...)
				st := h.Stats()
				assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak")
				h.CheckMirror()
			})
		})
	}
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
			dev := cachetest.NewBatchDevice()
			cfg := cachetest.Config()
			cfg.Device = dev
			h := cachetest.New(t, cfg)
			h.Device, h.Owned = true, owned
			d := cachetest.NewDecoder(h)
			h.Assign(a, 1, 2, 3)
			h.Assign(b, 4, 5, 6)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 2)}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
			h.Sync()
			require.EqualValues(t, 1, dev.Batches.Load(), "the first step's rows: one batch")
			require.EqualValues(t, 2, dev.Batched.Load(), "of its two keys")
			singles := dev.Singles.Load() // its Materialize may have read its rows from the device
			dev.Hold = make(chan struct{})
			for range cachetest.BlockSize { // block_size pure steps: the last one flushes
				id := cachetest.Guard(t, "a pure decode step whose flush's copies are held back", func() omnicache.StepID { return h.Step(d.Decode(a, b)) })
				h.Discard(id) // (a read of parked rows would copy them)
			}
			require.EqualValues(t, 1, h.C.Stats().BufferFlushes, "BufferFlushes after block_size parked steps")
			close(dev.Hold)
			h.Sync()
			require.EqualValues(t, 2, dev.Batches.Load(), "batches after block_size parked steps")
			require.EqualValues(t, 2+cachetest.BlockSize*2, dev.Batched.Load(), "copies in the flush's batch: steps × keys")
			for range 2 {
				h.Discard(h.Step(d.Decode(a, b)))
			}
			h.Assign(c, 7)
			hold := make(chan struct{})
			dev.Hold = hold
			id := cachetest.Guard(t, "a mixed step whose copies are held back", func() omnicache.StepID {
				return h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 1), d.S(b, 1), d.S(c, 3)}, Arrive: []cachetest.A{{ID: c}}}) // flushes 2 parked steps
			})
			close(hold)
			h.Discard(id)
			h.Sync()
			require.EqualValues(t, 4, dev.Batches.Load(), "batches after the arrival: its flush, then its own rows")
			require.EqualValues(t, 2+cachetest.BlockSize*2+2*2+2, dev.Batched.Load(), "copies in every batch")
			require.Equal(t, singles, dev.Singles.Load(), "no single copy since: nothing read device rows")
			h.CheckMirror()
		})
	}
}

// waitDevice is cachetest.BatchDevice whose first Wait after armed is closed blocks
// until release is closed, and which notes, at each batch, how many rows
// the mirror had taken so far.
type waitDevice struct {
	*cachetest.BatchDevice
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
	return d.BatchDevice.CopyDtoHBatch(dst, src)
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
	return d.BatchDevice.Wait(ev)
}

// A step handed over while the committer still waits for the copies of the
// step before it has its own device→host copies issued before that step is
// scattered into the mirror (and, for one handed over during the scatter,
// between the scatter's parts): back-to-back large steps overlap one's copy
// with the other's scatter instead of running them one after the other.
func TestNextWriteCopiedBeforeScatter(t *testing.T) {
	const a, b = 1, 2
	dev := &waitDevice{BatchDevice: cachetest.NewBatchDevice(),
		armed: make(chan struct{}), waiting: make(chan struct{}), release: make(chan struct{})}
	cfg := cachetest.Config()
	cfg.Device = dev
	cfg.DisableDecodeBuffer = true
	h := cachetest.New(t, cfg)
	dev.c = h.C
	h.Device = true
	d := cachetest.NewDecoder(h)
	h.Assign(a, 1, 2, 3)
	h.Assign(b, 4, 5, 6)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{d.S(a, 2), d.S(b, 2)}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
	h.Sync()
	before := h.C.Stats().RowsWritten
	require.Positive(t, before)

	close(dev.armed)
	id1 := h.Step(d.Decode(a, b))
	select {
	case <-dev.waiting:
	case <-time.After(cachetest.DeadlockTimeout):
		t.Fatal("the committer never waited for the first step's copies")
	}
	id2 := h.Step(d.Decode(a, b)) // handed over while those copies run
	close(dev.release)
	h.Discard(id1)
	h.Discard(id2)
	h.Sync()
	dev.mu.Lock()
	rowsAt := slices.Clone(dev.rowsAt)
	dev.mu.Unlock()
	require.Len(t, rowsAt, 3, "one batch per step")
	require.Equal(t, before, rowsAt[2], "the second step's copies were issued before the first step's rows were scattered")
	h.CheckMirror()
}
