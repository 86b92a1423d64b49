package soa

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// check verifies the table's internal invariants.
func (t *Requests) check(tb testing.TB) {
	tb.Helper()
	n := t.Len()
	for _, col := range []int{len(t.HitTokens), len(t.HitOff), len(t.HitN), len(t.Flags), len(t.Aux), len(t.handle)} {
		require.Equal(tb, n, col, "column length")
	}
	require.Len(tb, t.index, n)
	require.Equal(tb, len(t.pos), n+len(t.free), "every handle is live or free")
	live := 0
	for p := range n {
		h := t.handle[p]
		require.Equal(tb, int32(p), t.pos[h], "pos[handle[p]] == p")
		require.Equal(tb, Handle(h), t.index[t.ID[p]])
		off, k := t.HitOff[p], t.HitN[p]
		require.GreaterOrEqual(tb, off, int32(0))
		require.LessOrEqual(tb, int(off+k), len(t.Blocks))
		live += int(k)
	}
	for _, h := range t.free {
		require.Equal(tb, int32(-1), t.pos[h], "free handle %d", h)
	}
	require.Equal(tb, len(t.Blocks), live+t.garbage, "arena = live + garbage")
	require.LessOrEqual(tb, 2*t.garbage, len(t.Blocks), "compacted when more than half is garbage")
}

type modelReq struct {
	hitTokens int32
	blocks    []int32
	flags     uint32
	aux       int64
}

