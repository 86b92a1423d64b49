package replay

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/omnicache/omnicache/internal/redistest"
)

// sessions is a multi-turn workload: n conversations of turns turns each,
// turn k of a conversation repeating its whole previous prompt and adding a
// block of 512 tokens (trace hash ids), conversations interleaved turn by
// turn. Behind a round-robin router a conversation's next turn lands on
// another replica (n is not a multiple of the replica counts used), which
// finds its prefix only through the tier.
func sessions(t *testing.T, n, turns int) Spec {
	t.Helper()
	var recs []TraceRecord
	for k := 0; k < turns; k++ {
		for c := 0; c < n; c++ {
			var ids []int64
			for b := 0; b <= k+1; b++ {
				ids = append(ids, int64(c*100+b))
			}
			recs = append(recs, TraceRecord{InputLength: len(ids)*TraceBlockTokens - 100, OutputLength: 4, HashIDs: ids})
		}
	}
	keys, _ := ParseWidths("hidden=16,audio=8:opt")
	spec, err := TraceSpec("sessions", recs, keys, 8, TraceLimits{MaxModelLen: DefaultTraceMaxModelLen, KVBlocks: 65536, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func checkReplicas(t *testing.T, rep *ReplicasReport, n int) {
	t.Helper()
	if rep.Replicas != n || len(rep.PerReplica) != n {
		t.Fatalf("%d replicas, %d reported", rep.Replicas, len(rep.PerReplica))
	}
	var local, tierTok, queried int64
	for _, pr := range append([]ReplicaReport{rep.ReplicaReport}, rep.PerReplica...) {
		// the engine time splits by call, its percentiles bracket the mean
		if pr.BeginNs+pr.SaveNs+pr.DiscardNs != pr.EngineNs || pr.BeginNs <= 0 || pr.SaveNs <= 0 ||
			pr.EngineNsP50 <= 0 || pr.EngineNsP50 > pr.EngineNsP99 || float64(pr.EngineNsP99) > float64(pr.EngineNs) {
			t.Fatalf("replica %d: engine %d ns = begin %d + save %d + discard %d; p50 %d p99 %d ns",
				pr.Replica, pr.EngineNs, pr.BeginNs, pr.SaveNs, pr.DiscardNs, pr.EngineNsP50, pr.EngineNsP99)
		}
	}
	for _, pr := range rep.PerReplica {
		if pr.Requests == 0 || pr.Steps == 0 {
			t.Fatalf("replica %d ran nothing: %+v", pr.Replica, pr)
		}
		if pr.VerifiedRows == 0 || pr.VerifyFailures != 0 {
			t.Fatalf("replica %d: verified %d rows, %d wrong", pr.Replica, pr.VerifiedRows, pr.VerifyFailures)
		}
		local += pr.LocalHitTokens
		tierTok += pr.TierHitTokens
		queried += pr.QueriedTokens
	}
	if local != rep.LocalHitTokens || tierTok != rep.TierHitTokens || queried != rep.QueriedTokens {
		t.Fatalf("totals %d/%d/%d, replicas sum to %d/%d/%d", rep.LocalHitTokens, rep.TierHitTokens, rep.QueriedTokens, local, tierTok, queried)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"replicas":`, `"tier":`, `"local_hit_tokens":`, `"tier_hit_tokens":`, `"tier_bytes_published":`,
		`"tier_bytes_imported":`, `"hit_rate":`, `"verify_failures":`, `"import_latency_p50_ns":`, `"import_latency_p99_ns":`,
		`"engine_ns_p50":`, `"engine_ns_p99":`, `"begin_ns_total":`, `"save_ns_total":`, `"discard_ns_total":`} {
		if !strings.Contains(string(b), f) {
			t.Fatalf("JSON lacks %s: %s", f, b)
		}
	}
}

func TestReplicasEmbeddedTier(t *testing.T) {
	spec := sessions(t, 10, 4)
	rep, err := RunReplicas(spec, ReplicaOptions{Replicas: 4, Verify: true, WaitPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, rep, 4)
	t.Logf("hit %.3f (local %d, tier %d tokens), one engine %.3f, local only %.3f; published %d B, imported %d B, import p50 %d ns p99 %d ns",
		rep.HitRate, rep.LocalHitTokens, rep.TierHitTokens, rep.SingleHitRate, rep.LocalOnlyHitRate,
		rep.TierBytesPublished, rep.TierBytesImported, rep.ImportP50Ns, rep.ImportP99Ns)
	if rep.TierHitTokens == 0 || rep.TierBytesImported == 0 || rep.TierBytesPublished == 0 || rep.Imports == 0 {
		t.Fatalf("the tier served nothing: %+v", rep.ReplicaReport)
	}
	if rep.HitRate <= rep.LocalOnlyHitRate {
		t.Fatalf("hit rate %.3f with the tier, %.3f without", rep.HitRate, rep.LocalOnlyHitRate)
	}
	// Without a tier the replicas hit only their own KV: the same as the
	// simulator alone.
	off, err := RunReplicas(spec, ReplicaOptions{Replicas: 4, Tier: "off", Verify: true, WaitPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	if off.TierHitTokens != 0 || off.HitRate != off.LocalOnlyHitRate {
		t.Fatalf("tier off: %d tier tokens, hit %.4f, simulated local-only %.4f", off.TierHitTokens, off.HitRate, off.LocalOnlyHitRate)
	}
}

func TestReplicasRoutes(t *testing.T) {
	if _, err := RunReplicas(sessions(t, 2, 2), ReplicaOptions{Route: "random"}); err == nil {
		t.Fatal("unknown route accepted")
	}
	rep, err := RunReplicas(sessions(t, 6, 4), ReplicaOptions{Replicas: 3, Route: RouteSession, Verify: true, WaitPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, pr := range rep.PerReplica {
		total += pr.Requests
	}
	if total != 24 {
		t.Fatalf("%d requests routed, want 24", total)
	}
}

// TestReplicasRedisCluster is the replay with 4 replicas on a three-master
// Redis Cluster, with --verify on every replica.
func TestReplicasRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{})
	rep, err := RunReplicas(sessions(t, 10, 4), ReplicaOptions{Replicas: 4, Tier: c.Spec(), Verify: true, WaitPublish: true})
	if err != nil {
		if errors.Is(err, ErrVerify) {
			t.Fatalf("wrong rows: %v", err)
		}
		t.Fatal(err)
	}
	checkReplicas(t, rep, 4)
	t.Logf("redis cluster: hit %.3f (local %d, tier %d tokens), local only %.3f; imported %d B, import p50 %d ns p99 %d ns",
		rep.HitRate, rep.LocalHitTokens, rep.TierHitTokens, rep.LocalOnlyHitRate, rep.TierBytesImported, rep.ImportP50Ns, rep.ImportP99Ns)
	if rep.TierHitTokens == 0 || rep.Tier != c.Spec() {
		t.Fatalf("the cluster tier served nothing: %+v", rep.ReplicaReport)
	}
}

// TestReplicasRedisNodeKilled kills a cluster master mid-run: lookups and
// imports of its blocks fail (counted: fewer tier hits, failed requests),
// the replay completes and no replica serves a wrong row.
func TestReplicasRedisNodeKilled(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{})
	spec := sessions(t, 10, 6)
	full, err := RunReplicas(spec, ReplicaOptions{Replicas: 4, Tier: c.Spec(), Verify: true, WaitPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	c2 := redistest.StartCluster(t, redistest.Options{})
	killed := false
	rep, err := RunReplicas(spec, ReplicaOptions{Replicas: 4, Tier: c2.Spec(), Verify: true, WaitPublish: true, AfterRound: func(round int) {
		if round == 8 && !killed {
			killed = true
			c2.Nodes[2].Kill()
		}
	}})
	if err != nil {
		t.Fatal(err) // a wrong row is ErrVerify
	}
	checkReplicas(t, rep, 4)
	t.Logf("node killed: hit %.3f (tier %d tokens, %d failed imports' tokens, %d lookup errors, %d request errors); intact cluster: hit %.3f (tier %d tokens)",
		rep.HitRate, rep.TierHitTokens, rep.TierImportFailedTokens, rep.LookupErrors, rep.RequestErrors, full.HitRate, full.TierHitTokens)
	if !killed {
		t.Fatal("the run ended before the kill")
	}
	if rep.TierHitTokens >= full.TierHitTokens || rep.LookupErrors+rep.RequestErrors == 0 {
		t.Fatalf("the dead node cost nothing: %d tier tokens (intact %d), %d lookup errors, %d request errors",
			rep.TierHitTokens, full.TierHitTokens, rep.LookupErrors, rep.RequestErrors)
	}
}

// ReplicaKVBlocks: without a pool given each replica is a whole engine of
// its share of the concurrency (every default workload fits: none fails
// the way a split below one request did); a pool given is split, and a
// share below the longest request is refused with what would fit.
func TestReplicaKVBlocks(t *testing.T) {
	o := Options{}
	for _, w := range DefaultWorkloads() {
		spec := w.Scaled(0.125).Spec(0)
		for _, n := range []int{1, 2, 3, 8} {
			per, err := ReplicaKVBlocks(spec, o, n)
			if err != nil {
				t.Fatalf("%s over %d replicas: %v", spec.Name, n, err)
			}
			if need := (spec.MaxModelLen + DefaultBlockSize - 1) / DefaultBlockSize; per < need {
				t.Fatalf("%s over %d replicas: %d blocks each, below one request (%d)", spec.Name, n, per, need)
			}
			one := spec
			one.Concurrency = (spec.Concurrency + n - 1) / n
			if want := KVPool(one, o); per != want {
				t.Fatalf("%s over %d replicas: %d blocks each, want one engine's %d", spec.Name, n, per, want)
			}
		}
	}
	spec := Spec{Name: "w", Concurrency: 4, MaxModelLen: 4104}
	if per, err := ReplicaKVBlocks(spec, Options{KVBlocks: 1000}, 3); err != nil || per != 333 {
		t.Fatalf("a fixed pool of 1000 over 3: %d, %v", per, err)
	}
	_, err := ReplicaKVBlocks(spec, Options{KVBlocks: 300}, 2)
	if !errors.Is(err, ErrReplicaPool) || !strings.Contains(err.Error(), "leave 150 each") || !strings.Contains(err.Error(), "give at least 514 blocks") {
		t.Fatalf("a pool below a request per replica: %v", err)
	}
}
