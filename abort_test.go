package omnicache_test

// Abort, and a Save that fails, undo everything their Begin did: a
// replace, a preemption, a resume with a hit, arrivals, finishes, and the
// hits the step's plan registered. Each case runs once with Abort and once
// with a failed Save, and reads rows that name their request, position
// and version.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

// rowCache is a cache of one 8-byte key, block size 4, whose rows are
// (request, position, version).
type rowCache struct {
	t *testing.T
	c *omnicache.Cache
	// abandon ends a begun step without saving it: Abort, or a Save that
	// fails.
	abandon func()
}

const rowBS = 4

func newRowCache(t *testing.T, how string) *rowCache {
	c, err := omnicache.New(omnicache.Config{NumBlocks: 32, BlockSize: rowBS, Keys: []omnicache.Key{{Name: "h", RowBytes: 8}}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	rc := &rowCache{t: t, c: c}
	rc.abandon = func() { require.NoError(t, c.Abort()) }
	if how == "failed Save" {
		rc.abandon = func() {
			_, err := c.Save(&omnicache.Outputs{Tokens: 1 << 20})
			require.ErrorIs(t, err, omnicache.ErrTokenCount)
		}
	}
	return rc
}

// table is 4 rows of 8 blocks: request id's row is id-1, its blocks
// 8*(id-1)... unless given.
func (rc *rowCache) plan(p omnicache.Plan) *omnicache.Plan {
	p.Stride = 8
	p.Table = make([]int32, 32)
	for i := range p.Table {
		p.Table[i] = int32(i)
	}
	return &p
}

// step begins p and saves its rows: request i's count rows from start,
// version ver.
func (rc *rowCache) step(p *omnicache.Plan, ver byte) omnicache.StepID {
	rc.t.Helper()
	require.NoError(rc.t, rc.c.Begin(p))
	host := []byte{} // not nil: a step of no tokens still supplies the key
	n := 0
	for i, id := range p.IDs {
		for j := int32(0); j < p.Count[i]; j++ {
			host = append(host, byte(id), byte(p.Start[i]+j), ver, 0, 0, 0, 0, 0)
			n++
		}
	}
	id, err := rc.c.Save(&omnicache.Outputs{Tokens: n, Tensors: []omnicache.Tensor{{Host: host, Rows: n}}})
	require.NoError(rc.t, err)
	return id
}

// mat materializes step id and returns, per request, its rows as
// "id:pos:ver" and its first position.
func (rc *rowCache) mat(id omnicache.StepID) map[int64]string {
	rc.t.Helper()
	var res omnicache.Result
	require.NoError(rc.t, rc.c.Materialize(id, nil, &res))
	out := map[int64]string{}
	for i := 0; i < res.Len(); i++ {
		s := fmt.Sprintf("from %d:", res.From(i))
		for _, b := range chunk(res.Rows(i, 0), 8) {
			s += fmt.Sprintf(" %d:%d:%d", b[0], b[1], b[2])
		}
		out[res.ID(i)] = s
	}
	return out
}

func chunk(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) >= n {
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

func forBoth(t *testing.T, f func(t *testing.T, rc *rowCache)) {
	for _, how := range []string{"Abort", "failed Save"} {
		t.Run(how, func(t *testing.T) { f(t, newRowCache(t, how)) })
	}
}

// TestAbandonedReplace: a step of positions 0..7 saved before a Begin that
// replaced its request from position 4, and was abandoned, delivers all 8
// of its rows, and the request goes on from 8.
func TestAbandonedReplace(t *testing.T) {
	forBoth(t, func(t *testing.T, rc *rowCache) {
		s1 := rc.step(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8}, Arrivals: []int64{1}, HitTokens: []int32{0}}), 0)
		require.NoError(t, rc.c.Begin(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{4}, Count: []int32{4},
			Replaced: []int64{1}, ReplacedFrom: []int32{4}})))
		rc.abandon()
		require.Equal(t, "from 0: 1:0:0 1:1:0 1:2:0 1:3:0 1:4:0 1:5:0 1:6:0 1:7:0", rc.mat(s1)[1])
		s2 := rc.step(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{8}, Count: []int32{1}}), 0)
		require.Equal(t, "from 8: 1:8:0", rc.mat(s2)[1])
	})
}

