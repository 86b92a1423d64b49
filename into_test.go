package omnicache_test

// Materialize into the caller's memory (Result.Into) and its size query
// (Cache.StepRows).

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// StepRows tells the requests and the rows a Materialize returns (hit
// prefixes included) without consuming the step, and fails as
// Materialize does for an unknown step or a request outside it, changing
// nothing.
func TestStepRowsConsumesNothing(t *testing.T) {
	const a, b, c = 1, 2, 3
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2, 3)
	h.Assign(c, 4)
	sid := h.Step(cachetest.Step{
		Sched:    []cachetest.S{{c, 0, 3}, {b, 8, 4}},
		Arrive:   []cachetest.A{{ID: c}, {ID: b, Hit: 8}},
		Finished: []int64{a},
	})
	n, rows, err := h.C.StepRows(sid, nil)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 3+8+4, rows, "c's 3 rows, b's 8 hit and 4 computed")
	n, rows, err = h.C.StepRows(sid, []int64{b})
	require.NoError(t, err)
	require.Equal(t, []int{1, 12}, []int{n, rows})

	_, _, err = h.C.StepRows(sid, []int64{b, 99})
	require.ErrorIs(t, err, omnicache.ErrNotInStep)
	_, _, err = h.C.StepRows(sid+1, nil)
	require.ErrorIs(t, err, omnicache.ErrUnknownStep)
	h.Mat(sid, b, c) // the step is still there, whole
	_, _, err = h.C.StepRows(sid, nil)
	require.ErrorIs(t, err, omnicache.ErrUnknownStep, "consumed")
}

// With Into, rows land in the caller's buffers when they hold them; a key
// whose buffer is too small gets the Result's own memory, its rows as
// right; Into(nil) returns to the Result's own memory for every key.
func TestMaterializeIntoTheCallersBuffers(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2, 3)
	sid := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}, Finished: []int64{a}})
	_, rows, err := h.C.StepRows(sid, nil)
	require.NoError(t, err)
	hidden := make([]byte, rows*cachetest.KeyHidden.RowBytes)
	short := make([]byte, (rows-1)*cachetest.KeyAux.RowBytes)
	h.Res.Into([][]byte{hidden, short})
	h.Mat(sid) // every row checked against the oracle
	require.Equal(t, 10, h.Res.Tokens(0))
	require.Same(t, &hidden[0], &h.Res.Rows(0, 0)[0], "hidden: in the caller's buffer")
	require.NotSame(t, &short[0], &h.Res.Rows(0, 1)[0], "aux: too small, in the Result's memory")
	require.Equal(t, make([]byte, len(short)), short, "a buffer too small is not written")

	h.Res.Into(nil)
	sid = h.Step(cachetest.Step{Sched: []cachetest.S{{b, 10, 1}}})
	h.Mat(sid)
	require.NotSame(t, &hidden[0], &h.Res.Rows(0, 0)[0], "after Into(nil): the Result's own memory")
}
