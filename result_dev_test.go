package omnicache_test

// Plan.ResultDev and MaterializeDev, on the host device (its buffers are
// host memory): a prefetched hit copied up into the engine's device
// buffers during the forward, the step's rows put there by Save,
// MaterializeDev finding them in place; the fallbacks, the failures and
// the buffers the engine's again once the step is consumed.

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// devBufs makes one host device buffer per key of h's config for rows
// rows, filled with 0xA5 (a row left unwritten shows).
func devBufs(h *cachetest.Harness, rows int) []gpu.Buffer {
	var out []gpu.Buffer
	for _, k := range h.Cfg.Keys {
		b := bytes.Repeat([]byte{0xA5}, rows*k.RowBytes)
		out = append(out, gpu.Buffer{Host: b, Size: len(b)})
	}
	return out
}

// devHit writes request a's 8 tokens, then begins and saves a step in
// which b arrives hitting them and computes 2, with dev as its ResultDev:
// the step's Result is b's 8 prefix rows and its 2 own.
func devHit(h *cachetest.Harness, dev []gpu.Buffer) omnicache.StepID {
	return hitStep(h, cachetest.Step{ResultDev: dev})
}

// unwritten reports whether b is all 0xA5 (devBufs' fill).
func unwritten(b []byte) bool { return bytes.Equal(b, bytes.Repeat([]byte{0xA5}, len(b))) }

// The committer copies the prefetched hit's rows up into the engine's
// device buffers right after it read them, and Save puts the step's own
// rows there: both are in place before MaterializeDev, which then serves
// every row from there (the harness checks each against its oracle, and
// that it lies in the buffer at its Offset).
func TestResultDevInPlace(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	dev := devBufs(h, 10)
	sid := devHit(h, dev)
	h.Sync() // the prefetch ran (queued at Begin), its copy up issued
	var before [][]byte
	for k, b := range dev {
		rb := h.Cfg.Keys[k].RowBytes
		require.False(t, unwritten(b.Host[8*rb:10*rb]), "key %d: Save put the step's rows in the device buffer", k)
		before = append(before, bytes.Clone(b.Host[:10*rb]))
	}
	require.False(t, unwritten(dev[0].Host[:8*h.Cfg.Keys[0].RowBytes]), "the hit's hidden rows are in the device buffer before MaterializeDev")
	own, err := h.C.OwnResultDev(sid, dev)
	require.NoError(t, err)
	require.True(t, own, "the buffers the step was begun with")
	used := h.Stats().PrefetchUsed
	h.Mat(sid)
	_, err = h.C.OwnResultDev(sid, dev)
	require.ErrorIs(t, err, omnicache.ErrUnknownStep, "consumed")
	assert.Equal(t, used+1, h.Stats().PrefetchUsed, "the prefetch served the step")
	assert.Zero(t, h.DevReady, "nothing copied: ready never ran")
	for k, b := range dev {
		require.Equal(t, before[k], b.Host[:10*h.Cfg.Keys[k].RowBytes], "key %d: the rows found in place", k)
	}
}

// With prefetch off the hit is read by MaterializeDev and copied up then;
// the step's own rows are there from Save.
func TestResultDevNotPrefetched(t *testing.T) {
	cfg := cachetest.Config()
	cfg.DisablePrefetch = true
	h := cachetest.New(t, cfg)
	dev := devBufs(h, 10)
	sid := devHit(h, dev)
	h.Sync()
	rb := h.Cfg.Keys[0].RowBytes
	require.True(t, unwritten(dev[0].Host[:8*rb]), "no prefix rows before MaterializeDev")
	require.False(t, unwritten(dev[0].Host[8*rb:10*rb]), "the step's rows from Save")
	h.Mat(sid)
	assert.Equal(t, 1, h.DevReady, "ready ran before the copies")
}

// MaterializeDev into buffers other than the step's ResultDev reads the
// step and copies every row up into them.
func TestResultDevOtherBuffers(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	sid := devHit(h, devBufs(h, 10))
	other := devBufs(h, 10)
	own, err := h.C.OwnResultDev(sid, other)
	require.NoError(t, err)
	require.False(t, own, "other buffers are not the step's own")
	var res omnicache.Result
	ready := 0
	require.NoError(t, h.C.MaterializeDev(sid, other, &res, func() error { ready++; return nil }))
	require.Equal(t, 1, ready, "ready ran once, before the copies")
	require.NoError(t, h.Verify(sid, nil, &res))
	require.Same(t, &other[0].Host[0], &res.Rows(0, 0)[0], "the rows are in the buffers given")
}

