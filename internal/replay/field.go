// The field's workloads: the shapes engine teams benchmark prefix caches
// with, generated from parameters (`field` lines of the workload table).

package replay

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
)

// FieldModel is the model part of a field workload's name: "field/NAME".
const FieldModel = "field"

// The field workloads' generators.
const (
	GenMultiTurn        = "multi_turn"
	GenLongDocQA        = "long_doc_qa"
	GenPrefixRepetition = "prefix_repetition"
	GenTTS              = "tts"
	GenPreemptResume    = "preempt_resume"
	GenReplace          = "replace"
	GenSpecDecode       = "spec_decode"
)

// Field is what generates a field workload's requests: a generator and its
// integer parameters (see fieldParams for each generator's, with their
// defaults).
type Field struct {
	Gen    string
	Params map[string]int
	// Downstream: a next stage consumes the rows (time to first packet).
	Downstream bool
}

// fieldParams are each generator's parameters and defaults. Every
// generator also takes concurrency, seed and downstream (0 or 1), and the
// table line may give keys=... (the model's keys otherwise).
var fieldParams = map[string]map[string]int{
	// Conversations of turns: turn t's prompt is turn t-1's prompt, the
	// reply the engine sampled for it, and a new user message. All
	// conversations share a system prompt. Turns go round-robin over the
	// conversations.
	GenMultiTurn: {"conversations": 16, "turns": 4, "system": 256, "message": 64, "output": 64},
	// Long shared documents with short distinct questions: prompt i is
	// document i mod docs (tiled: every document once, then again, repeat
	// times) followed by its question. The first round misses, the others
	// hit.
	GenLongDocQA: {"docs": 4, "doc_len": 10000, "repeat": 3, "question": 32, "output": 16},
	// vLLM's prefix_repetition dataset: prefixes prefixes of prefix_len
	// random tokens, prompts/prefixes requests each with a distinct random
	// suffix_len suffix, shuffled.
	GenPrefixRepetition: {"prefixes": 8, "prefix_len": 512, "suffix_len": 128, "output": 32, "prompts": 128},
	// Text to speech: a voice prompt of voice_len tokens (one of voices)
	// and a distinct text, then output audio-code tokens; the hidden state
	// is not cached, only the deferred audio-codes key.
	GenTTS: {"voices": 4, "voice_len": 512, "text": 64, "output": 128, "prompts": 64},
	// Preemption under KV pressure: random prompts in a pool of kv_blocks
	// blocks, too few for the requests admitted to grow, so the engine
	// preempts (recompute) and resumes them, often with a hit on their
	// own blocks still cached.
	GenPreemptResume: {"prompt": 256, "output": 256, "prompts": 32, "kv_blocks": 120},
	// Streaming input: every request's tokens from a position p on
	// (uniform in [1, prompt+output/2)) are replaced by tail new tokens
	// once it has computed a later position, within its prompt or its
	// output; it then generates output tokens after them.
	// All prompts start with the same shared tokens (0: none), so
	// requests arrive with a hit that a replacement may cut.
	GenReplace: {"prompt": 128, "shared": 64, "output": 32, "tail": 48, "prompts": 32},
	// Speculative decoding: each decode schedules the next token and k
	// draft tokens, each the true next token with accept percent
	// probability; drafts are accepted up to the first wrong one.
	GenSpecDecode: {"prompt": 64, "output": 64, "k": 3, "accept": 70, "prompts": 32},
}

