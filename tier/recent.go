package tier

import (
	"sync/atomic"
	"time"
)

// Blocks this Tier stored lately. Replicas that share a tier compute the
// same prefixes (a system prompt, a popular document): without a memory of
// what was stored, each of them gathers, checksums and stores the same
// block again, and on the embedded store every copy is another pass over
// the rows through the shared caches of the machine the engines run on.
// StoredRecently lets a publisher skip a block the tier stored within
// Options.RecentWindow.
//
// The memory is a direct-mapped table of recentSlots words, lock-free:
// each word holds a tag of the block's mixed hash and the coarse time it
// was stored. It is lossy both ways a skip can cost, never a wrong row: a
// block pushed out of the table by another is stored again (the cost
// saved is lost), and a block the backend evicted within the window is
// not stored again until the window passes (a hit is lost: a later import
// finds a miss, as for any evicted block). Two blocks would have to share
// a slot and the tag's 44 bits for one to be taken for the other.

const (
	recentBits  = 16
	recentSlots = 1 << recentBits // 512 KiB of words per Tier
	tickShift   = 20              // a tick is 2^20 ns (~1.05 ms)
	tickBits    = 20              // ticks wrap after ~18 min
	tickMask    = 1<<tickBits - 1

	// DefaultRecentWindow is Options.RecentWindow when zero: well under
	// the time a block stays in a store that holds minutes of publishing,
	// long enough to cover replicas computing one prefix at once.
	DefaultRecentWindow = time.Second
	// MaxRecentWindow bounds Options.RecentWindow (the ticks wrap).
	MaxRecentWindow = 10 * time.Minute
)

type recent struct {
	slots  []atomic.Uint64
	window uint64 // ticks; 0: nothing is remembered
}

func newRecent(window time.Duration) recent {
	if window <= 0 {
		return recent{}
	}
	return recent{slots: make([]atomic.Uint64, recentSlots), window: max(1, uint64(window)>>tickShift)}
}

// mixHash spreads an engine hash over the word (a splitmix64 finalizer):
// the slot comes from its top bits, the tag from the rest.
func mixHash(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

func nowTick() uint64 { return uint64(time.Now().UnixNano()) >> tickShift }

// note records that block hash was stored at tick now.
func (r *recent) note(hash, now uint64) {
	if r.window == 0 {
		return
	}
	m := mixHash(hash)
	r.slots[m>>(64-recentBits)].Store(m&^tickMask | now&tickMask)
}

// held reports whether block hash was noted within the window before now.
// The table is on (window > 0): StoredRecently checks, before it reads the
// clock.
func (r *recent) held(hash, now uint64) bool {
	m := mixHash(hash)
	w := r.slots[m>>(64-recentBits)].Load()
	if w == 0 || w&^tickMask != m&^tickMask {
		return false
	}
	return (now-w)&tickMask < r.window
}

// StoredRecently reports whether every key of block hash was stored
// through t within Options.RecentWindow (advisory: see the type's
// comment). Safe for concurrent use; no backend call.
func (t *Tier) StoredRecently(hash uint64) bool {
	if t.recent.window == 0 {
		return false // off: no clock read per block
	}
	return t.recent.held(hash, nowTick())
}

// ForgetRecent forgets every block noted as stored lately: StoredRecently
// answers false until blocks are stored again (a cache's Reset: what was
// stored before may not be what the store holds after it).
func (t *Tier) ForgetRecent() {
	for i := range t.recent.slots {
		t.recent.slots[i].Store(0)
	}
}
