package soa

import (
	"math/rand/v2"
	"testing"
)

// benchSlots returns n distinct random slots of numSlots.
func benchSlots(n, numSlots int) []int32 {
	rng := rand.New(rand.NewPCG(3, 4))
	slots := make([]int32, n)
	for i, p := range rng.Perm(numSlots)[:n] {
		slots[i] = int32(p)
	}
	return slots
}

// BenchmarkOccupancy: one op handles 1024 random distinct slots of a
// 1M-slot table (claim and commit: one call; load: 1024 Load calls).
// ns/slot is the timed duration over slots (commit's off-the-clock claims
// are not in it).
func BenchmarkOccupancy(b *testing.B) {
	const numSlots, n = 1 << 20, 1024
	o := must(NewOccupancy(numSlots))
	slots := benchSlots(n, numSlots)
	b.Run("op=claim/slots=1024", func(b *testing.B) {
		b.ReportAllocs()
		owner := uint64(0)
		for b.Loop() {
			owner++
			o.Claim(slots, owner, 0)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/slot")
	})
	b.Run("op=commit/slots=1024", func(b *testing.B) {
		b.ReportAllocs()
		// Every commit flips all its slots: sets of disjoint slots are
		// claimed, each by its own owner, off the clock, sets at a time.
		const sets = 256
		perm := rand.New(rand.NewPCG(8, 9)).Perm(numSlots)
		var set [sets][]int32
		var owners [sets]uint64
		for k := range set {
			set[k] = make([]int32, n)
			for i := range n {
				set[k][i] = int32(perm[k*n+i])
			}
		}
		owner := uint64(1 << 40)
		i := 0
		for b.Loop() {
			k := i % sets
			if k == 0 {
				b.StopTimer()
				for k := range set {
					owner++
					owners[k] = owner
					o.Claim(set[k], owner, 0)
				}
				b.StartTimer()
			}
			if o.Commit(set[k], owners[k]) != n {
				b.Fatal("commit did not flip every slot")
			}
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/slot")
	})
	b.Run("op=load/slots=1024", func(b *testing.B) {
		b.ReportAllocs()
		var sum uint64
		for b.Loop() {
			for _, s := range slots {
				st, owner := o.Load(s)
				sum += uint64(st) + owner
			}
		}
		sink = sum
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/slot")
	})
}

var sink uint64

// BenchmarkRequests: add-remove is one Add of a new id with an 8-block hit
// plus one Remove of a random live request, around 64 live requests;
// lookup is one Lookup of a live id.
func BenchmarkRequests(b *testing.B) {
	const live = 64
	blocks := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	tab := NewRequests(live)
	var hs [live]Handle
	for i := range live {
		hs[i], _ = tab.Add(int64(i), 128, blocks)
	}
	b.Run("op=add-remove", func(b *testing.B) {
		b.ReportAllocs()
		rng := rand.New(rand.NewPCG(5, 6))
		next := int64(live)
		for b.Loop() {
			i := rng.IntN(live)
			tab.Remove(hs[i])
			hs[i], _ = tab.Add(next, 128, blocks)
			next++
		}
	})
	b.Run("op=lookup", func(b *testing.B) {
		b.ReportAllocs()
		ids := tab.ID
		var sum Handle
		i := 0
		for b.Loop() {
			h, _ := tab.Lookup(ids[i&(live-1)])
			sum += h
			i++
		}
		sink = uint64(sum)
	})
}
