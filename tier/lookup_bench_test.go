package tier

import (
	"context"
	"fmt"
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

// BenchmarkTierLookupBusy is the embedded store's part of a Lookup
// (Exists of 2048 held keys) while another goroutine stores batches of 64
// values of 16 KiB into the same store without pause, as the publishers
// do: the wait for the store's lock is in its time.
func BenchmarkTierLookupBusy(b *testing.B) {
	const nblocks, span = 64 << 10, 2048
	e, err := NewEmbedded(1 << 30)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	keys := make([]string, nblocks)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/%016x/hidden", i)
	}
	val := make([]byte, 1024)
	for lo := 0; lo < nblocks; lo += 1024 {
		vals := make([][]byte, 1024)
		for i := range vals {
			vals[i] = val
		}
		e.Set(ctx, keys[lo:lo+1024], vals)
	}
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
			e.Set(ctx, bk, big)
		}
	}()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lo := (i * 7919 * span) % (nblocks - span)
		i++
		held, _ := e.Exists(ctx, keys[lo:lo+span])
		if !held[0] || !held[span-1] {
			b.Fatal("a stored key is not held")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*span), "ns/block")
	close(stop)
	<-done
}
