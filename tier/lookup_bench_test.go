package tier

import (
	"context"
	"testing"
)

// BenchmarkTierLookup is the scheduler's Lookup of a long held prefix on an
// embedded store holding 256k blocks of one 1 KiB key (the replica replay's
// synthetic trace: 64-byte rows, blocks of 16): the engine goroutine's call,
// run while nothing else uses the store. ns/block is per looked-up block.
func BenchmarkTierLookup(b *testing.B) {
	const nblocks, bs, rowBytes, span = 256 << 10, 16, 64, 2048
	ns := Namespace{Model: "bench", BlockSize: bs, Keys: []Key{{Name: "hidden", RowBytes: rowBytes}}}
	e, err := NewEmbedded(1 << 30)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := New(e, ns, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
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
		if _, err := tr.PutValues(ctx, hs[lo:lo+1024], vals); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lo := (i * 7919 * span) % (nblocks - span) // spread over the store: cold lines, as a scheduler's would be
		i++
		if n, err := tr.Lookup(ctx, hs[lo:lo+span]); err != nil || n != span {
			b.Fatalf("Lookup = %d, %v; want %d", n, err, span)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*span), "ns/block")
}
