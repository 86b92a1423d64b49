package tier

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkPolicy compares the embedded store's eviction policies at
// equal bytes on synthetic tier traces, a tier-level stand-in for the
// replay's multi-turn and long-document workloads: each request is a
// chain of block hashes; the tier serves its leading held blocks (Exists,
// then Get, as Lookup and an import) and stores the rest (as the
// publishers). hit% is blocks served over blocks asked; ns/op is one
// request. The workloads (seeded, deterministic):
//
//	multi_turn  400 sessions, each turn re-sends its history (every
//	            earlier turn's blocks) and adds 2-6 blocks; sessions
//	            interleave at random, 40% end after any turn and a new
//	            one starts
//	long_doc    20 long documents (32-96 blocks) each asked again and
//	            again with a short question (1-2 blocks), among one-off
//	            documents (half the requests)
//	mixed       both, interleaved, plus one-off prompts
func BenchmarkPolicy(b *testing.B) {
	const val = 2048 // bytes a value
	for _, w := range []string{"multi_turn", "long_doc", "mixed"} {
		for _, mib := range []int{4, 16} {
			for _, pol := range []Policy{PolicyLRU, PolicyS3FIFO} {
				b.Run(fmt.Sprintf("workload=%s/mib=%d/policy=%s", w, mib, pol), func(b *testing.B) {
					e, _ := NewEmbeddedPolicy(int64(mib)<<20, pol)
					defer e.Close()
					gen := newTraceGen(w, 1)
					v := make([]byte, val)
					var asked, served int64
					ctx := context.Background()
					for i := 0; i < b.N; i++ {
						req := gen.next()
						keys := make([]string, len(req))
						for j, h := range req {
							keys[j] = fmt.Sprintf("oc:{m/b16/%016x}:hidden", h)
						}
						held, _ := e.Exists(ctx, keys)
						n := 0
						for n < len(held) && held[n] {
							n++
						}
						if n > 0 {
							vals, _ := e.Get(ctx, keys[:n])
							for n2, x := range vals {
								if x == nil {
									n = n2
									break
								}
							}
						}
						asked += int64(len(req))
						served += int64(n)
						if n < len(keys) {
							vs := make([][]byte, len(keys)-n)
							for j := range vs {
								vs[j] = v
							}
							e.Set(ctx, keys[n:], vs)
						}
					}
					b.ReportMetric(100*float64(served)/float64(max(asked, 1)), "hit%")
				})
			}
		}
	}
}

// traceGen makes the requests of one synthetic workload.
type traceGen struct {
	kind     string
	rng      *rand.Rand
	next64   uint64
	sessions [][]uint64 // multi_turn: each session's blocks so far
	docs     [][]uint64 // long_doc: the documents asked again
	turn     int
}

func newTraceGen(kind string, seed uint64) *traceGen {
	g := &traceGen{kind: kind, rng: rand.New(rand.NewPCG(seed, 7))}
	for i := 0; i < 400; i++ {
		g.sessions = append(g.sessions, nil)
	}
	for i := 0; i < 20; i++ {
		g.docs = append(g.docs, g.fresh(32+g.rng.IntN(65)))
	}
	return g
}

// fresh is n blocks never seen before.
func (g *traceGen) fresh(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		g.next64++
		out[i] = g.next64 * 0x9e3779b97f4a7c15
	}
	return out
}

func (g *traceGen) next() []uint64 {
	g.turn++
	kind := g.kind
	if kind == "mixed" {
		kind = []string{"multi_turn", "long_doc", "oneoff"}[g.turn%3]
	}
	switch kind {
	case "multi_turn":
		i := g.rng.IntN(len(g.sessions))
		if g.rng.IntN(10) < 4 {
			g.sessions[i] = nil // the session ended; a new one takes its place
		}
		g.sessions[i] = append(g.sessions[i], g.fresh(2+g.rng.IntN(5))...)
		return append([]uint64(nil), g.sessions[i]...)
	case "long_doc":
		if g.rng.IntN(2) == 0 {
			return g.fresh(32 + g.rng.IntN(65)) // a one-off document
		}
		d := g.docs[g.rng.IntN(len(g.docs))]
		return append(append([]uint64(nil), d...), g.fresh(1+g.rng.IntN(2))...)
	default:
		return g.fresh(8 + g.rng.IntN(57))
	}
}
