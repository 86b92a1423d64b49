package writer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/omnicache/omnicache/soa"
)

// JoinSeq against a reference: for any set of hit blocks, the newest task
// handed over and not finished that lands rows in one of them (0: none),
// as tasks are handed over (writes of consecutive or scattered slots,
// imports of whole blocks) and finished in order; block sizes a power of
// two and not (Tenancy.Block shifts or divides).
//
// Writes are checked slot by slot up to joinScanSlots and by their worked
// out blocks above: every write one way, the other, or by size.
func TestJoinSeq(t *testing.T) {
	defer func(v int) { joinScanSlots = v }(joinScanSlots)
	for _, scan := range []struct {
		name string
		n    int
	}{{"blocks", 0}, {"slots", 1 << 30}, {"mixed", 8}} {
		for _, bs := range []int{1, 3, 4, 16} {
			t.Run(fmt.Sprintf("scan=%s/bs=%d", scan.name, bs), func(t *testing.T) {
				joinScanSlots = scan.n
				testJoinSeq(t, bs)
			})
		}
	}
}

func testJoinSeq(t *testing.T, bs int) {
	const nb = 40
	ten, err := soa.NewTenancy(nb, bs)
	if err != nil {
		t.Fatal(err)
	}
	p := &Path{ten: ten, q: NewQueue[Task](4)}
	p.cfg.NumBlocks, p.lay.BlockSize = nb, bs
	defer p.ten.Free()
	rng := rand.New(rand.NewPCG(uint64(bs), 7))
	type task struct {
		seq    uint64
		blocks map[int]bool
	}
	var live []task // handed over, not finished, oldest first
	for it := 0; it < 3000; it++ {
		tk := task{blocks: map[int]bool{}}
		var sl []int32
		imp := rng.IntN(5) == 0
		for r := rng.IntN(4); r >= 0; r-- {
			if imp {
				b := rng.IntN(nb)
				sl = append(sl, int32(b))
				tk.blocks[b] = true
				continue
			}
			s := int32(rng.IntN(nb * bs))
			for n := rng.IntN(2 * bs); n >= 0 && int(s) < nb*bs; n-- {
				sl = append(sl, s)
				tk.blocks[int(s)/bs] = true
				s++
			}
		}
		tk.seq = p.q.Push(Task{})
		if imp {
			p.logImport(tk.seq, sl)
			clear(sl) // the log keeps its own copy
		} else {
			var known []int32 // as Save knows a long step's: one per block a run writes in
			if rng.IntN(2) == 0 {
				known = []int32{}
				for i, s := range sl {
					if i == 0 || s/int32(bs) != sl[i-1]/int32(bs) {
						known = append(known, s/int32(bs))
					}
				}
			}
			p.logWrite(&Write{Seq: tk.seq, Slots: sl}, known)
		}
		live = append(live, tk)
		for n := rng.IntN(3); n > 0 && len(live) > 0; n-- { // the committer finishes some
			if _, ok := p.q.Pop(); !ok {
				t.Fatal("queue closed")
			}
			p.q.Done()
			live = live[1:]
		}
		if it < 1000 && it%400 != 399 {
			continue // no hit for a while: the log trims itself as it grows
		}
		hits := make([][]int32, rng.IntN(3))
		var want uint64
		for i := range hits {
			for n := rng.IntN(4); n > 0; n-- {
				b := rng.IntN(nb)
				hits[i] = append(hits[i], int32(b))
				for _, tk := range live {
					if tk.blocks[b] {
						want = max(want, tk.seq)
					}
				}
			}
		}
		if got := p.joinSeq(hits); got != want {
			t.Fatalf("after task %d: JoinSeq(%v) = %d, want %d", tk.seq, hits, got, want)
		}
		if len(p.plog.tasks)-p.plog.first != len(live) {
			t.Fatalf("log holds %d tasks, %d not finished", len(p.plog.tasks)-p.plog.first, len(live))
		}
	}
}