// TestAbandonedReplaceThenPreempt: after an abandoned replace from 4, the
// request (8 rows delivered) is preempted and resumes without a hit on new
// blocks: its recompute of 0..7 delivers none of them again, then 8.
func TestAbandonedReplaceThenPreempt(t *testing.T) {
	forBoth(t, func(t *testing.T, rc *rowCache) {
		rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8}, Arrivals: []int64{1}, HitTokens: []int32{0}}), 0))
		require.NoError(t, rc.c.Begin(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{4}, Count: []int32{4},
			Replaced: []int64{1}, ReplacedFrom: []int32{4}})))
		rc.abandon()
		rc.c.Discard(rc.step(rc.plan(omnicache.Plan{Preempted: []int64{1}}), 0))
		// resumed on row 2's blocks (16..), recomputing 0..9 (version 1)
		got := rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{2}, Start: []int32{0}, Count: []int32{10}, Resumed: []int64{1}}), 1))
		require.Equal(t, "from 8: 1:8:1 1:9:1", got[1], "rows 4..7 delivered twice")
	})
}

// TestAbandonedPreemptKeepsPendingHit: a request that arrived with an
// 8-token hit not served yet keeps it through a Begin that preempted it and
// was abandoned: its first step gets the hit prefix.
func TestAbandonedPreemptKeepsPendingHit(t *testing.T) {
	forBoth(t, func(t *testing.T, rc *rowCache) {
		rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8}, Arrivals: []int64{1}, HitTokens: []int32{0}}), 0))
		rc.c.Discard(rc.step(rc.plan(omnicache.Plan{Finished: []int64{1}, Arrivals: []int64{2}, HitTokens: []int32{8}, HitBlocks: []int32{0, 1}}), 0))
		require.NoError(t, rc.c.Begin(rc.plan(omnicache.Plan{Preempted: []int64{2}})))
		rc.abandon()
		got := rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{8}, Count: []int32{1}}), 0))
		require.Equal(t, "from 0: 1:0:0 1:1:0 1:2:0 1:3:0 1:4:0 1:5:0 1:6:0 1:7:0 2:8:0", got[2], "the pending hit prefix")
	})
}

// TestAbandonedFinishArrivalResume: a Begin that finished one request,
// resumed another with a hit, and made a third arrive with a hit, then was
// abandoned: the finished request is live again (it continues), the
// resumed one resumes later without a hit, the arrival is not live, and
// the live count and hit counters are as before it.
func TestAbandonedFinishArrivalResume(t *testing.T) {
	forBoth(t, func(t *testing.T, rc *rowCache) {
		rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{0, 0}, Count: []int32{8, 6},
			Arrivals: []int64{1, 2}, HitTokens: []int32{0, 0}}), 0))
		rc.c.Discard(rc.step(rc.plan(omnicache.Plan{Preempted: []int64{2}}), 0))
		before := rc.c.Stats()
		require.NoError(t, rc.c.Begin(rc.plan(omnicache.Plan{IDs: []int64{2, 3}, Rows: []int32{2, 3}, Start: []int32{4, 8}, Count: []int32{2, 1},
			Finished: []int64{1}, Resumed: []int64{2}, Arrivals: []int64{2, 3}, HitTokens: []int32{4, 8}, HitBlocks: []int32{0, 0, 1}})))
		rc.abandon()
		after := rc.c.Stats()
		require.Equal(t, before.LiveRequests, after.LiveRequests)
		require.Equal(t, before.HitRequests, after.HitRequests)
		require.Equal(t, before.HitTokens, after.HitTokens)
		// request 1 continues at 8; request 2 resumes without a hit on new
		// blocks and recomputes 0..6 (version 1): only 6 is new to it.
		got := rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 2}, Start: []int32{8, 0}, Count: []int32{1, 7},
			Resumed: []int64{2}}), 1))
		require.Equal(t, "from 8: 1:8:1", got[1])
		require.Equal(t, "from 6: 2:6:1", got[2])
		// request 3 arrives for real: its hit is served
		got = rc.mat(rc.step(rc.plan(omnicache.Plan{IDs: []int64{3}, Rows: []int32{3}, Start: []int32{8}, Count: []int32{1},
			Arrivals: []int64{3}, HitTokens: []int32{8}, HitBlocks: []int32{0, 1}}), 2))
		require.Equal(t, "from 0: 1:0:0 1:1:0 1:2:0 1:3:0 1:4:0 1:5:0 1:6:0 1:7:0 3:8:2", got[3])
	})
}
