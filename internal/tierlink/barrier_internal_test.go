package tierlink

import "testing"

// A block stored again after many others keeps its outcome while it is
// among the latest barrierKeep resolutions: its first resolution's entry,
// pushed out, does not forget the new one.
func TestBarrierKeepsAReresolvedBlock(t *testing.T) {
	b := newBarrier()
	store := func(h uint64) {
		b.note([]uint64{h})
		b.resolve([]uint64{h}, nil, nil)
	}
	store(1)
	for h := uint64(2); h < barrierKeep/2; h++ {
		store(h)
	}
	store(1) // computed again by a later prompt, stored again
	for h := uint64(barrierKeep / 2); h < barrierKeep+10; h++ {
		store(h)
	}
	if o := b.blocks[1]; o == nil || !o.done || o.err != nil {
		t.Fatalf("block 1, stored %d resolutions ago: outcome %+v, want stored", barrierKeep/2, o)
	}
	if o := b.blocks[2]; o != nil {
		t.Fatalf("block 2, resolved %d resolutions ago: outcome %+v, want forgotten", barrierKeep+8, o)
	}
	if len(b.order) != barrierKeep {
		t.Fatalf("%d resolutions kept, want %d", len(b.order), barrierKeep)
	}
}
