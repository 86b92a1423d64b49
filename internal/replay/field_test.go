package replay

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// smallFieldTable is the embedded field workloads at test size.
const smallFieldTable = `
keys M hidden=64,layer=32
cost M 1e6 1e4 1 1e5
field multi_turn        M conversations=6 turns=3 system=40 message=20 output=12 concurrency=3 seed=1 downstream=1
field long_doc_qa       M docs=3 doc_len=300 repeat=3 question=8 output=4 concurrency=2 seed=2
field prefix_repetition M prefixes=3 prefix_len=64 suffix_len=16 output=6 prompts=24 concurrency=4 seed=3
field tts               M voices=2 voice_len=48 text=16 output=24 prompts=16 concurrency=4 seed=4 downstream=1 keys=codes=16:req:deferred
field preempt_resume    M prompt=64 output=64 prompts=12 kv_blocks=24 concurrency=4 seed=5
field replace           M prompt=48 shared=20 output=16 tail=24 prompts=12 concurrency=4 seed=6
field spec_decode       M prompt=32 output=32 k=3 accept=60 prompts=12 concurrency=4 seed=7
`

// sharing are the field generators whose prompts share prefixes (so the
// automatic pool must hit).
var sharing = map[string]bool{GenMultiTurn: true, GenLongDocQA: true, GenPrefixRepetition: true, GenTTS: true}

// TestFieldWorkloadsVerify: every field generator, at small size, through
// the real cache under --verify, with the automatic pool and with a pool
// so small that it preempts and reuses slots: 0 wrong rows, and the
// workload's sharing hits.
func TestFieldWorkloadsVerify(t *testing.T) {
	ws, err := ParseWorkloads(smallFieldTable)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != len(FieldGenerators()) {
		t.Fatalf("%d workloads, want one per generator %v", len(ws), FieldGenerators())
	}
	for _, w := range ws {
		for _, kv := range []int{0, 40} {
			spec := w.Spec(0)
			rep, err := Replay(spec, Options{Cache: true, Verify: true, KVBlocks: kv, MaxBatchedTokens: 256})
			if err != nil {
				t.Fatalf("%s kv=%d: %v", w.FullName(), kv, err)
			}
			// The tiny pool may evict what a workload shares before its
			// reuse: hits are only required of the automatic pool.
			if rep.VerifiedRows == 0 || rep.VerifyFailures != 0 || rep.VerifyRepeated != 0 || rep.VerifyMissing != 0 ||
				(kv == 0 && sharing[w.Field.Gen] && rep.HitTokens == 0) || rep.TTFTP50 == 0 {
				t.Fatalf("%s kv=%d: %d rows, %d wrong, %d hit tokens, ttft %d", w.FullName(), kv, rep.VerifiedRows,
					rep.VerifyFailures, rep.HitTokens, rep.TTFTP50)
			}
			if (rep.TTFPP50 > 0) != spec.Downstream {
				t.Fatalf("%s: ttfp %d with downstream %v", w.FullName(), rep.TTFPP50, spec.Downstream)
			}
		}
	}
}

// TestFieldEngineFeatures: the preempt_resume, replace and spec_decode
// workloads, small, through the real cache under --verify: 0 wrong,
// repeated and missing rows, and what each exercises happened.
func TestFieldEngineFeatures(t *testing.T) {
	by := smallFieldWorkloads(t)
	tests := []struct {
		name string
		what func(r *Report) (string, bool)
	}{
		{"field/preempt_resume", func(r *Report) (string, bool) {
			return fmt.Sprintf("%d preemptions, %d resumed with a hit", r.Preemptions, r.ResumedHits),
				r.Preemptions > 0 && r.ResumedHits > 0
		}},
		{"field/replace", func(r *Report) (string, bool) {
			return fmt.Sprintf("%d replaced", r.Replaces), r.Replaces > 0
		}},
		{"field/spec_decode", func(r *Report) (string, bool) {
			return fmt.Sprintf("%d drafts, %d rejected", r.SpecDrafts, r.SpecRejected),
				r.SpecRejected > 0 && r.SpecRejected < r.SpecDrafts
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := by[tc.name]
			if !ok {
				t.Fatalf("no workload %s", tc.name)
			}
			for _, mt := range []int{256, 24} { // whole prompts, and chunked
				rep, err := Replay(w.Spec(0), Options{Cache: true, Verify: true, MaxBatchedTokens: mt})
				if err != nil {
					t.Fatalf("batch %d: %v", mt, err)
				}
				what, ok := tc.what(rep)
				if rep.VerifiedRows == 0 || rep.VerifyFailures != 0 || rep.VerifyRepeated != 0 || rep.VerifyMissing != 0 || !ok {
					t.Fatalf("batch %d: %d rows, %d wrong, %d repeated, %d missing; %s", mt, rep.VerifiedRows,
						rep.VerifyFailures, rep.VerifyRepeated, rep.VerifyMissing, what)
				}
				t.Logf("batch %d: %d rows verified; %s", mt, rep.VerifiedRows, what)
			}
		})
	}
}

