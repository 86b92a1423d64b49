// The replay with replicas: N simulated engines behind a router, sharing a
// simulated KV store and one tier (package tier), each with its own cache.

package replay

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// Routes of ReplicaOptions.Route.
const (
	RouteRoundRobin = "round-robin" // request k to replica k mod N
	RouteSession    = "session"     // by the prompt's first KV block: one conversation (or shared prefix) to one replica
)

// ReplicaOptions control a replay with replicas.
type ReplicaOptions struct {
	// Replicas is the number of engines (default 1).
	Replicas int
	// Tier is "embedded" (default: in-process), "off" (no tier: every
	// replica hits only its own KV), or a tier.Open spec
	// ("redis://HOST:PORT", "redis-cluster://H1:P1,...").
	Tier string
	// Redis supplies what a Redis spec does not (timeouts, TLS).
	Redis tier.RedisOptions
	// TierBytes bounds the embedded tier (0: tier.DefaultEmbeddedBytes).
	TierBytes int64
	// TierRecent is the tier's tier.Options.RecentWindow (0: its default,
	// negative: every full block is published).
	TierRecent time.Duration
	// TierPolicy is the embedded tier's eviction policy ("":
	// tier.DefaultPolicy).
	TierPolicy tier.Policy
	// AdmitAfter is TierConfig.AdmitAfter (0: every full block is
	// published).
	AdmitAfter int
	// Histograms turns on Config.Histograms and tier.Options.Histograms.
	Histograms bool
	// OnCache, when set, is called with each replica's cache of the
	// cache-on run once it is made (a metrics collector registers it).
	OnCache func(replica int, c *omnicache.Cache)
	// Route is RouteRoundRobin (default) or RouteSession.
	Route string
	// Verify checks every row Materialize returns on every replica, and
	// each replica's mirror at the end, against the oracle.
	Verify bool
	// BlockSize and MaxBatchedTokens as Options.
	BlockSize, MaxBatchedTokens int
	// KVBlocks is the KV pool over all replicas, split evenly (0: each
	// replica is a whole engine: ReplicaKVBlocks). Each replica runs
	// ceil(Concurrency/Replicas) requests at once.
	KVBlocks int
	// SharedKVBlocks bounds the simulated shared KV store (blocks, least
	// recently stored or loaded out first; 0: 4 × the replicas' pools).
	SharedKVBlocks int
	// ImportTimeout is TierConfig.ImportTimeout (0: its default).
	ImportTimeout time.Duration
	// WaitPublish extends the pacing wait until every block gathered so
	// far is stored in the tier (Stats.TierPublishPending is 0): a run's
	// tier hits then do not depend on how fast the publishers got CPU
	// time (the tests' runs are deterministic in what they hit), at the
	// cost of wall time.
	WaitPublish bool
	// PacePark lets the pacing Sync park after its default spin. By
	// default it spins through the committer's work (Config.SyncSpin
	// MaxSyncSpin), as an engine thread waiting on its forward keeps its
	// core: a parked engine goroutine may resume on another core, more
	// often with a tier's publishing beside it, and its next timed calls
	// pay for the cold caches.
	PacePark bool
	// AfterRound, when set, is called after every round of the cache-on
	// run (one step of each replica still running; in the P/D replay one
	// step of one replica), with the round's index (tests kill a tier node
	// mid-run).
	AfterRound func(round int)
	// OnTier, when set, is called with the run's tier once it is open
	// (tests flush it mid-run).
	OnTier func(*tier.Tier)
}