// Buffers too small for the step's rows are left unused: nothing is
// written into them. MaterializeDev into them is ErrOutputs and consumes
// nothing (Stats unchanged); into buffers that hold the rows it serves
// them.
func TestResultDevTooSmall(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	small := devBufs(h, 9)
	sid := devHit(h, small)
	h.Sync()
	for k, b := range small {
		require.True(t, unwritten(b.Host), "key %d: a buffer too small is not written", k)
	}
	st := h.Stats()
	var res omnicache.Result
	require.ErrorIs(t, h.C.MaterializeDev(sid, small, &res, nil), omnicache.ErrOutputs)
	require.ErrorIs(t, h.C.MaterializeDev(sid, small[:1], &res, nil), omnicache.ErrOutputs, "one buffer for two keys")
	require.ErrorIs(t, h.C.MaterializeDev(sid, devBufs(h, 10), nil, nil), omnicache.ErrOutputs, "a nil Result")
	require.Equal(t, st, h.Stats(), "nothing changed")
	other := devBufs(h, 10)
	require.NoError(t, h.C.MaterializeDev(sid, other, &res, nil))
	require.NoError(t, h.Verify(sid, nil, &res))
}

// A request whose prefix cannot be served (a hit over never-written rows
// of a required key) has its Err set and its rows, prefix and own, zeroed
// in the device buffers; the step is consumed.
func TestResultDevFailedRequest(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(map[bool]string{true: "prefetched", false: "read at MaterializeDev"}[prefetch], func(t *testing.T) {
			cfg := cachetest.Config()
			cfg.DisablePrefetch = !prefetch
			h := cachetest.New(t, cfg)
			dev := devBufs(h, 10)
			h.Assign(2, 5, 6, 7)
			sid := h.Step(cachetest.Step{Sched: []cachetest.S{{2, 8, 2}}, Arrive: []cachetest.A{{ID: 2, Hit: 8}}, ResultDev: dev})
			err := h.MatCall(sid, nil, &h.Res)
			require.ErrorIs(t, err, omnicache.ErrAbsentRequired)
			require.ErrorIs(t, h.Res.Err(0), omnicache.ErrAbsentRequired)
			for k, b := range dev {
				require.Equal(t, make([]byte, 10*h.Cfg.Keys[k].RowBytes), b.Host, "key %d: the failed request's rows are zeros", k)
			}
			require.ErrorIs(t, h.MatCall(sid, nil, &h.Res), omnicache.ErrUnknownStep, "the step was consumed")
		})
	}
}

// An optional key the step omits has its step rows zeroed in the device
// buffers by Save.
func TestResultDevOmittedKey(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.OmitKeys = []bool{false, true}
	dev := devBufs(h, 4)
	h.Assign(1, 1)
	sid := h.Step(cachetest.Step{Sched: []cachetest.S{{1, 0, 4}}, Arrive: []cachetest.A{{ID: 1}}, ResultDev: dev})
	require.Equal(t, make([]byte, 4*cachetest.KeyAux.RowBytes), dev[1].Host, "the omitted key's rows are zeros")
	h.Mat(sid)
}

// A plan with another number of ResultDev buffers than keys, a zero
// buffer, or ResultInto as well, is ErrPlan and registers nothing.
func TestResultDevPlanErrors(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.Assign(1, 1, 2)
	good := devBufs(h, 8)
	for name, st := range map[string]cachetest.Step{
		"one buffer for two keys": {ResultDev: good[:1]},
		"a zero buffer":           {ResultDev: []gpu.Buffer{good[0], {}}},
		"ResultInto as well":      {ResultDev: good, ResultInto: [][]byte{make([]byte, 8*32), make([]byte, 8*8)}},
	} {
		st.Sched, st.Arrive = []cachetest.S{{1, 0, 8}}, []cachetest.A{{ID: 1}}
		require.ErrorIs(t, h.TryBegin(st), omnicache.ErrPlan, name)
		require.Zero(t, h.Stats().LiveRequests, name)
	}
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{1, 0, 8}}, Arrive: []cachetest.A{{ID: 1}}, ResultDev: good}))
}

// Discard, Abort and a MaterializeDev of a prefetched step return only
// once nothing writes into its ResultDev buffers any more: the engine
// writes them at once (the race detector sees a copy still running), and
// a later Sync finds its own bytes there.
func TestResultDevSettles(t *testing.T) {
	dev := func(buf []byte) []gpu.Buffer { return []gpu.Buffer{{Host: buf, Size: len(buf)}} }
	settles(t, func(p *omnicache.Plan, buf []byte) { p.ResultDev = dev(buf) },
		func(c *omnicache.Cache, id omnicache.StepID, buf []byte) []byte {
			var res omnicache.Result
			require.NoError(t, c.MaterializeDev(id, dev(buf), &res, nil))
			return res.Rows(0, 0)
		})
}
