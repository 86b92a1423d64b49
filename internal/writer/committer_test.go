package writer

import (
	"testing"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// The committer's scan of queued writes (which makes an older write skip
// the slots a newer one replaces) stops at a write that full blocks ride
// on (Write.Pub): a write queued behind it must not make it skip the rows
// its gather reads. It records that write's own slots, stops there again
// on every scan until the write ran, then goes on.
func TestScanStopsAtRidingWrite(t *testing.T) {
	q := NewQueue[Task](4)
	c, err := NewCommitter(CommitterConfig{Queue: q, NumSlots: 16, Imm: []int{0}, RowBytes: []int{8}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { hostmem.FreeUint64s(c.newest) }()
	w0 := &Write{ID: 1, Slots: []int32{0, 1}}
	w1 := &Write{ID: 2, Slots: []int32{4, 5}, Pub: []int32{1}, PubKeys: []uint64{9}}
	w2 := &Write{ID: 3, Slots: []int32{4, 5, 8}}
	for _, w := range []*Write{w0, w1, w2} {
		q.PushLazy(Task{W: w})
	}
	check := func(when string, max uint64, s4, s8 uint64) {
		t.Helper()
		if c.newestMax != max || c.newest[4] != s4 || c.newest[8] != s8 {
			t.Fatalf("%s: newestMax %d, newest[4] %d, newest[8] %d; want %d, %d, %d", when, c.newestMax, c.newest[4], c.newest[8], max, s4, s8)
		}
	}
	c.scanQueued()
	check("first scan", 2, 2, 0)
	c.scanQueued()
	check("second scan", 2, 2, 0)
	// w0 and w1 run (popped: the run loop marks a riding write scanned
	// once its gather is done); the scan reaches w2.
	for i := 0; i < 2; i++ {
		if _, ok := q.Pop(); !ok {
			t.Fatal("queue closed")
		}
		c.popped++
	}
	c.scanned = max(c.scanned, c.popped)
	c.scanQueued()
	check("after w1 ran", 3, 3, 3)
}