// ReplicaReport is one replica's (or, in ReplicasReport, all replicas')
// result.
type ReplicaReport struct {
	Replica        int     `json:"replica"`
	Requests       int64   `json:"requests"`
	Steps          int     `json:"steps"`
	QueriedTokens  int64   `json:"queried_tokens"`
	LocalHitTokens int64   `json:"local_hit_tokens"`
	TierHitTokens  int64   `json:"tier_hit_tokens"`
	HitRate        float64 `json:"hit_rate"`
	// TierImportFailedTokens were loaded as KV but their rows could not be
	// imported (the request failed with a TierImportError and would be
	// recomputed): not hits.
	TierImportFailedTokens int64 `json:"tier_import_failed_tokens"`
	TierBytesPublished     int64 `json:"tier_bytes_published"`
	TierBytesImported      int64 `json:"tier_bytes_imported"`
	TierPublishDropped     int64 `json:"tier_publish_dropped"`
	// TierPublishRecent are full blocks not published because the tier
	// stored them within its recent window (Stats.TierPublishRecent).
	TierPublishRecent int64 `json:"tier_publish_recent"`
	// TierPublishUnadmitted are full blocks not published because they
	// were seen fewer than AdmitAfter times.
	TierPublishUnadmitted int64 `json:"tier_publish_unadmitted"`
	Imports               int   `json:"imports"`
	ImportP50Ns           int64 `json:"import_latency_p50_ns"`
	ImportP99Ns           int64 `json:"import_latency_p99_ns"`
	// EngineNs is the engine goroutine's time in Begin + Save + Discard;
	// MaterializeNs the time in Materialize (called right after Save here,
	// so it includes waiting for the step's imports and prefetch; an
	// engine calls it a step late, on its output goroutine); LookupNs the
	// time in Cache.Lookup (the scheduler's tier query, a network round
	// trip on Redis).
	EngineNs        int64   `json:"engine_ns_total"`
	EngineNsPerStep float64 `json:"engine_ns_per_step_mean"`
	// EngineNsP50 and EngineNsP99 are percentiles of the engine time per
	// step (a mean moved by a few long steps reads apart from one moved by
	// every step); BeginNs, SaveNs and DiscardNs split EngineNs by call.
	EngineNsP50   int64 `json:"engine_ns_p50"`
	EngineNsP99   int64 `json:"engine_ns_p99"`
	BeginNs       int64 `json:"begin_ns_total"`
	SaveNs        int64 `json:"save_ns_total"`
	DiscardNs     int64 `json:"discard_ns_total"`
	MaterializeNs int64 `json:"materialize_ns_total"`
	// PaceNs is the time waited, untimed, in the forward of every step that
	// is not a pure decode (Options.Pace's Sync; with WaitPublish, then
	// until the publish queue is empty): the simulator's forward takes no
	// time, a real one gives the committer, a step's tier import (fetched
	// since Begin) and the publishers that long. StallNs is the cache's
	// Stats.StallNanos: waits inside Save on back-pressure.
	PaceNs         int64 `json:"pace_ns_total"`
	StallNs        int64 `json:"stall_ns_total"`
	LookupNs       int64 `json:"lookup_ns_total"`
	LookupErrors   int64 `json:"lookup_errors"`
	RequestErrors  int64 `json:"request_errors"`
	VerifiedRows   int64 `json:"verified_rows"`
	VerifyFailures int64 `json:"verify_failures"`
	// VerifyRepeated and VerifyMissing are the rows a result delivered
	// again, or skipped (counted in VerifyFailures too).
	VerifyRepeated int64 `json:"verify_repeated_rows"`
	VerifyMissing  int64 `json:"verify_missing_rows"`
	// StepsPerSecP50 and StepsPerSecMin are the replica's steps per
	// second of wall time over the whole one-second windows of its run:
	// the median window and the slowest one (what a stalled store costs a
	// replica while it lasts). Zero for a run shorter than two windows;
	// the totals line holds the smallest over the replicas.
	StepsPerSecP50 float64 `json:"steps_per_sec_p50"`
	StepsPerSecMin float64 `json:"steps_per_sec_min"`
	// StepsPerSec is the timeline behind them: the steps that ended in
	// each whole second of the replica's run (per replica only).
	StepsPerSec []int64 `json:"steps_per_sec,omitempty"`
}

// windowCounts counts the steps that ended in each whole window of width w
// from the first step on (the last, partial window is left out).
func windowCounts(at []int64, w time.Duration) []int64 {
	if len(at) < 2 {
		return nil
	}
	n := int(time.Duration(at[len(at)-1]-at[0]) / w)
	counts := make([]int64, n)
	for _, t := range at {
		if i := int(time.Duration(t-at[0]) / w); i < n {
			counts[i]++
		}
	}
	return counts
}