// TestRequestsRandom drives the table with random Add/Remove/Lookup against
// a map model and checks that every live handle keeps naming its request
// through the swap-removes.
func TestRequestsRandom(t *testing.T) {
	for _, capHint := range []int{0, 64} {
		rng := rand.New(rand.NewPCG(uint64(capHint), 11))
		tab := NewRequests(capHint)
		model := map[int64]modelReq{}
		handles := map[int64]Handle{}
		liveHandles := map[Handle]bool{}
		for step := range 10000 {
			switch op := rng.IntN(10); {
			case op < 5: // add (sometimes an id that is live)
				id := rng.Int64N(300)
				blocks := make([]int32, rng.IntN(6))
				for i := range blocks {
					blocks[i] = rng.Int32()
				}
				h, added := tab.Add(id, int32(16*len(blocks)), blocks)
				if _, live := model[id]; live {
					require.False(t, added)
					require.Equal(t, handles[id], h)
					break
				}
				require.True(t, added)
				require.False(t, liveHandles[h], "handle of a live request reused")
				liveHandles[h] = true
				blocks = slices.Clone(blocks)
				model[id] = modelReq{hitTokens: int32(16 * len(blocks)), blocks: blocks}
				handles[id] = h
				p := tab.Pos(h)
				tab.Flags[p] = uint32(id) * 3
				tab.Aux[p] = -id
				m := model[id]
				m.flags, m.aux = uint32(id)*3, -id
				model[id] = m
			case op < 9: // remove a live one
				if len(handles) == 0 {
					break
				}
				ids := make([]int64, 0, len(handles))
				for id := range handles {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				id := ids[rng.IntN(len(ids))]
				tab.Remove(handles[id])
				require.Equal(t, -1, tab.Pos(handles[id]))
				delete(liveHandles, handles[id])
				delete(model, id)
				delete(handles, id)
			default: // lookup of a random id
				id := rng.Int64N(300)
				h, ok := tab.Lookup(id)
				wh, live := handles[id]
				require.Equal(t, live, ok)
				if live {
					require.Equal(t, wh, h)
				}
			}
			if step%97 == 0 || len(model) < 3 {
				tab.check(t)
				require.Equal(t, len(model), tab.Len())
				for id, want := range model {
					h := handles[id]
					lh, ok := tab.Lookup(id)
					require.True(t, ok)
					require.Equal(t, h, lh)
					p := tab.Pos(h)
					require.Equal(t, id, tab.ID[p])
					require.Equal(t, want.hitTokens, tab.HitTokens[p])
					require.Equal(t, int32(len(want.blocks)), tab.HitN[p])
					require.Equal(t, want.flags, tab.Flags[p])
					require.Equal(t, want.aux, tab.Aux[p])
					require.Equal(t, want.blocks, []int32(append([]int32{}, tab.HitBlocks(h)...)))
				}
			}
		}
		tab.Reset()
		tab.check(t)
		require.Zero(t, tab.Len())
		_, ok := tab.Lookup(0)
		require.False(t, ok)
		h, added := tab.Add(5, 0, nil)
		require.True(t, added)
		require.Equal(t, Handle(0), h, "Reset frees every handle")
	}
}

func TestRequestsSwapRemoveKeepsHandles(t *testing.T) {
	var tab Requests // the zero value works
	a, _ := tab.Add(10, 16, []int32{1})
	b, _ := tab.Add(20, 32, []int32{2, 3})
	c, _ := tab.Add(30, 0, nil)
	tab.Flags[tab.Pos(c)] = 7
	tab.Remove(a) // c moves to position 0
	require.Equal(t, 0, tab.Pos(c))
	require.Equal(t, 1, tab.Pos(b))
	require.Equal(t, int64(30), tab.ID[0])
	require.Equal(t, uint32(7), tab.Flags[0])
	require.Equal(t, []int32{2, 3}, tab.HitBlocks(b))
	require.Empty(t, tab.HitBlocks(c))
	d, added := tab.Add(40, 16, []int32{9})
	require.True(t, added)
	require.Equal(t, a, d, "freed handle reused")
	require.Equal(t, []int32{9}, tab.HitBlocks(d))
	require.Panics(t, func() { tab.Remove(a); tab.Remove(a) })
	tab.check(t)
}

func TestRequestsArenaCompaction(t *testing.T) {
	tab := NewRequests(8)
	var hs []Handle
	for i := range 8 {
		h, _ := tab.Add(int64(i), 16*4, []int32{int32(4 * i), int32(4*i + 1), int32(4*i + 2), int32(4*i + 3)})
		hs = append(hs, h)
	}
	require.Len(t, tab.Blocks, 32)

	// Removing the arena's tail request truncates instead of leaving garbage.
	tab.Remove(hs[7])
	require.Len(t, tab.Blocks, 28)
	require.Zero(t, tab.garbage)

	// Removing from the middle leaves garbage until more than half is.
	tab.Remove(hs[0])
	tab.Remove(hs[2])
	tab.Remove(hs[4])
	require.Len(t, tab.Blocks, 28)
	require.Equal(t, 12, tab.garbage)
	tab.check(t)
	tab.Remove(hs[1]) // 16 of 28 garbage: compacts
	require.Zero(t, tab.garbage)
	require.Len(t, tab.Blocks, 12)
	tab.check(t)
	for _, i := range []int{3, 5, 6} {
		require.Equal(t, []int32{int32(4 * i), int32(4*i + 1), int32(4*i + 2), int32(4*i + 3)}, tab.HitBlocks(hs[i]))
	}

	// The arenas swap: further compactions reuse the old one.
	for i := 8; i < 40; i++ {
		h, _ := tab.Add(int64(i), 16, []int32{int32(i)})
		hs = append(hs, h)
	}
	for i := 8; i < 39; i++ {
		tab.Remove(hs[i])
		tab.check(t)
	}
	require.Equal(t, []int32{39}, tab.HitBlocks(hs[39]))
	for _, i := range []int{3, 5, 6} {
		require.Equal(t, int32(4*i), tab.HitBlocks(hs[i])[0])
	}
}

func TestRequestsNoAllocs(t *testing.T) {
	tab := NewRequests(64)
	blocks := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	rng := rand.New(rand.NewPCG(1, 1))
	live := []Handle{}
	next := int64(0)
	step := func() {
		// Keep about 48 requests live; ids never repeat.
		if len(live) < 48 || rng.IntN(2) == 0 {
			h, _ := tab.Add(next, 128, blocks[:rng.IntN(len(blocks)+1)])
			next++
			live = append(live, h)
		} else {
			i := rng.IntN(len(live))
			tab.Remove(live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	for range 100000 { // warm-up: columns, arenas and map reach their size
		step()
	}
	require.Zero(t, testing.AllocsPerRun(10000, step))
	require.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = tab.Lookup(next - 1) }))
	tab.check(t)
}

// SetHit replaces a live request's hit; other requests' blocks are kept
// through the arena's compaction.
func TestRequestsSetHit(t *testing.T) {
	tab := NewRequests(4)
	a, _ := tab.Add(1, 8, []int32{1, 2})
	b, _ := tab.Add(2, 4, []int32{3})
	for i := range 20 {
		tab.SetHit(a, int32(4*i), []int32{int32(10 + i), int32(20 + i)}[:min(i, 2)])
		if got := tab.HitBlocks(a); len(got) != min(i, 2) || tab.HitTokens[tab.Pos(a)] != int32(4*i) {
			t.Fatalf("round %d: hit %v of %d tokens", i, got, tab.HitTokens[tab.Pos(a)])
		}
		if got := tab.HitBlocks(b); len(got) != 1 || got[0] != 3 {
			t.Fatalf("round %d: the other request's hit is %v", i, got)
		}
	}
	if len(tab.Blocks) > 8 {
		t.Fatalf("arena of %d ids for 3 live ones: garbage not compacted", len(tab.Blocks))
	}
}

// TestRequestsAddAt: a removed request comes back under its own handle,
// with its hit, whatever was added and removed since; a live id or a
// handle in use is refused and changes nothing.
func TestRequestsAddAt(t *testing.T) {
	r := NewRequests(4)
	h1, _ := r.Add(1, 8, []int32{3, 4})
	h2, _ := r.Add(2, 0, nil)
	r.Remove(h1)
	h3, _ := r.Add(3, 4, []int32{9}) // takes h1's handle
	require.Equal(t, h1, h3)
	r.Remove(h2)
	r.Remove(h3)
	require.True(t, r.AddAt(h1, 1, 8, []int32{3, 4}))
	require.False(t, r.AddAt(h2, 1, 0, nil), "a live id")
	require.False(t, r.AddAt(h1, 5, 0, nil), "a handle in use")
	require.False(t, r.AddAt(Handle(7), 5, 0, nil), "a handle never made")
	r.check(t)
	got, ok := r.Lookup(1)
	require.True(t, ok)
	require.Equal(t, h1, got)
	require.Equal(t, []int32{3, 4}, r.HitBlocks(h1))
	require.True(t, r.AddAt(h2, 2, 0, nil))
	h4, _ := r.Add(4, 0, nil)
	require.NotContains(t, []Handle{h1, h2}, h4)
	r.check(t)
}
