package replay

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/omnicache/omnicache/internal/redistest"
	"github.com/omnicache/omnicache/tier"
)

// distinct is a workload of n prompts sharing no block (so every decode
// arrival imports its whole prompt's full blocks and nothing else), of
// 600 to 1,700 tokens, with short outputs.
func distinct(t *testing.T, n, conc int) Spec {
	t.Helper()
	var recs []TraceRecord
	for i := range n {
		blocks := 2 + i%3
		var ids []int64
		for b := range blocks {
			ids = append(ids, int64(i*10+b))
		}
		recs = append(recs, TraceRecord{InputLength: blocks*TraceBlockTokens - 100 - 37*(i%5), OutputLength: 3 + i%4, HashIDs: ids})
	}
	keys, _ := ParseWidths("hidden=16,audio=8:opt")
	spec, err := TraceSpec("distinct", recs, keys, conc, TraceLimits{MaxModelLen: DefaultTraceMaxModelLen, KVBlocks: 4096, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// promptHitTokens is what a decode arrival hits when its prompt's full
// blocks all come as a hit: every full block but one computed token.
func promptHitTokens(spec Spec, bs int) int64 {
	src := spec.Source()
	var n int64
	for {
		q, ok, err := src.Next()
		if err != nil || !ok {
			return n
		}
		n += int64((len(q.Prompt) - 1) / bs * bs)
	}
}

// checkPD: verification found every row of both sides exact, every replica
// ran, the figures are there.
func checkPD(t *testing.T, rep *PDReport, p, d int) {
	t.Helper()
	if len(rep.PerReplica) != p+d || rep.Prefill != p || rep.Decode != d {
		t.Fatalf("%d:%d replicas, %d reported", rep.Prefill, rep.Decode, len(rep.PerReplica))
	}
	for _, pr := range rep.PerReplica {
		if pr.Requests == 0 || pr.Steps == 0 || pr.VerifiedRows == 0 {
			t.Fatalf("replica %d ran nothing or verified nothing: %+v", pr.Replica, pr)
		}
	}
	for _, pool := range []ReplicaReport{rep.PrefillPool, rep.DecodePool} {
		if pool.VerifyFailures != 0 || pool.VerifyMissing != 0 || pool.VerifyRepeated != 0 {
			t.Fatalf("verify: %d wrong, %d missing, %d repeated rows", pool.VerifyFailures, pool.VerifyMissing, pool.VerifyRepeated)
		}
	}
	if rep.PrefillPool.Requests != rep.Requests || rep.DecodePool.Requests != rep.Requests+rep.ImportFailed+rep.OtherFailed {
		t.Fatalf("%d requests: %d prefilled, %d decode arrivals, %d+%d failed", rep.Requests, rep.PrefillPool.Requests,
			rep.DecodePool.Requests, rep.ImportFailed, rep.OtherFailed)
	}
	if rep.TTFPP50Ns <= 0 || rep.TTFPP99Ns < rep.TTFPP50Ns || rep.DecodeTTFPP50Ns <= 0 || rep.DecodeTTFPP99Ns > rep.TTFPP99Ns ||
		rep.RecomputeTTFPP50Ns <= 0 || rep.RecomputeDecodeTTFPP50Ns <= 0 || rep.DecodeStepNs <= 0 {
		t.Fatalf("projected times: %+v", rep)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"prefill_replicas":`, `"tier_rows":`, `"published_bytes_per_request":`, `"import_wait_p99_ns":`,
		`"decode_step_ns":`, `"ttfp_p99_ns":`, `"recompute_ttfp_p99_ns":`, `"decode_ttfp_p50_ns":`, `"recomputed":`, `"verify_missing_rows":`} {
		if !strings.Contains(string(b), f) {
			t.Fatalf("JSON lacks %s: %s", f, b)
		}
	}
}

// pdBackends runs f over the embedded tier and a real Redis server (its
// spec; flush empties the store).
func pdBackends(t *testing.T, f func(t *testing.T, spec string)) {
	t.Run("tier=embedded", func(t *testing.T) { f(t, "embedded") })
	t.Run("tier=redis", func(t *testing.T) {
		s := redistest.Start(t, redistest.Options{})
		f(t, "redis://"+s.Addr)
	})
}

// Every request is prefilled on one pool and decoded on the other: the
// decode arrivals' whole prompts are hits, their rows imported from the
// tier (none recomputed), every row on both sides exact.
func TestPDReplay(t *testing.T) {
	pdBackends(t, func(t *testing.T, ts string) {
		spec := distinct(t, 24, 4)
		for _, route := range []string{RouteRoundRobin, RouteLeastLoaded} {
			rep, err := RunPD(spec, PDOptions{Prefill: 1, Decode: 2, Route: route,
				ReplicaOptions: ReplicaOptions{Tier: ts, Verify: true}})
			if err != nil {
				t.Fatal(err)
			}
			checkPD(t, rep, 1, 2)
			want := promptHitTokens(spec, DefaultBlockSize)
			if rep.Recomputed != 0 || rep.TierRows != want || rep.DecodePool.LocalHitTokens != 0 || rep.Imports == 0 ||
				rep.TierBytesImported != want*24 || rep.TierBytesPublished == 0 {
				t.Fatalf("route %s: %d recomputed, %d rows through the tier (want %d), %d local hits, %d imports, %d B imported (want %d)",
					route, rep.Recomputed, rep.TierRows, want, rep.DecodePool.LocalHitTokens, rep.Imports, rep.TierBytesImported, want*24)
			}
			if rep.Route != route {
				t.Fatalf("route %q reported %q", route, rep.Route)
			}
		}
	})
}

// A shared prefix hits on both sides: a decode replica that holds it
// imports only the rest of the prompt (sessions: each conversation's turns
// repeat its history).
func TestPDReplayLocalHits(t *testing.T) {
	spec := sessions(t, 6, 4)
	rep, err := RunPD(spec, PDOptions{Prefill: 2, Decode: 2, ReplicaOptions: ReplicaOptions{Verify: true}})
	if err != nil {
		t.Fatal(err)
	}
	checkPD(t, rep, 2, 2)
	if rep.PrefillPool.LocalHitTokens == 0 || rep.DecodePool.LocalHitTokens == 0 || rep.TierRows == 0 || rep.Recomputed != 0 {
		t.Fatalf("prefill local hits %d, decode local hits %d, tier rows %d, recomputed %d", rep.PrefillPool.LocalHitTokens,
			rep.DecodePool.LocalHitTokens, rep.TierRows, rep.Recomputed)
	}
	if got, want := rep.DecodePool.LocalHitTokens+rep.TierRows, promptHitTokens(spec, DefaultBlockSize); got != want {
		t.Fatalf("decode hits %d, want every prompt's full blocks: %d", got, want)
	}
}

// The tier loses values between the pools: an evicted request's import
// fails (a TierImportError) and its decode replica aborts and recomputes
// it; a flush mid-run does so to whatever was in flight. Every row served
// on both sides is exact, every request gets its first packet.
func TestPDReplayLostRows(t *testing.T) {
	pdBackends(t, func(t *testing.T, ts string) {
		spec := distinct(t, 24, 4)
		for _, fault := range []string{"evicted", "flushed"} {
			t.Run("fault="+fault, func(t *testing.T) {
				var tr *tier.Tier
				lost := 0
				o := PDOptions{Prefill: 1, Decode: 2, ReplicaOptions: ReplicaOptions{Tier: ts, Verify: true,
					ImportTimeout: 300 * time.Millisecond, OnTier: func(x *tier.Tier) { tr = x }}}
				o.OnHandover = func(req int, hashes []uint64) {
					switch {
					case fault == "evicted" && req%3 == 1:
						if err := tr.Delete(context.Background(), hashes[len(hashes)/2:]); err != nil {
							t.Error(err)
						}
						lost++
					case fault == "flushed" && req == 9:
						if _, err := tr.Purge(context.Background()); err != nil {
							t.Error(err)
						}
						lost++
					}
				}
				rep, err := RunPD(spec, o)
				if err != nil {
					t.Fatal(err) // a wrong row is ErrVerify
				}
				checkPD(t, rep, 1, 2)
				t.Logf("%s: %d import failures, %d other, %d publish, %d recomputed, %d rows through the tier",
					fault, rep.ImportFailed, rep.OtherFailed, rep.PublishFailed, rep.Recomputed, rep.TierRows)
				if lost == 0 || rep.PublishFailed != 0 || rep.OtherFailed != 0 || rep.Recomputed != rep.ImportFailed {
					t.Fatalf("%d lost: %d import failures, %d other, %d publish, %d recomputed", lost, rep.ImportFailed, rep.OtherFailed,
						rep.PublishFailed, rep.Recomputed)
				}
				switch {
				case fault == "evicted" && rep.ImportFailed != int64(lost):
					t.Fatalf("%d requests lost blocks, %d imports failed", lost, rep.ImportFailed)
				case fault == "flushed" && rep.ImportFailed < 1:
					t.Fatal("the flush failed no import")
				}
				if rep.DecodePool.TierImportFailedTokens == 0 || rep.TierRows >= promptHitTokens(spec, DefaultBlockSize) {
					t.Fatalf("%d tokens' imports failed, %d rows through the tier", rep.DecodePool.TierImportFailedTokens, rep.TierRows)
				}
			})
		}
	})
}

func TestPDOptionsRefused(t *testing.T) {
	spec := distinct(t, 4, 2)
	for _, o := range []PDOptions{
		{Prefill: 0, Decode: 1},
		{Prefill: 1, Decode: 1, ReplicaOptions: ReplicaOptions{Tier: "off"}},
		{Prefill: 1, Decode: 1, Route: RouteSession},
		{Prefill: 1, Decode: 1, ReplicaOptions: ReplicaOptions{AdmitAfter: 2}},
	} {
		if _, err := RunPD(spec, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// With arrivals the client is an open loop: every request is sent at its
// time, whatever finished before, and all of them are prefilled and
// decoded (the tier run replays the sends of the run without it).
func TestPDOpenLoopSends(t *testing.T) {
	spec := distinct(t, 12, 2)
	o := PDOptions{Prefill: 1, Decode: 2, ReplicaOptions: ReplicaOptions{BlockSize: DefaultBlockSize, MaxBatchedTokens: DefaultMaxBatchedTokens}}
	o.Tier, o.PublishTimeout = "off", DefaultPublishTimeout
	bo := Options{BlockSize: o.BlockSize, MaxBatchedTokens: o.MaxBatchedTokens}
	bo.defaults()
	pre, dec, err := PDKVBlocks(spec, bo, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	// All at once, then one every 50 ms: later than any finish, and
	// earlier than a closed loop of 2 would send the first ones.
	sends := make([]float64, 12)
	for i := range sends {
		sends[i] = float64(max(0, i-5)) * 50e6
	}
	r, err := runPD(spec, o, CostOf(spec, bo), pre, dec, nil, sends)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.reqs) != len(sends) {
		t.Fatalf("%d requests sent, want %d", len(r.reqs), len(sends))
	}
	for i, q := range r.reqs {
		if q.sent != sends[i] || !q.done || q.first < q.sent {
			t.Fatalf("request %d: sent at %v (want %v), done %v, first packet at %v", i, q.sent, sends[i], q.done, q.first)
		}
	}
}

// The run sizes an embedded tier it was given no bound for from the values
// in flight (Concurrency requests of the largest prompt), and keeps a bound
// it was given.
func TestPDSizesTheTier(t *testing.T) {
	spec := distinct(t, 6, 3)
	rowBytes := int64(keyRowBytesSum(spec.Keys))
	var most, total int64
	src := spec.Source()
	for {
		q, ok, err := src.Next()
		if err != nil || !ok {
			break
		}
		n := int64(len(q.Prompt)/DefaultBlockSize*DefaultBlockSize) * rowBytes
		most, total = max(most, n), total+n
	}
	for _, given := range []int64{0, 3 << 30} {
		rep, err := RunPD(spec, PDOptions{Prefill: 1, Decode: 1, ReplicaOptions: ReplicaOptions{TierBytes: given}})
		if err != nil {
			t.Fatal(err)
		}
		want := min(max(PDTierHeadroom*3*most, total+total/16, tier.DefaultEmbeddedBytes), PDMaxAutoTierBytes)
		if given != 0 {
			want = given
		}
		if rep.MaxRequestBytes != most || rep.InFlightBytes != 3*most || rep.TierAutoSized != (given == 0) || rep.TierBoundBytes != want {
			t.Fatalf("given %d: largest request %d B (want %d), in flight %d B, auto %v, bound %d (want %d)", given,
				rep.MaxRequestBytes, most, rep.InFlightBytes, rep.TierAutoSized, rep.TierBoundBytes, want)
		}
	}
}