// windowRates returns the median and the smallest of counts (steps per
// window of width w) as steps per second; zeros under two windows.
func windowRates(counts []int64, w time.Duration) (p50, lo float64) {
	if len(counts) < 2 {
		return 0, 0
	}
	sorted := slices.Sorted(slices.Values(counts))
	per := float64(time.Second) / float64(w)
	return float64(percentile(sorted, 0.50)) * per, float64(sorted[0]) * per
}

// ReplicasReport is a replay with replicas: totals over the replicas, each
// replica, and the hit rates to compare with.
type ReplicasReport struct {
	Name     string `json:"name"`
	Replicas int    `json:"replicas"`
	Tier     string `json:"tier"`
	Route    string `json:"route"`
	KVBlocks int    `json:"kv_blocks"` // over all replicas
	Verify   bool   `json:"verify"`
	ReplicaReport
	// SingleHitRate is the hit rate of one engine with the whole KV pool
	// and the whole concurrency; LocalOnlyHitRate that of the same
	// replicas without a tier (each hits only its own KV). Both from the
	// simulator alone.
	SingleHitRate    float64         `json:"single_replica_hit_rate"`
	LocalOnlyHitRate float64         `json:"local_only_hit_rate"`
	PerReplica       []ReplicaReport `json:"per_replica"`
	WallNs           int64           `json:"wall_ns"`
	// Note says what the run changed about the spec (deferred keys run
	// immediate: a tier keeps immediate keys only).
	Note string `json:"note,omitempty"`
	// With the embedded tier: its policy, AdmitAfter, and at the end of
	// the run the key and value bytes it held (TierStoredBytes, of
	// TierBoundBytes) and the values it evicted.
	TierPolicy      string `json:"tier_policy,omitempty"`
	AdmitAfter      int    `json:"tier_admit_after,omitempty"`
	TierStoredBytes int64  `json:"tier_stored_bytes,omitempty"`
	TierBoundBytes  int64  `json:"tier_bound_bytes,omitempty"`
	TierEvicted     int64  `json:"tier_evicted,omitempty"`
}

// ErrReplicaPool reports a KV pool that, split over the replicas, leaves a
// replica less than one request of the workload.
var ErrReplicaPool = errors.New("bench: KV pool too small for the replicas")

// ReplicaKVBlocks is each replica's KV pool in blocks. The caller's pool
// (o.KVBlocks, --kv-blocks) is the pool of all replicas, split evenly, and
// refused (ErrReplicaPool, saying what would fit) when a share cannot hold
// the spec's longest request. Otherwise each replica is a whole engine
// serving its share of the concurrency, with the pool one such engine gets
// (KVPool: the spec's own pool, or the automatic one with its own mirror
// budget, never less than one request).
func ReplicaKVBlocks(spec Spec, o Options, replicas int) (int, error) {
	o.defaults()
	replicas = max(replicas, 1)
	total := o.KVBlocks
	if total == 0 {
		one := spec
		one.Concurrency = (spec.Concurrency + replicas - 1) / replicas
		return KVPool(one, o), nil
	}
	per := total / replicas
	if need := (spec.MaxModelLen + o.BlockSize - 1) / o.BlockSize; per < need {
		return 0, fmt.Errorf("%w: %s: %d KV blocks over %d replicas leave %d each, less than its longest request "+
			"(%d tokens) needs: %d blocks of %d; give at least %d blocks (--kv-blocks) or fewer replicas",
			ErrReplicaPool, spec.Name, total, replicas, per, spec.MaxModelLen, need, o.BlockSize, need*replicas)
	}
	return per, nil
}

