package replay

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
)

const tracePath = "../../bench/testdata/mooncake/synthetic_trace.jsonl"

// raceEnabled is set under -race, where the whole-trace replay is too slow.
var raceEnabled bool

func fakeWith(setup func(*fakeCache)) func(omnicache.Config) (Cache, error) {
	return func(cfg omnicache.Config) (Cache, error) {
		f, err := newFakeCache(cfg)
		if err == nil && setup != nil {
			setup(f)
		}
		return f, err
	}
}

// small is a quick workload with a shared prefix (hits), chunked prefill and
// decode.
func small() Workload {
	return Workload{Model: "test", Name: "P96_h50_c4", SharedPrefix: 48, InputLen: 48, OutputLen: 20,
		RangeRatio: 0.5, Concurrency: 4, Prompts: 24, Ref: Reference{ReqPerSecOff: 10},
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: 24}, {Name: "extra", RowBytes: 13, Optional: true}}}
}

func TestDefaultTable(t *testing.T) {
	ws := DefaultWorkloads()
	byName := map[string]Workload{}
	fields := 0
	for _, w := range ws {
		byName[w.FullName()] = w
		if w.Field != nil {
			fields++
			if w.Ref.ReqPerSecOff != 0 || w.Scaled(0.125).Prompts != w.Prompts || !strings.HasPrefix(w.FullName(), "field/") {
				t.Errorf("field workload %s: %+v", w.FullName(), w)
			}
		}
	}
	if len(ws)-fields != 19 || fields != len(FieldGenerators()) {
		t.Fatalf("%d reference and %d field workloads, want 19 and %d", len(ws)-fields, fields, len(FieldGenerators()))
	}
	q := byName["Qwen3-Omni/DECV_c64"]
	if q.InputLen != 100 || q.OutputLen != 100 || q.RangeRatio != 0.5 || q.Concurrency != 64 || q.Prompts != 512 || q.Ref.ReqPerSecOff != 22.41 {
		t.Fatalf("Qwen3-Omni/DECV_c64: %+v", q)
	}
	if got := FormatWidths(q.Keys); got != "hidden=4096,layer_a=4096:opt,layer_b=4096:opt" {
		t.Fatalf("Qwen keys %s", got)
	}
	m := byName["MiniCPM-o/P16384_h0_c64"]
	if m.InputLen != 16384 || m.OutputLen != 8 || m.Concurrency != 64 || m.Prompts != 128 || m.Seed != 50107 || m.Ref.ReqPerSecOff != 0.44 {
		t.Fatalf("MiniCPM-o/P16384_h0_c64: %+v", m)
	}
	if got := FormatWidths(m.Keys); got != "hidden=8192" {
		t.Fatalf("MiniCPM keys %s", got)
	}
	if h := byName["Qwen3-Omni/P1024_h50_c64"]; h.SharedPrefix != 512 || h.InputLen != 512 || h.Seed != 50009 ||
		h.Ref != (Reference{Hit: "49.4", ReqPerSecOff: 19.44, Before: 0.688, After: 0.765, AfterLo: 0.757, AfterHi: 0.772}) {
		t.Fatalf("h50 row %+v", h)
	}
	// The reference measurement's prompt counts and seeds, row by row.
	want := map[string][2]int{
		"Qwen3-Omni/P1024_h0_c8": {256, 50003}, "Qwen3-Omni/P4096_h0_c1": {64, 50014}, "Qwen3-Omni/DEC100_c32": {256, 50059},
		"Qwen3-Omni/DEC100_c64": {512, 50060}, "Qwen3-Omni/DECV_c32": {256, 50063}, "Qwen3-Omni/DECV_c64": {512, 50064},
		"MiniCPM-o/P256_h0_c32": {512, 50063}, "MiniCPM-o/P1024_h0_c32": {256, 50070}, "MiniCPM-o/P1024_h0_c64": {256, 50071},
		"MiniCPM-o/P4096_h0_c32": {128, 50088}, "MiniCPM-o/P4096_h0_c64": {256, 50089}, "MiniCPM-o/P8192_h0_c32": {128, 50099},
		"MiniCPM-o/P16384_h0_c32": {64, 50106}, "MiniCPM-o/DEC100_c32": {256, 50129}, "MiniCPM-o/DEC100_c64": {512, 50130},
		"MiniCPM-o/DECV_c32": {256, 50063}, "MiniCPM-o/DECV_c64": {512, 50064},
	}
	for name, pw := range want {
		if w := byName[name]; w.Prompts != pw[0] || w.Seed != uint64(pw[1]) {
			t.Errorf("%s: %d prompts seed %d, want %d seed %d", name, w.Prompts, w.Seed, pw[0], pw[1])
		}
	}
	for _, w := range ws {
		if w.Cost.Model != w.Model || w.Cost.IsZero() {
			t.Errorf("%s: no step cost", w.FullName())
		}
	}
	if got := byName["Qwen3-Omni/P1024_h0_c8"].Scaled(0.125).Prompts; got != 32 {
		t.Fatalf("scaled prompts %d, want 32", got)
	}
	if got := byName["Qwen3-Omni/DEC100_c64"].Scaled(0.125).Prompts; got != 128 {
		t.Fatalf("scaled prompts %d, want 2*concurrency", got)
	}
	if _, err := ParseWidths("a=1,a=2"); err == nil {
		t.Fatal("duplicate key accepted")
	}
	k, err := ParseWidths("h=64,x=8:req:deferred,y=4")
	if err != nil || k[0].Optional || k[1].Optional || !k[1].Deferred || !k[2].Optional {
		t.Fatalf("ParseWidths: %+v %v", k, err)
	}
}

