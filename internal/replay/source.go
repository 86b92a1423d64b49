package replay

import (
	"math/rand/v2"

	"github.com/omnicache/omnicache/internal/replay/sim"
)

// Vocab is the vocabulary prompt tokens are drawn from (Qwen's).
const Vocab = 151936

// RandomSource generates a workload's prompts with vLLM random-dataset
// semantics: every prompt is the workload's shared prefix followed by random
// tokens; input and output lengths are uniform in [len*(1-ratio),
// len*(1+ratio)]. Prompt i depends only on (seed, the workload's shape, i):
// the seed is the reference's dataset seed, so two rows with the same seed
// and shape (as the reference's DECV_c32 rows) get the same prompts.
type RandomSource struct {
	w      Workload
	seed   uint64
	prefix []int32
	i      int
}

// NewRandomSource returns the prompts of w for seed.
func NewRandomSource(w Workload, seed uint64) *RandomSource {
	s := &RandomSource{w: w, seed: seed}
	rng := rand.New(rand.NewPCG(s.seed, 0))
	s.prefix = make([]int32, w.SharedPrefix)
	for i := range s.prefix {
		s.prefix[i] = rng.Int32N(Vocab)
	}
	return s
}

// Next implements sim.Source.
func (s *RandomSource) Next() (sim.Request, bool, error) {
	if s.i >= s.w.Prompts {
		return sim.Request{}, false, nil
	}
	s.i++
	rng := rand.New(rand.NewPCG(s.seed, uint64(s.i)))
	in := 0
	if s.w.InputLen > 0 {
		lo, hi := lengthRange(s.w.InputLen, s.w.RangeRatio)
		in = lo + rng.IntN(hi-lo+1)
	}
	lo, hi := lengthRange(s.w.OutputLen, s.w.RangeRatio)
	out := lo + rng.IntN(hi-lo+1)
	p := make([]int32, len(s.prefix)+in, len(s.prefix)+in+out)
	copy(p, s.prefix)
	for j := len(s.prefix); j < len(p); j++ {
		p[j] = rng.Int32N(Vocab)
	}
	return sim.Request{Prompt: p, OutputLen: out}, true, nil
}

// TraceBlockTokens is the number of tokens a trace hash id names.
const TraceBlockTokens = 512

// TraceToken is the synthesized token at position p of a trace request:
// a function of (hash_ids[p/512], p%512) only, so equal hash ids give equal
// tokens. Positions past the hash ids (records made in code: CheckTrace
// refuses a trace that names fewer blocks than its prompt has) take tokens
// unique to the request.
func TraceToken(hashIDs []int64, req int, p int) int32 {
	var x uint64
	if b := p / TraceBlockTokens; b < len(hashIDs) {
		x = uint64(hashIDs[b])*TraceBlockTokens + uint64(p%TraceBlockTokens)
	} else {
		x = ^(uint64(req)<<32 | uint64(p))
	}
	return int32(sim.SplitMix64(x) % Vocab)
}

// TraceSource replays trace records in file order.
type TraceSource struct {
	recs []TraceRecord
	i    int
}

// NewTraceSource returns a source over recs.
func NewTraceSource(recs []TraceRecord) *TraceSource { return &TraceSource{recs: recs} }

// Next implements sim.Source.
func (s *TraceSource) Next() (sim.Request, bool, error) {
	if s.i >= len(s.recs) {
		return sim.Request{}, false, nil
	}
	r := &s.recs[s.i]
	p := make([]int32, r.InputLength, r.InputLength+r.OutputLength)
	for j := range p {
		p[j] = TraceToken(r.HashIDs, s.i, j)
	}
	s.i++
	return sim.Request{Prompt: p, OutputLen: r.OutputLength}, true, nil
}