// RunReplicas replays spec on o.Replicas engines. It returns ErrVerify
// (wrapped) when verification found a wrong row; the report is complete.
func RunReplicas(spec Spec, o ReplicaOptions) (*ReplicasReport, error) {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.Tier == "" {
		o.Tier = "embedded"
	}
	if o.Route == "" {
		o.Route = RouteRoundRobin
	}
	if o.Route != RouteRoundRobin && o.Route != RouteSession {
		return nil, fmt.Errorf("bench: route %q: want %s or %s", o.Route, RouteRoundRobin, RouteSession)
	}
	bo := Options{BlockSize: o.BlockSize, MaxBatchedTokens: o.MaxBatchedTokens, KVBlocks: o.KVBlocks}
	bo.defaults()
	o.BlockSize, o.MaxBatchedTokens = bo.BlockSize, bo.MaxBatchedTokens
	per, err := ReplicaKVBlocks(spec, bo, o.Replicas)
	if err != nil {
		return nil, err
	}
	rep := &ReplicasReport{Name: spec.Name, Replicas: o.Replicas, Tier: tier.Redact(o.Tier), Route: o.Route, KVBlocks: per * o.Replicas, Verify: o.Verify}
	spec, rep.Note = immediateKeys(spec, o.Tier)
	single, err := Simulate(spec, bo, true)
	if err != nil {
		return rep, err
	}
	rep.SingleHitRate = single.HitRate()
	local, err := runReplicas(spec, o, per, nil, false)
	if err != nil {
		return rep, err
	}
	rep.LocalOnlyHitRate = local.HitRate

	rep.AdmitAfter = o.AdmitAfter
	tr, emb, err := openTier(spec, o)
	if err != nil {
		return rep, err
	}
	if tr != nil {
		defer tr.Close()
	}
	if emb != nil {
		rep.TierPolicy = string(emb.Policy())
	}
	wall := time.Now()
	res, err := runReplicas(spec, o, per, tr, true)
	rep.WallNs = time.Since(wall).Nanoseconds()
	if emb != nil {
		rep.TierStoredBytes, rep.TierBoundBytes, rep.TierEvicted = emb.Usage()
	}
	if res != nil {
		rep.ReplicaReport = res.ReplicaReport
		rep.PerReplica = res.per
	}
	if err != nil {
		return rep, fmt.Errorf("%s: %w", spec.Name, err)
	}
	if rep.VerifyFailures > 0 {
		return rep, fmt.Errorf("%s: %w: %d wrong rows over %d replicas", spec.Name, ErrVerify, rep.VerifyFailures, o.Replicas)
	}
	return rep, nil
}

// immediateKeys is spec with its deferred keys made immediate when it runs
// with a tier (a tier keeps immediate keys only), and a note saying so.
func immediateKeys(spec Spec, tierSpec string) (Spec, string) {
	if tierSpec == "off" || !slices.ContainsFunc(spec.Keys, func(k omnicache.Key) bool { return k.Deferred }) {
		return spec, ""
	}
	keys := slices.Clone(spec.Keys)
	for i := range keys {
		keys[i].Deferred = false
	}
	spec.Keys = keys
	return spec, "deferred keys run immediate (a tier keeps immediate keys only)"
}

// openTier opens the tier of a run of spec under o (nil with o.Tier
// "off"): the embedded store (also returned, for its usage) or the store
// o.Tier names, under a namespace of the run's own, so that a server kept
// from an earlier run lends it no hits. The caller closes it.
func openTier(spec Spec, o ReplicaOptions) (*tier.Tier, *tier.Embedded, error) {
	if o.Tier == "off" {
		return nil, nil, nil
	}
	var b tier.Backend
	var emb *tier.Embedded
	var err error
	if o.Tier == "embedded" {
		emb, err = tier.NewEmbeddedPolicy(o.TierBytes, o.TierPolicy)
		b = emb
	} else {
		b, err = tier.Open(o.Tier, o.Redis)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tier %s: %w", tier.Redact(o.Tier), err)
	}
	ns := tier.Namespace{Model: fmt.Sprintf("%s/%s/%x", spec.Model, spec.Name, time.Now().UnixNano()), BlockSize: o.BlockSize}
	for _, k := range spec.Keys {
		ns.Keys = append(ns.Keys, tier.Key{Name: k.Name, RowBytes: k.RowBytes})
	}
	tr, err := tier.New(b, ns, tier.Options{RecentWindow: o.TierRecent, Histograms: o.Histograms})
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	if o.OnTier != nil {
		o.OnTier(tr)
	}
	return tr, emb, nil
}

type replicasResult struct {
	ReplicaReport
	per []ReplicaReport
}