func TestFieldWorkloadShapes(t *testing.T) {
	by := smallFieldWorkloads(t)
	prompts := func(name string) [][]int32 {
		w := by[name]
		src := w.Spec(0).Source()
		var out [][]int32
		for {
			r, ok, err := src.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if r.OutputLen != w.OutputLen {
				t.Fatalf("%s: output %d, want %d", name, r.OutputLen, w.OutputLen)
			}
			out = append(out, r.Prompt)
		}
		if len(out) != w.Prompts {
			t.Fatalf("%s: %d prompts, want %d", name, len(out), w.Prompts)
		}
		return out
	}
	tests := []struct {
		name  string
		check func(t *testing.T, p [][]int32)
	}{
		{"field/multi_turn", func(t *testing.T, p [][]int32) {
			// Turn t of conversation c (round-robin) extends turn t-1
			// with the 12 tokens the engine samples, then a 20-token
			// message; turn 0 is the 40-token system prompt and a message.
			for i, q := range p {
				if i < 6 {
					if len(q) != 60 || !slices.Equal(q[:40], p[0][:40]) {
						t.Fatalf("turn 0 prompt %d: %d tokens", i, len(q))
					}
					continue
				}
				prev := p[i-6]
				want := sampled(slices.Clone(prev), 12)
				if len(q) != len(prev)+32 || !slices.Equal(q[:len(prev)+12], want) {
					t.Fatalf("prompt %d does not extend prompt %d with the sampled reply", i, i-6)
				}
			}
		}},
		{"field/long_doc_qa", func(t *testing.T, p [][]int32) {
			// Documents tiled: prompt i is document i mod 3 and a
			// distinct question.
			for i, q := range p {
				if len(q) != 308 || !slices.Equal(q[:300], p[i%3][:300]) || (i >= 3 && slices.Equal(q[300:], p[i%3][300:])) {
					t.Fatalf("prompt %d", i)
				}
			}
		}},
		{"field/prefix_repetition", func(t *testing.T, p [][]int32) {
			uses := map[string]int{}
			suffixes := map[string]bool{}
			for _, q := range p {
				uses[tokensKey(q[:64])]++
				suffixes[tokensKey(q[64:])] = true
			}
			if len(uses) != 3 || len(suffixes) != len(p) {
				t.Fatalf("%d prefixes, %d distinct suffixes of %d", len(uses), len(suffixes), len(p))
			}
			for _, n := range uses {
				if n != 8 {
					t.Fatalf("prefix uses %v, want 8 each", uses)
				}
			}
		}},
		{"field/tts", func(t *testing.T, p [][]int32) {
			if ks := FormatWidths(by["field/tts"].Keys); ks != "codes=16:deferred" {
				t.Fatalf("tts keys %s: want only the deferred codes key", ks)
			}
			voices := map[string]bool{}
			for _, q := range p {
				voices[tokensKey(q[:48])] = true
			}
			if len(voices) != 2 {
				t.Fatalf("%d voices", len(voices))
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, prompts(tc.name)) })
	}
}

func tokensKey(t []int32) string {
	var b strings.Builder
	for _, x := range t {
		b.WriteString(string(rune(x%50000 + 256)))
	}
	return b.String()
}

func TestParseFieldErrors(t *testing.T) {
	tests := []struct {
		line, want string
	}{
		{"field x M", "unknown field generator"},
		{"field tts M voices=0", "voices must be > 0"},
		{"field tts M voices=-1", "want a count >= 0"},
		{"field tts M voices", "want name=value"},
		{"field tts M prefixes=2", "unknown parameter"},
		{"field tts M voices=2 voices=3", "given twice"},
		{"field tts M downstream=2", "downstream is 0 or 1"},
		{"field tts M keys=a", "want name=bytes"},
		{"field tts", "want `field name model"},
		{"field tts M voice_len=20000000", "too large"},
		{"field tts M\nfield tts M", "two workloads named field/tts"},
		{"field spec_decode M accept=101", "accept is a percentage"},
		{"field replace M prompt=8 shared=8", "shared must be < prompt"},
	}
	for _, tc := range tests {
		_, err := ParseWorkloads("keys M h=8\n" + tc.line)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.line, err, tc.want)
		}
	}
}

// smallFieldWorkloads parses smallFieldTable into workloads by full name.
func smallFieldWorkloads(t *testing.T) map[string]Workload {
	t.Helper()
	ws, err := ParseWorkloads(smallFieldTable)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]Workload{}
	for _, w := range ws {
		by[w.FullName()] = w
	}
	return by
}