func TestRandomSourceLengths(t *testing.T) {
	w := small()
	src := NewRandomSource(w, 1)
	var first []int32
	n := 0
	for {
		r, ok, err := src.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		n++
		in := len(r.Prompt) - w.SharedPrefix
		if in < 24 || in > 72 || r.OutputLen < 10 || r.OutputLen > 30 {
			t.Fatalf("lengths %d/%d outside the range", in, r.OutputLen)
		}
		if first == nil {
			first = r.Prompt
		} else if !reflect.DeepEqual(first[:48], r.Prompt[:48]) {
			t.Fatal("shared prefix differs")
		}
	}
	if n != w.Prompts {
		t.Fatalf("%d prompts", n)
	}
}

func TestReplayCacheOffMakesNoCall(t *testing.T) {
	rep, err := Replay(small().Spec(1), Options{NewCache: func(omnicache.Config) (Cache, error) {
		t.Fatal("cache created with the cache off")
		return nil, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cache != "off" || rep.ProjectedChange != 0 || rep.EngineNsTotal != 0 || rep.Steps == 0 {
		t.Fatalf("%+v", rep)
	}
	// Cache off is the reference's enable_prefix_caching: false: nothing
	// hits and every prompt token is computed.
	var all int64
	src := NewRandomSource(small(), 1)
	for {
		r, ok, _ := src.Next()
		if !ok {
			break
		}
		all += int64(len(r.Prompt) + r.OutputLen - 1) // the last sampled token is never computed
	}
	if rep.HitTokens != 0 || rep.ComputedTokens != all {
		t.Fatalf("cache off: %d hit tokens, %d computed, want 0 and %d", rep.HitTokens, rep.ComputedTokens, all)
	}
	on, err := Replay(small().Spec(1), Options{Cache: true, NewCache: fakeWith(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if on.HitRate <= 0.2 || on.ComputedTokens != all-on.HitTokens {
		t.Fatalf("cache on: hit rate %.2f with a half shared prefix, %d computed tokens, %d hit, want %d in all",
			on.HitRate, on.ComputedTokens, on.HitTokens, all)
	}
}

func TestReplayVerifyFake(t *testing.T) {
	for _, owned := range []bool{true, false} {
		for _, kv := range []int{0, 16} { // auto, and a small pool that preempts and reuses slots
			rep, err := Replay(small().Spec(3), Options{Cache: true, Verify: true, NotOwned: !owned,
				KVBlocks: kv, MaxBatchedTokens: 128, NewCache: fakeWith(nil), KeepSamples: true})
			if err != nil {
				t.Fatalf("owned=%v kv=%d: %v", owned, kv, err)
			}
			if rep.VerifiedRows == 0 || rep.VerifyFailures != 0 || rep.Materialized != rep.Steps {
				t.Fatalf("owned=%v kv=%d: %+v", owned, kv, rep)
			}
			if rep.HitRate == 0 || rep.FirstRequestNs <= 0 || rep.ProjectedChange == 0 || len(rep.Samples) != rep.Steps {
				t.Fatalf("owned=%v kv=%d: hit rate %.2f, first request %d ns, change %f, %d samples of %d steps",
					owned, kv, rep.HitRate, rep.FirstRequestNs, rep.ProjectedChange, len(rep.Samples), rep.Steps)
			}
			if kv > 0 && rep.Preemptions == 0 {
				t.Fatalf("no preemption with a 16-block pool")
			}
		}
	}
}

func TestReplayVerifyCatchesFaults(t *testing.T) {
	faults := map[string]func(*fakeCache){
		"corrupt row":     func(f *fakeCache) { f.corruptStep = 5 },
		"mirror not kept": func(f *fakeCache) { f.skipMirror = true },
		"wrong hit block": func(f *fakeCache) { f.shiftHits = true },
	}
	for name, setup := range faults {
		_, err := Replay(small().Spec(3), Options{Cache: true, Verify: true, KVBlocks: 24,
			MaxBatchedTokens: 128, NewCache: fakeWith(setup)})
		if !errors.Is(err, ErrVerify) {
			t.Errorf("%s: err %v, want a verification failure", name, err)
		}
	}
}

func TestReplayDiscardsWithoutHits(t *testing.T) {
	w := small()
	w.SharedPrefix = 0
	rep, err := Replay(w.Spec(1), Options{Cache: true, NewCache: fakeWith(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.HitTokens != 0 || rep.Materialized != 0 || rep.Discarded != rep.Steps {
		t.Fatalf("%+v", rep)
	}
}

func TestTraceParsersAgree(t *testing.T) {
	data, err := os.ReadFile(tracePath)
	if err != nil {
		t.Fatal(err)
	}
	std, err := ParseTrace(data, ParserStd, 200)
	if err != nil {
		t.Fatal(err)
	}
	if len(std) != 200 || len(std[0].HashIDs) == 0 {
		t.Fatalf("%d records", len(std))
	}
	if p, _ := ResolveParser(ParserAuto); p != ParserSIMD {
		t.Skip("simdjson-go unsupported on this CPU")
	}
	simd, err := ParseTrace(data, ParserSIMD, 200)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(std, simd) {
		t.Fatal("parsers disagree")
	}
	// And the requests built from them.
	a, b := NewTraceSource(std), NewTraceSource(simd)
	for {
		ra, oka, _ := a.Next()
		rb, okb, _ := b.Next()
		if oka != okb || !reflect.DeepEqual(ra, rb) {
			t.Fatal("requests differ")
		}
		if !oka {
			break
		}
	}
}

func TestTraceTokensFollowHashIDs(t *testing.T) {
	ids := []int64{7, 9}
	if TraceToken(ids, 0, 5) != TraceToken([]int64{7, 3}, 1, 5) {
		t.Fatal("equal hash id, different token")
	}
	if TraceToken(ids, 0, 512+5) == TraceToken([]int64{7, 3}, 1, 512+5) {
		t.Fatal("different hash ids, same token")
	}
}

// idealHitRate computes, from the hash ids alone, the prefix-hit ratio of an
// unlimited cache: per request, the leading 512-token blocks whose whole
// chain prefix appeared before (counting only the 16-token blocks the
// earlier request filled with prompt tokens), capped at (input-1) rounded
// down to a block, over all queried prompt tokens.
func idealHitRate(recs []TraceRecord) float64 {
	const bs = 16
	type chain struct {
		parent uint64
		id     int64
	}
	keys := map[chain]uint64{}
	avail := map[uint64]int{} // tokens of a chain block some request filled
	var hit, queried int64
	for _, r := range recs {
		queried += int64(r.InputLength)
		var key uint64
		tokens := 0
		matching := true
		for i, id := range r.HashIDs {
			need := min(TraceBlockTokens, r.InputLength-i*TraceBlockTokens)
			if need <= 0 {
				break
			}
			c := chain{key, id}
			k, ok := keys[c]
			if !ok {
				k = uint64(len(keys) + 1)
				keys[c] = k
			}
			key = k
			if matching {
				a := avail[k]
				tokens += min(a, need)
				if a < need {
					matching = false
				}
			}
			have := need / bs * bs // full 16-token blocks of prompt tokens
			avail[k] = max(avail[k], have)
		}
		limit := (r.InputLength - 1) / bs * bs
		hit += int64(min(tokens/bs*bs, limit))
	}
	return float64(hit) / float64(queried)
}

func TestIdealHitRatio(t *testing.T) {
	limits := []int{400}
	if !testing.Short() && !raceEnabled {
		limits = append(limits, 0) // the whole trace: about 0.65 (1.5 s)
	}
	for _, limit := range limits {
		checkIdealHitRatio(t, limit)
	}
}

func checkIdealHitRatio(t *testing.T, limit int) {
	recs, err := ReadTrace(tracePath, ParserAuto, limit)
	if err != nil {
		t.Fatal(err)
	}
	ideal := idealHitRate(recs)
	keys, _ := ParseWidths("hidden=16")
	// A pool larger than every block ever allocated never evicts.
	total := 0
	for _, r := range recs {
		total += (r.InputLength + r.OutputLength + 15) / 16
	}
	spec, err := TraceSpec("trace", recs, keys, 4, TraceLimits{MaxModelLen: DefaultTraceMaxModelLen, KVBlocks: total + 1, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	sch, err := Simulate(spec, Options{}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ideal %.4f simulated %.4f over %d requests (%d steps)", ideal, sch.HitRate(), len(recs), sch.Steps)
	if math.Abs(ideal-sch.HitRate()) > 0.01 {
		t.Fatalf("simulated hit rate %.4f, ideal %.4f", sch.HitRate(), ideal)
	}
	if limit == 0 && math.Abs(sch.HitRate()-0.65) > 0.01 {
		t.Fatalf("whole-trace hit rate %.4f, the trace's README says about 0.65", sch.HitRate())
	}
}

// TestTraceVerifyRealCache replays part of the trace through the real cache
// with --verify, on a KV pool small enough that slots change tenants.
func TestTraceVerifyRealCache(t *testing.T) {
	// The first 80 requests: about 1M tokens through 512k slots, 4.6% hits.
	recs, err := ReadTrace(tracePath, ParserAuto, 80)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := ParseWidths("hidden=16,audio=8")
	spec, err := TraceSpec("trace", recs, keys, 8, TraceLimits{MaxModelLen: DefaultTraceMaxModelLen, KVBlocks: 32768, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Replay(spec, Options{Cache: true, Verify: true, Pace: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.VerifiedRows == 0 || rep.HitTokens == 0 || rep.Evictions == 0 {
		t.Fatalf("verified %d rows, %d hit tokens, %d evictions", rep.VerifiedRows, rep.HitTokens, rep.Evictions)
	}
}

func TestReportWriters(t *testing.T) {
	rep, err := Replay(small().Spec(1), Options{Cache: true, NewCache: fakeWith(nil), KeepSamples: true})
	if err != nil {
		t.Fatal(err)
	}
	off, err := Replay(small().Spec(1), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p := Pairs([]*Report{off, rep}); len(p) != 1 || p[0].Off != off || p[0].On != rep || p[0].Name != rep.Name {
		t.Fatalf("Pairs: %+v", p)
	}
	f, _ := os.Create(filepath.Join(t.TempDir(), "t.txt"))
	defer f.Close()
	if err := WriteTable(f, []*Report{off, rep}); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(f, rep); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultWorkloadsSchedule(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	// Every embedded workload schedules to the end (cache off, a few
	// prompts each, auto KV pool).
	for _, w := range DefaultWorkloads() {
		w.Prompts = w.Concurrency + 1
		rep, err := Replay(w.Spec(1), Options{})
		if err != nil {
			t.Fatalf("%s: %v", w.FullName(), err)
		}
		if rep.Steps == 0 {
			t.Fatalf("%s: no step", w.FullName())
		}
	}
}

// TestVerifyRealCacheModes: a small shared-prefix workload through the real
// cache under --verify, with preemption and slot reuse (tiny pool), in every
// buffer mode, with and without the decode buffer and pacing.
func TestVerifyRealCacheModes(t *testing.T) {
	for _, kv := range []int{0, 16} {
		for _, owned := range []bool{true, false} {
			for _, buffer := range []bool{true, false} {
				for _, pace := range []bool{true, false} {
					o := Options{Cache: true, Verify: true, NotOwned: !owned, KVBlocks: kv, MaxBatchedTokens: 128,
						DisableDecodeBuffer: !buffer, Pace: pace}
					rep, err := Replay(small().Spec(3), o)
					if err != nil {
						t.Fatalf("kv=%d owned=%v buffer=%v pace=%v: %v", kv, owned, buffer, pace, err)
					}
					if rep.VerifiedRows == 0 || rep.HitTokens == 0 || (kv > 0 && rep.Preemptions == 0) {
						t.Fatalf("kv=%d: %d rows, %d hits, %d preemptions", kv, rep.VerifiedRows, rep.HitTokens, rep.Preemptions)
					}
				}
			}
		}
	}
}

// TestCheckTrace: records out of the model length or the KV pool, with a
// negative timestamp or fewer hash ids than their prompt's blocks, are
// errors naming the record (and its line, read from a file), checked before
// anything is sized from them.
func TestCheckTrace(t *testing.T) {
	lim := TraceLimits{MaxModelLen: 1000, KVBlocks: 32, BlockSize: 16} // pool: 512 tokens
	ok := TraceRecord{InputLength: 100, OutputLength: 10, HashIDs: []int64{1}}
	for _, c := range []struct {
		rec  TraceRecord
		want string
	}{
		{TraceRecord{InputLength: 99999999999999, OutputLength: 4}, "model length"},
		{TraceRecord{InputLength: 8, OutputLength: 1e12}, "model length"},
		// A sum that wraps int64 to a small positive number.
		{TraceRecord{InputLength: math.MaxInt64, OutputLength: math.MaxInt64/2 + 200}, "model length"},
		{TraceRecord{InputLength: math.MaxInt64, OutputLength: math.MaxInt64}, "model length"},
		{TraceRecord{InputLength: 600, OutputLength: 10}, "KV pool"},
		{TraceRecord{InputLength: 0, OutputLength: 10}, "> 0"},
		{TraceRecord{InputLength: 10, OutputLength: -1}, "> 0"},
		{TraceRecord{InputLength: 10, OutputLength: 1, HashIDs: []int64{1}, Timestamp: -1}, "timestamp -1"},
		{TraceRecord{InputLength: 500, OutputLength: 1}, "0 hash_ids for input_length 500: want 1"},
	} {
		recs := []TraceRecord{ok, ok, c.rec}
		err := CheckTrace(recs, lim)
		if !errors.Is(err, ErrTraceRecord) || !strings.Contains(err.Error(), "record 3:") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v", c.rec, err)
		}
		if _, err := TraceSpec("t", recs, []omnicache.Key{{Name: "h", RowBytes: 8}}, 4, lim); !errors.Is(err, ErrTraceRecord) {
			t.Errorf("TraceSpec accepted %+v: %v", c.rec, err)
		}
	}
	if err := CheckTrace([]TraceRecord{ok, {InputLength: 500, OutputLength: 12, HashIDs: []int64{1}}}, lim); err != nil {
		t.Fatalf("a record of exactly the pool: %v", err)
	}
	recs, err := ParseTrace([]byte(`{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}`+"\n\n"+
		`{"timestamp": -3, "input_length": 10, "output_length": 2, "hash_ids": [1]}`+"\n"), ParserAuto, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckTrace(recs, lim); err == nil || !strings.Contains(err.Error(), "record 2 (line 3): timestamp -3") {
		t.Fatalf("negative timestamp in a file: %v", err)
	}
}

// TestParseTraceErrorsNameRecord: every parser names the bad record and its
// line (simdjson alone names neither).
func TestParseTraceErrorsNameRecord(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}`
	for _, data := range []struct{ text, want string }{
		{good + "\n" + good + "\n\n" + `{"timestamp": 0, "input_length": 10,` + "\n" + good + "\n", "record 3 (line 4)"},
		{good + "\n" + `{"timestamp": 0, "input_length": "ten", "output_length": 2, "hash_ids": [1]}` + "\n", "record 2"},
		{good + "\n" + `{"timestamp": 0, "input_length": 10, "output_length": 1.5e12, "hash_ids": [1]}` + "\n", "record 2"},
	} {
		for _, p := range []string{ParserStd, ParserAuto} {
			_, err := ParseTrace([]byte(data.text), p, 0)
			if err == nil || !strings.Contains(err.Error(), data.want) {
				t.Errorf("%s: %q: %v, want %q", p, data.text, err, data.want)
			}
		}
	}
}

// windowCounts counts steps per whole window from the first step; the
// partial last window is left out; windowRates gives the median and the
// slowest window per second.
func TestWindowRates(t *testing.T) {
	s := int64(time.Second)
	at := []int64{0, s / 2, s, s + 1, 2*s + 5, 3*s + 1, 3*s + 2} // [0,1): 2, [1,2): 2, [2,3): 1, [3,4): partial
	counts := windowCounts(at, time.Second)
	if !slices.Equal(counts, []int64{2, 2, 1}) {
		t.Fatalf("counts %v, want [2 2 1]", counts)
	}
	p50, lo := windowRates(counts, time.Second)
	if p50 != 2 || lo != 1 {
		t.Fatalf("p50 %v min %v, want 2 and 1", p50, lo)
	}
	if p50, lo := windowRates(windowCounts(at[:2], time.Second), time.Second); p50 != 0 || lo != 0 {
		t.Fatalf("under two windows: %v %v, want zeros", p50, lo)
	}
}