// runReplicas runs the replicas in turn, one step each, on this goroutine
// (each replica's calls are its engine goroutine's). withCache false runs
// the simulators alone (no cache, no tier).
func runReplicas(spec Spec, o ReplicaOptions, per int, tr *tier.Tier, withCache bool) (*replicasResult, error) {
	n := o.Replicas
	conc := (spec.Concurrency + n - 1) / n
	kvCap := o.SharedKVBlocks
	if kvCap <= 0 {
		kvCap = 4 * per * n
	}
	kv := newSharedKV(kvCap)
	rt := newRouter(spec.Source(), n, o.Route, o.BlockSize)
	reps := make([]*replica, n)
	defer func() {
		for _, r := range reps {
			if r != nil {
				r.close()
			}
		}
	}()
	for i := range reps {
		var err error
		if reps[i], err = newReplica(spec, o, replicaSetup{idx: i, blocks: per, conc: conc, src: rt.source(i), kv: kv,
			tier: tr, loadShared: true, withCache: withCache, fullBlocks: true}); err != nil {
			return nil, err
		}
	}
	for active, round := n, 0; active > 0; round++ {
		if round > 0 && withCache && o.AfterRound != nil {
			o.AfterRound(round - 1)
		}
		active = 0
		for _, r := range reps {
			if r.done {
				continue
			}
			if err := r.step(); err != nil {
				return nil, fmt.Errorf("replica %d: %w", r.idx, err)
			}
			if !r.done {
				active++
			}
		}
	}
	res := &replicasResult{}
	var lat, steps []int64
	for _, r := range reps {
		pr, err := r.finish()
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", r.idx, err)
		}
		res.per = append(res.per, pr)
		res.add(pr)
		lat = append(lat, r.lat...)
		steps = append(steps, r.stepNs...)
	}
	res.Replica = -1
	res.finishRates(lat, steps)
	for i, pr := range res.per {
		if i == 0 || pr.StepsPerSecP50 < res.StepsPerSecP50 {
			res.StepsPerSecP50 = pr.StepsPerSecP50
		}
		if i == 0 || pr.StepsPerSecMin < res.StepsPerSecMin {
			res.StepsPerSecMin = pr.StepsPerSecMin
		}
	}
	return res, nil
}

// add sums pr into the totals.
func (t *ReplicaReport) add(pr ReplicaReport) {
	t.Requests += pr.Requests
	t.Steps += pr.Steps
	t.QueriedTokens += pr.QueriedTokens
	t.LocalHitTokens += pr.LocalHitTokens
	t.TierHitTokens += pr.TierHitTokens
	t.TierImportFailedTokens += pr.TierImportFailedTokens
	t.TierBytesPublished += pr.TierBytesPublished
	t.TierBytesImported += pr.TierBytesImported
	t.TierPublishDropped += pr.TierPublishDropped
	t.TierPublishRecent += pr.TierPublishRecent
	t.TierPublishUnadmitted += pr.TierPublishUnadmitted
	t.Imports += pr.Imports
	t.EngineNs += pr.EngineNs
	t.BeginNs += pr.BeginNs
	t.SaveNs += pr.SaveNs
	t.DiscardNs += pr.DiscardNs
	t.MaterializeNs += pr.MaterializeNs
	t.PaceNs += pr.PaceNs
	t.StallNs += pr.StallNs
	t.LookupNs += pr.LookupNs
	t.LookupErrors += pr.LookupErrors
	t.RequestErrors += pr.RequestErrors
	t.VerifiedRows += pr.VerifiedRows
	t.VerifyFailures += pr.VerifyFailures
	t.VerifyRepeated += pr.VerifyRepeated
	t.VerifyMissing += pr.VerifyMissing
}

// finishRates computes the hit rate, engine time per step and import
// latency percentiles from the counts and the latencies, and the engine
// time percentiles from the per-step times (both sorted in place).
func (t *ReplicaReport) finishRates(lat, steps []int64) {
	if t.QueriedTokens > 0 {
		t.HitRate = float64(t.LocalHitTokens+t.TierHitTokens) / float64(t.QueriedTokens)
	}
	if t.Steps > 0 {
		t.EngineNsPerStep = float64(t.EngineNs) / float64(t.Steps)
	}
	slices.Sort(lat)
	t.ImportP50Ns, t.ImportP99Ns = percentile(lat, 0.50), percentile(lat, 0.99)
	slices.Sort(steps)
	t.EngineNsP50, t.EngineNsP99 = percentile(steps, 0.50), percentile(steps, 0.99)
}