// parseField reads `field name model param=value ... [keys=k=bytes,...]`.
// The generator is the name's (name, or gen=GEN for another name).
func parseField(f []string, keys map[string][]omnicache.Key) (Workload, error) {
	if len(f) < 3 {
		return Workload{}, fmt.Errorf("want `field name model param=value ...`")
	}
	w := Workload{Model: f[2], Name: f[1]}
	fd := &Field{Gen: f[1], Params: map[string]int{}}
	for _, kv := range f[3:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return w, fmt.Errorf("bad parameter %q: want name=value", kv)
		}
		switch k {
		case "gen":
			fd.Gen = v
			continue
		case "keys":
			ks, err := ParseWidths(v)
			if err != nil {
				return w, err
			}
			keys[w.FullNameOf(fd)] = ks
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return w, fmt.Errorf("bad parameter %q: want a count >= 0", kv)
		}
		if _, dup := fd.Params[k]; dup {
			return w, fmt.Errorf("parameter %q given twice", k)
		}
		fd.Params[k] = n
	}
	defs, ok := fieldParams[fd.Gen]
	if !ok {
		return w, fmt.Errorf("unknown field generator %q (want %s)", fd.Gen, strings.Join(FieldGenerators(), ", "))
	}
	for k := range fd.Params {
		if _, ok := defs[k]; !ok && k != "concurrency" && k != "seed" && k != "downstream" {
			return w, fmt.Errorf("%s: unknown parameter %q", fd.Gen, k)
		}
	}
	for k, v := range defs {
		if _, ok := fd.Params[k]; !ok {
			fd.Params[k] = v
		}
	}
	p := fd.Params
	if _, ok := p["concurrency"]; !ok {
		p["concurrency"] = 16
	}
	for k, v := range p {
		if v == 0 && k != "seed" && k != "downstream" && k != "system" && k != "accept" && k != "shared" {
			return w, fmt.Errorf("%s: %s must be > 0", fd.Gen, k)
		}
		if v > 1<<24 {
			return w, fmt.Errorf("%s: %s %d is too large", fd.Gen, k, v)
		}
	}
	if p["downstream"] > 1 {
		return w, fmt.Errorf("%s: downstream is 0 or 1", fd.Gen)
	}
	if fd.Gen == GenSpecDecode && p["accept"] > 100 {
		return w, fmt.Errorf("%s: accept is a percentage", fd.Gen)
	}
	if fd.Gen == GenReplace && (p["shared"] >= p["prompt"] || p["output"] < 2) {
		return w, fmt.Errorf("%s: shared must be < prompt and output >= 2", fd.Gen)
	}
	fd.Downstream = p["downstream"] == 1
	w.Field = fd
	w.Concurrency = p["concurrency"]
	w.Seed = uint64(p["seed"])
	switch fd.Gen {
	case GenMultiTurn:
		w.Prompts = p["conversations"] * p["turns"]
		w.OutputLen = p["output"]
	case GenLongDocQA:
		w.Prompts = p["docs"] * p["repeat"]
		w.OutputLen = p["output"]
	case GenPrefixRepetition, GenTTS, GenPreemptResume, GenReplace, GenSpecDecode:
		w.Prompts = p["prompts"]
		w.OutputLen = p["output"]
	}
	if w.MaxModelLen() > 1<<24 {
		return w, fmt.Errorf("%s: requests of %d tokens are too long", fd.Gen, w.MaxModelLen())
	}
	return w, nil
}

// FieldGenerators names the field generators.
func FieldGenerators() []string {
	var g []string
	for k := range fieldParams {
		g = append(g, k)
	}
	sort.Strings(g)
	return g
}

// FullNameOf is the name a workload would have with field fd.
func (w Workload) FullNameOf(fd *Field) string {
	if fd != nil {
		return FieldModel + "/" + w.Name
	}
	return w.Model + "/" + w.Name
}

// fieldMaxModelLen is the longest request of a field workload.
func (f *Field) maxModelLen() int {
	p := f.Params
	switch f.Gen {
	case GenMultiTurn:
		t := p["turns"]
		return p["system"] + t*p["message"] + t*p["output"]
	case GenLongDocQA:
		return p["doc_len"] + p["question"] + p["output"]
	case GenPrefixRepetition:
		return p["prefix_len"] + p["suffix_len"] + p["output"]
	case GenTTS:
		return p["voice_len"] + p["text"] + p["output"]
	case GenPreemptResume, GenSpecDecode:
		return p["prompt"] + p["output"]
	case GenReplace:
		// Replaced from at most prompt+output/2: then tail and output.
		return p["prompt"] + p["output"] + p["tail"] + p["output"]
	}
	return 0
}

// kvBlocks is the KV pool a field workload asks for in blocks (0: none).
func (f *Field) kvBlocks() int { return f.Params["kv_blocks"] }

// tune adjusts the simulated engine for a field workload.
func (f *Field) tune(seed uint64) func(*sim.Config) {
	if f.Gen != GenSpecDecode {
		return nil
	}
	k, accept := f.Params["k"], f.Params["accept"]
	return func(c *sim.Config) {
		c.SpecTokens, c.SpecAcceptPct, c.SpecSeed = k, accept, seed
	}
}

