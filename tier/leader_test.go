package tier

import (
	"context"
	"errors"
	"testing"
)

// plainBackend hides every optional interface of the store it wraps: only
// Backend's methods are promoted.
type plainBackend struct{ Backend }

// forwarder wraps the embedded store and forwards Leader, counting calls:
// a wrapper keeps the fast path.
type forwarder struct {
	*Embedded
	calls int
}

func (f *forwarder) Leading(ctx context.Context, a Addrs) (int, error) {
	f.calls++
	return f.Embedded.Leading(ctx, a)
}

// failingLeader holds the first held addresses, then fails.
type failingLeader struct {
	Backend
	held int
}

func (f failingLeader) Leading(context.Context, Addrs) (int, error) {
	return f.held, ErrUnavailable
}

// TestLookupLeader: Lookup asks a backend that is a Leader (forwarded
// through a wrapper) and one that is not (Exists) the same question and
// gets the same answer: the leading blocks whose every key is held; a
// Leader's failure comes back with the whole blocks held before it.
func TestLookupLeader(t *testing.T) {
	ctx := context.Background()
	e, _ := NewEmbedded(0)
	fw := &forwarder{Embedded: e}
	lead := newTier(t, fw)
	plain := newTier(t, plainBackend{e})
	hs := hashes(0, 10)
	for _, h := range hs {
		if _, err := lead.Put(ctx, []Block{block(testNS, h)}); err != nil {
			t.Fatal(err)
		}
	}
	e.Delete(ctx, []string{lead.Addr(hs[6], 1)}) // block 6 loses its second key
	for _, tr := range []*Tier{lead, plain} {
		if n, err := tr.Lookup(ctx, hs); n != 6 || err != nil {
			t.Errorf("%T: Lookup = %d, %v; want 6", tr.Backend(), n, err)
		}
	}
	if fw.calls != 1 {
		t.Errorf("the forwarding wrapper's Leading ran %d times, want 1", fw.calls)
	}

	// 5 addresses of blocks of 2 keys: 2 whole blocks.
	tr := newTier(t, failingLeader{Backend: plainBackend{e}, held: 5})
	if n, err := tr.Lookup(ctx, hs); n != 2 || !errors.Is(err, ErrUnavailable) {
		t.Errorf("failing Leader: Lookup = %d, %v; want 2, ErrUnavailable", n, err)
	}
	// A count past the addresses asked is clamped to the blocks asked.
	tr = newTier(t, failingLeader{Backend: plainBackend{e}, held: 99})
	if n, _ := tr.Lookup(ctx, hs[:3]); n != 3 {
		t.Errorf("Leader counting 99 of 6 addresses: Lookup = %d, want 3", n)
	}
}
