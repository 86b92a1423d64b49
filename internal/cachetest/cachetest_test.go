package cachetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/gpu"
)

// A short check that the deadlock detector itself works (it guards every
// call the harness makes): a function that returns is passed through.
func TestGuardPassesThrough(t *testing.T) {
	v := Guard(t, "quick", func() int { time.Sleep(time.Millisecond); return 7 })
	require.Equal(t, 7, v)
}

// The row oracle names what a row holds: the row of a tag, zeros, or
// garbage (a row of one tag with a byte changed is no longer that tag's).
func TestDescribeNamesRows(t *testing.T) {
	g := MkTag(1, 42, 7, 3)
	require.Equal(t, "k1/req42/pos7/v3", g.String())
	for _, rb := range []int{8, 12, 32} {
		row := RowOf(g, rb)
		require.Equal(t, g.String(), Describe(row), "%d-byte row", rb)
		require.NotEqual(t, RowOf(MkTag(1, 42, 8, 3), rb), row, "rows of neighbouring positions differ")
		require.Equal(t, "zeros", Describe(RowOf(0, rb)))
		if rb > 8 {
			row[rb-1] ^= 1
			require.Contains(t, Describe(row), "garbage")
		}
	}
}

// GateDevice holds the Waits on the events recorded while it is armed
// until they are released, one by one (Hold, Release) or all at once
// (Open); events recorded before never block.
func TestGateDeviceHoldsEvents(t *testing.T) {
	d := NewGateDevice()
	before, err := d.Record()
	require.NoError(t, err)
	stop := d.Hold()
	e1, err := d.Record()
	require.NoError(t, err)
	e2, err := d.Record()
	require.NoError(t, err)
	require.Equal(t, e2, stop(), "the last event gated")
	after, err := d.Record()
	require.NoError(t, err)
	require.NoError(t, d.Wait(before), "an event recorded before Hold")
	require.NoError(t, d.Wait(after), "an event recorded after stop")

	waited := func(e gpu.Event) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- d.Wait(e) }()
		return ch
	}
	w1, w2 := waited(e1), waited(e2)
	require.True(t, d.WaitEntered(DeadlockTimeout), "a Wait blocked on a gated event")
	select {
	case <-w1:
		t.Fatal("Wait on a gated event returned before its release")
	case <-time.After(10 * time.Millisecond):
	}
	d.Release(e1)
	require.NoError(t, Guard(t, "Wait on a released event", func() error { return <-w1 }))
	d.Open()
	require.NoError(t, Guard(t, "Wait after Open", func() error { return <-w2 }))
}

// A hit registered and not served at once (here a preempted request that
// resumes hitting another request's blocks, scheduled only a step later)
// is served by the request's first scheduled step: the model serves it
// there too (its rows past what the request had before), and counts the
// deferred clones it reads while they are in transit among what that
// step pins until it is consumed (pinnedBound), as the cache's hit plan
// pins them. Without it, the model expected no prefix, and its bound fell
// short of the cache's pinned bytes: the spurious ErrBudget of
// FuzzCache's inputs 51728444123a8bb7 and e4f050e4bc2f5c0e.
func TestPendingResumeHitIsModelled(t *testing.T) {
	h := New(t, Config(KeyHidden, KeyCodes))
	const a, r = 1, 2
	h.Assign(a, 0, 1, 2)
	h.Assign(r, 3, 4, 5)
	h.Mat(h.Step(Step{Sched: []S{{a, 0, 8}, {r, 0, 2}}, Arrive: []A{{ID: a}, {ID: r}}}))
	h.Mat(h.Step(Step{Sched: []S{{a, 8, 1}}, Preempted: []int64{r}}))
	h.Assign(r, 0, 1, 6) // r resumes on a's blocks 0 and 1 (8 tokens), not scheduled yet
	h.Bump(r)
	h.Mat(h.Step(Step{Sched: []S{{a, 9, 1}}, Resumed: []int64{r}, Arrive: []A{{ID: r, Hit: 8}}}))
	sid := h.Step(Step{Sched: []S{{a, 10, 1}, {r, 8, 1}}})
	// a is live: the deferred rows of its first step (8 tokens) stay on
	// the device clone, which r's hit plan pins until the step is consumed.
	run := NewRunner(h, 1, true)
	run.late = append(run.late, lateMat{id: sid})
	def := int64(KeyCodes.RowBytes)
	require.GreaterOrEqual(t, run.pinnedBound(nil), (8+2)*def, "the bound counts the hit's clone and the step's own")
	h.Mat(sid) // r gets positions 2..7 from the hit (it had 0..1), then 8
	require.Equal(t, 2, h.Res.From(1))
	require.Equal(t, 6, h.Res.Prefix(1))
}