// kvTokens is the KV pool a field workload needs to keep what it shares
// (0: the automatic pool): every conversation, or every document, and the
// requests in flight, each a block more than its longest request.
func (f *Field) kvTokens(maxLen, concurrency int) int {
	per := maxLen + DefaultBlockSize
	switch f.Gen {
	case GenMultiTurn:
		return (f.Params["conversations"] + concurrency) * per
	case GenLongDocQA:
		return (f.Params["docs"] + concurrency) * per
	}
	return 0
}

// fieldSource generates a field workload's prompts, all of them up front
// (the workloads are small), capped at the workload's Prompts.
type fieldSource struct {
	reqs []sim.Request
	i    int
}

func (s *fieldSource) Next() (sim.Request, bool, error) {
	if s.i >= len(s.reqs) {
		return sim.Request{}, false, nil
	}
	s.i++
	return s.reqs[s.i-1], true, nil
}

// randomTokens are n tokens of rng.
func randomTokens(rng *rand.Rand, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = rng.Int32N(Vocab)
	}
	return t
}

// sampled extends prompt with the n tokens the simulated engine samples
// after it (sim: token p is SplitMix64(H[p-1]) mod the vocabulary).
func sampled(prompt []int32, n int) []int32 {
	h := sim.RootHash
	for _, t := range prompt {
		h = sim.Mix(h, t)
	}
	out := slices.Clip(prompt)
	for range n {
		t := int32(sim.SplitMix64(h) % Vocab)
		out = append(out, t)
		h = sim.Mix(h, t)
	}
	return out
}

// newFieldSource generates w's requests for seed.
func newFieldSource(w Workload, seed uint64) *fieldSource {
	f := w.Field
	p := f.Params
	rng := rand.New(rand.NewPCG(seed, 0x6669656c64)) // "field"
	var reqs []sim.Request
	switch f.Gen {
	case GenMultiTurn:
		system := randomTokens(rng, p["system"])
		conv := make([][]int32, p["conversations"])
		for t := range p["turns"] {
			for c := range conv {
				if t == 0 {
					conv[c] = slices.Clone(system)
				} else {
					conv[c] = sampled(conv[c], p["output"])
				}
				conv[c] = append(slices.Clip(conv[c]), randomTokens(rng, p["message"])...)
				reqs = append(reqs, sim.Request{Prompt: conv[c], OutputLen: p["output"]})
			}
		}
	case GenLongDocQA:
		docs := make([][]int32, p["docs"])
		for i := range docs {
			docs[i] = randomTokens(rng, p["doc_len"])
		}
		for i := range p["docs"] * p["repeat"] {
			q := append(slices.Clone(docs[i%len(docs)]), randomTokens(rng, p["question"])...)
			reqs = append(reqs, sim.Request{Prompt: q, OutputLen: p["output"]})
		}
	case GenPrefixRepetition, GenTTS:
		n, plen, slen := p["prefixes"], p["prefix_len"], p["suffix_len"]
		if f.Gen == GenTTS {
			n, plen, slen = p["voices"], p["voice_len"], p["text"]
		}
		prefixes := make([][]int32, n)
		for i := range prefixes {
			prefixes[i] = randomTokens(rng, plen)
		}
		for i := range p["prompts"] {
			q := append(slices.Clone(prefixes[i*n/p["prompts"]]), randomTokens(rng, slen)...)
			reqs = append(reqs, sim.Request{Prompt: q, OutputLen: p["output"]})
		}
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	case GenPreemptResume, GenSpecDecode:
		for range p["prompts"] {
			reqs = append(reqs, sim.Request{Prompt: randomTokens(rng, p["prompt"]), OutputLen: p["output"]})
		}
	case GenReplace:
		plen, out := p["prompt"], p["output"]
		shared := randomTokens(rng, p["shared"])
		for range p["prompts"] {
			from := 1 + rng.IntN(plen+out/2-1)
			// Replaced once it computed a later position, while it
			// still runs (it computes up to plen+out-2 before its last
			// token).
			at := from + rng.IntN(plen+out-1-from)
			prompt := append(slices.Clone(shared), randomTokens(rng, plen-len(shared))...)
			reqs = append(reqs, sim.Request{Prompt: prompt, OutputLen: out,
				Replace: &sim.Replace{At: at, From: from, Tokens: randomTokens(rng, p["tail"])}})
		}
	}
	if len(reqs) > w.Prompts {
		reqs = reqs[:w.Prompts]
	}
	return &fieldSource{reqs: reqs}
}
