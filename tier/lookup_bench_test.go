package tier

import (
	"context"
	"fmt"
	"testing"
)

// The lookup benchmarks' store: nblocks blocks of one 1 KiB key (the
// replica replay's synthetic trace: 64-byte rows, blocks of 16) held in an
// embedded store of 1 GiB, and their hashes.
func lookupStore(b *testing.B, nblocks int) (*Tier, *Embedded, []uint64) {
	const bs, rowBytes = 16, 64
	ns := Namespace{Model: "bench", BlockSize: bs, Keys: []Key{{Name: "hidden", RowBytes: rowBytes}}}
	e, err := NewEmbedded(1 << 30)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := New(e, ns, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Close() })
	hs := hashes(0, nblocks)
	for lo := 0; lo < nblocks; lo += 1024 {
		vals := make([][]byte, 0, 1024)
		for _, h := range hs[lo : lo+1024] {
			v, rows := tr.NewValue(h, 0)
			for i := range rows {
				rows[i] = byte(h) + byte(i)
			}
			vals = append(vals, v)
		}
		if _, err := tr.PutValues(context.Background(), hs[lo:lo+1024], vals); err != nil {
			b.Fatal(err)
		}
	}
	return tr, e, hs
}

// lookups times Lookups of span held blocks at places spread over hs (cold
// lines, as a scheduler's would be), reporting ns/block per looked-up
// block.
func lookups(b *testing.B, tr *Tier, hs []uint64, span int) {
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lo := (i * 7919 * span) % (len(hs) - span)
		i++
		if n, err := tr.Lookup(ctx, hs[lo:lo+span]); err != nil || n != span {
			b.Fatalf("Lookup = %d, %v; want %d", n, err, span)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*span), "ns/block")
}

// BenchmarkTierLookup is the scheduler's Lookup of a long held prefix (2048
// blocks) on an embedded store holding 256k blocks: the engine goroutine's
// call, run while nothing else uses the store.
func BenchmarkTierLookup(b *testing.B) {
	tr, _, hs := lookupStore(b, 256<<10)
	lookups(b, tr, hs, 2048)
}

// BenchmarkTierLookupBusy is the same Lookup on a store of 64k blocks while
// another goroutine stores batches of 64 values of 16 KiB into the same
// store without pause, as the publishers do: the wait for the store's lock
// is in its time.
func BenchmarkTierLookupBusy(b *testing.B) {
	tr, e, hs := lookupStore(b, 64<<10)
	stop, done := make(chan bool), make(chan bool)
	go func() {
		big := make([][]byte, 64)
		for i := range big {
			big[i] = make([]byte, 16<<10)
		}
		bk := make([]string, 64)
		for n := 0; ; n++ {
			select {
			case <-stop:
				close(done)
				return
			default:
			}
			for i := range bk {
				bk[i] = fmt.Sprintf("busy/%d", (n*64+i)%4096)
			}
			e.Set(context.Background(), bk, big)
		}
	}()
	lookups(b, tr, hs, 2048)
	close(stop)
	<-done
}
