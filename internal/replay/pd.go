// The P/D replay: prefill/decode disaggregation through the tier. Every
// request is prefilled on one prefill replica (its prompt computed, its full
// blocks published; the prefill side waits for them, Cache.WaitPublished,
// before the request "transfers") and decoded on one decode replica (an
// arrival whose hit is the prompt's full blocks, all tier blocks: their rows
// are imported; the prompt's partial block and the output computed there).
// A first run without the tier, whose decode replicas recompute the prompt,
// is the baseline of the projected time to first packet; the run through
// the tier replays its client's sends (an open loop at the same load).

package replay

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/omnicache/omnicache/tier"
)

// RouteLeastLoaded sends a request to the replica of its pool with the
// fewest requests queued or running (PDOptions.Route).
const RouteLeastLoaded = "least-loaded"

// DefaultPublishTimeout bounds the prefill side's WaitPublished of one
// request (PDOptions.PublishTimeout).
const DefaultPublishTimeout = 10 * time.Second

// PDOptions control a P/D replay. Of the ReplicaOptions it takes the tier
// (Tier, Redis, TierBytes, TierRecent, TierPolicy), Histograms, OnCache
// (replicas numbered prefill first), Verify, BlockSize,
// MaxBatchedTokens, KVBlocks (the pool of all replicas, split evenly; 0:
// each replica a whole engine of its share of the concurrency),
// ImportTimeout, PacePark, AfterRound (after every step of any replica)
// and OnTier.
type PDOptions struct {
	ReplicaOptions
	// Prefill and Decode are the pools' sizes (at least 1 each).
	Prefill, Decode int
	// Route is RouteRoundRobin (default: request k to replica k mod N of
	// each pool) or RouteLeastLoaded.
	Route string
	// StepTime prices every step of a spec without a step cost (0:
	// DefaultStepTime).
	StepTime time.Duration
	// PublishTimeout bounds each request's WaitPublished (0:
	// DefaultPublishTimeout).
	PublishTimeout time.Duration
	// OnHandover, when set, is called with a request's index (from 0, in
	// the client's order) and its prompt's full blocks' hashes once its
	// prefill published them, before a decode replica may admit it
	// (tests lose values there).
	OnHandover func(req int, hashes []uint64)
	// LoadAverage is the machine's 1-minute load average when the caller
	// started (negative: unknown), for the report.
	LoadAverage float64
}

// PDReport is a P/D replay's result.
type PDReport struct {
	Name    string `json:"name"`
	Model   string `json:"model"`
	Prefill int    `json:"prefill_replicas"`
	Decode  int    `json:"decode_replicas"`
	Tier    string `json:"tier"`
	Route   string `json:"route"`
	Verify  bool   `json:"verify"`
	// KVBlocksPrefill and KVBlocksDecode are each replica's pool.
	KVBlocksPrefill int `json:"kv_blocks_prefill"`
	KVBlocksDecode  int `json:"kv_blocks_decode"`
	// Requests are the client's requests, PromptTokens their prompts.
	Requests     int64 `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	// TierRows are the token positions whose rows (every key) the decode
	// side imported; TierBytesPublished the value bytes the prefill side
	// stored, TierBytesImported the row bytes the decode side imported;
	// PublishedBytesPerRequest and ImportedBytesPerRequest per request.
	TierRows                 int64   `json:"tier_rows"`
	TierBytesPublished       int64   `json:"tier_bytes_published"`
	TierBytesImported        int64   `json:"tier_bytes_imported"`
	PublishedBytesPerRequest float64 `json:"published_bytes_per_request"`
	ImportedBytesPerRequest  float64 `json:"imported_bytes_per_request"`
	// PublishFailed are requests whose WaitPublished failed (the decode
	// side recomputed their prompts); ImportFailed decode arrivals that
	// failed with a TierImportError, OtherFailed with another error (a
	// hit over the blocks of one): both aborted and recomputed.
	// Recomputed counts the requests the decode side recomputed.
	PublishFailed int64 `json:"publish_failed"`
	ImportFailed  int64 `json:"import_failed"`
	OtherFailed   int64 `json:"other_failed"`
	Recomputed    int64 `json:"recomputed"`
	// PublishWaitP50Ns and PublishWaitP99Ns: the prefill side's
	// WaitPublished per request (wall time, from the end of the step that
	// finished its prompt).
	PublishWaitP50Ns int64 `json:"publish_wait_p50_ns"`
	PublishWaitP99Ns int64 `json:"publish_wait_p99_ns"`
	// Imports, ImportP50Ns and ImportP99Ns: the decode side's imports,
	// from a step's Begin to its tier blocks' rows in the mirror (wall
	// time): what the step's forward must cover for the engine not to
	// wait. ImportWaitP50Ns and ImportWaitP99Ns: the part of each past
	// its step's projected forward, which the engine waits (on the
	// decode replica's clock). DecodeStepNs is the projected model time
	// of a decode replica's pure-decode step (the median).
	Imports         int   `json:"imports"`
	ImportP50Ns     int64 `json:"import_p50_ns"`
	ImportP99Ns     int64 `json:"import_p99_ns"`
	ImportWaitP50Ns int64 `json:"import_wait_p50_ns"`
	ImportWaitP99Ns int64 `json:"import_wait_p99_ns"`
	DecodeStepNs    int64 `json:"decode_step_ns"`
	// TTFP: the projected time from the client's send to the first packet
	// at the next stage (every prompt row there: the end of the decode
	// step that completes the prompt, plus its Materialize when the rows
	// came as a hit), through the tier and recomputing the prompt on the
	// decode side (the run without the tier, a closed loop of
	// Concurrency requests; the run through the tier sends every request
	// when that run sent it: the same offered load). DecodeTTFP: from the
	// handover (the prefill done and published, the KV transferred) to
	// the first packet: the decode side's part.
	TTFPP50Ns                int64 `json:"ttfp_p50_ns"`
	TTFPP99Ns                int64 `json:"ttfp_p99_ns"`
	RecomputeTTFPP50Ns       int64 `json:"recompute_ttfp_p50_ns"`
	RecomputeTTFPP99Ns       int64 `json:"recompute_ttfp_p99_ns"`
	DecodeTTFPP50Ns          int64 `json:"decode_ttfp_p50_ns"`
	DecodeTTFPP99Ns          int64 `json:"decode_ttfp_p99_ns"`
	RecomputeDecodeTTFPP50Ns int64 `json:"recompute_decode_ttfp_p50_ns"`
	RecomputeDecodeTTFPP99Ns int64 `json:"recompute_decode_ttfp_p99_ns"`
	// StepCost is the projection's step cost, in words.
	StepCost string `json:"step_cost"`
	// PrefillPool and DecodePool are the pools' totals; PerReplica every
	// replica, prefill first (Replica numbers them so).
	PrefillPool ReplicaReport   `json:"prefill"`
	DecodePool  ReplicaReport   `json:"decode"`
	PerReplica  []ReplicaReport `json:"per_replica"`
	// InFlightBytes bounds the values published and not yet imported:
	// Concurrency requests of the largest prompt (its full blocks' rows of
	// every key); MaxRequestBytes is that prompt's. TierAutoSized: the
	// embedded tier's bound was not given and the run set it
	// (PDTierBytes).
	InFlightBytes   int64 `json:"in_flight_bytes"`
	MaxRequestBytes int64 `json:"max_request_bytes"`
	TierAutoSized   bool  `json:"tier_auto_sized,omitempty"`
	// With the embedded tier, as ReplicasReport's.
	TierPolicy      string `json:"tier_policy,omitempty"`
	TierStoredBytes int64  `json:"tier_stored_bytes,omitempty"`
	TierBoundBytes  int64  `json:"tier_bound_bytes,omitempty"`
	TierEvicted     int64  `json:"tier_evicted,omitempty"`
	WallNs          int64  `json:"wall_ns"`
	RecomputeWallNs int64  `json:"recompute_wall_ns"`
	// The machine: its CPUs and its 1-minute load average when the run
	// started (negative: unknown).
	CPUs        int     `json:"cpus"`
	LoadAverage float64 `json:"load_average"`
	Note        string  `json:"note,omitempty"`
}

// VerifyFailures is the wrong rows both pools found.
func (r *PDReport) VerifyFailures() int64 {
	return r.PrefillPool.VerifyFailures + r.DecodePool.VerifyFailures
}

// PDKVBlocks is each prefill and decode replica's KV pool: o.KVBlocks split
// evenly over all of them (refused as ReplicaKVBlocks refuses), or, without
// it, the pool of a whole engine of its pool's share of the concurrency.
func PDKVBlocks(spec Spec, o Options, prefill, decode int) (pre, dec int, err error) {
	o.defaults()
	if o.KVBlocks > 0 {
		per, err := ReplicaKVBlocks(spec, o, prefill+decode)
		return per, per, err
	}
	if pre, err = ReplicaKVBlocks(spec, o, prefill); err != nil {
		return 0, 0, err
	}
	dec, err = ReplicaKVBlocks(spec, o, decode)
	return pre, dec, err
}

// RunPD replays spec with o.Prefill prefill and o.Decode decode replicas
// over the tier, then without it (the decode side recomputing every
// prompt). It returns ErrVerify (wrapped) when verification found a wrong
// row; the report is complete.
func RunPD(spec Spec, o PDOptions) (*PDReport, error) {
	if o.Prefill < 1 || o.Decode < 1 {
		return nil, fmt.Errorf("bench: P/D %d:%d: want at least one replica of each", o.Prefill, o.Decode)
	}
	if o.Tier == "" {
		o.Tier = "embedded"
	}
	if o.Tier == "off" {
		return nil, fmt.Errorf("bench: P/D: the decode side's rows come through a tier: not with tier off")
	}
	if o.Route == "" {
		o.Route = RouteRoundRobin
	}
	if o.Route != RouteRoundRobin && o.Route != RouteLeastLoaded {
		return nil, fmt.Errorf("bench: P/D route %q: want %s or %s", o.Route, RouteRoundRobin, RouteLeastLoaded)
	}
	if o.AdmitAfter > 1 {
		return nil, fmt.Errorf("bench: P/D: the prefill side publishes every full block: AdmitAfter %d", o.AdmitAfter)
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	o.WaitPublish = false // the handover waits (WaitPublished)
	bo := Options{BlockSize: o.BlockSize, MaxBatchedTokens: o.MaxBatchedTokens, KVBlocks: o.KVBlocks, StepTime: o.StepTime}
	bo.defaults()
	o.BlockSize, o.MaxBatchedTokens = bo.BlockSize, bo.MaxBatchedTokens
	pre, dec, err := PDKVBlocks(spec, bo, o.Prefill, o.Decode)
	if err != nil {
		return nil, err
	}
	cost := CostOf(spec, bo)
	rep := &PDReport{Name: spec.Name, Model: spec.Model, Prefill: o.Prefill, Decode: o.Decode, Tier: tier.Redact(o.Tier),
		Route: o.Route, Verify: o.Verify, KVBlocksPrefill: pre, KVBlocksDecode: dec, StepCost: cost.Describe(),
		CPUs: runtime.NumCPU(), LoadAverage: o.LoadAverage}
	spec, rep.Note = immediateKeys(spec, o.Tier)

	// The baseline: no tier, the decode side recomputes every prompt.
	base := o
	base.Verify, base.Tier, base.AfterRound, base.OnHandover, base.OnCache = false, "off", nil, nil, nil
	wall := time.Now()
	rb, err := runPD(spec, base, cost, pre, dec, nil, nil)
	rep.RecomputeWallNs = time.Since(wall).Nanoseconds()
	if err != nil {
		return rep, fmt.Errorf("%s (without the tier): %w", spec.Name, err)
	}
	rep.RecomputeTTFPP50Ns, rep.RecomputeTTFPP99Ns = rb.ttfp.P50, rb.ttfp.P99
	rep.RecomputeDecodeTTFPP50Ns, rep.RecomputeDecodeTTFPP99Ns = rb.decodeTTFP.P50, rb.decodeTTFP.P99

	if err := rep.sizeTier(spec, &o); err != nil {
		return rep, err
	}
	tr, emb, err := openTier(spec, o.ReplicaOptions)
	if err != nil {
		return rep, err
	}
	defer tr.Close()
	if emb != nil {
		rep.TierPolicy = string(emb.Policy())
	}
	wall = time.Now()
	// The client sends as it did without the tier: the same offered load.
	// A closed loop would send sooner behind a faster decode side and queue
	// more at the prefill side, so that ttfp from the send compared two
	// loads.
	sends := make([]float64, len(rb.reqs))
	for i, q := range rb.reqs {
		sends[i] = q.sent
	}
	r, err := runPD(spec, o, cost, pre, dec, tr, sends)
	rep.WallNs = time.Since(wall).Nanoseconds()
	if emb != nil {
		rep.TierStoredBytes, rep.TierBoundBytes, rep.TierEvicted = emb.Usage()
	}
	if r != nil {
		r.fill(rep)
	}
	if err != nil {
		return rep, fmt.Errorf("%s: %w", spec.Name, err)
	}
	if n := rep.VerifyFailures(); n > 0 {
		return rep, fmt.Errorf("%s: %w: %d wrong rows (%d repeated, %d missing) over %d:%d replicas", spec.Name, ErrVerify, n,
			rep.PrefillPool.VerifyRepeated+rep.DecodePool.VerifyRepeated, rep.PrefillPool.VerifyMissing+rep.DecodePool.VerifyMissing,
			o.Prefill, o.Decode)
	}
	return rep, nil
}

// fill sets the report's figures from a finished run.
func (r *pdResult) fill(rep *PDReport) {
	rep.Requests, rep.PromptTokens = int64(len(r.reqs)), r.promptTokens
	rep.PrefillPool, rep.DecodePool, rep.PerReplica = r.prefill, r.decode, r.per
	rep.TierRows = r.decode.TierHitTokens
	rep.TierBytesPublished, rep.TierBytesImported = r.prefill.TierBytesPublished, r.decode.TierBytesImported
	if n := float64(len(r.reqs)); n > 0 {
		rep.PublishedBytesPerRequest = float64(rep.TierBytesPublished) / n
		rep.ImportedBytesPerRequest = float64(rep.TierBytesImported) / n
	}
	rep.PublishFailed, rep.ImportFailed, rep.OtherFailed, rep.Recomputed = r.publishFailed, r.importFailed, r.otherFailed, r.recomputed
	slices.Sort(r.pubWait)
	rep.PublishWaitP50Ns, rep.PublishWaitP99Ns = percentile(r.pubWait, 0.50), percentile(r.pubWait, 0.99)
	rep.Imports, rep.ImportP50Ns, rep.ImportP99Ns = r.decode.Imports, r.decode.ImportP50Ns, r.decode.ImportP99Ns
	slices.Sort(r.importWait)
	rep.ImportWaitP50Ns, rep.ImportWaitP99Ns = percentile(r.importWait, 0.50), percentile(r.importWait, 0.99)
	slices.Sort(r.decodeSteps)
	rep.DecodeStepNs = percentile(r.decodeSteps, 0.50)
	rep.TTFPP50Ns, rep.TTFPP99Ns = r.ttfp.P50, r.ttfp.P99
	rep.DecodeTTFPP50Ns, rep.DecodeTTFPP99Ns = r.decodeTTFP.P50, r.decodeTTFP.P99
}

// PDTierHeadroom is the least embedded tier's bound a P/D run sets, in
// multiples of the values in flight (PDReport.InFlightBytes): the store's
// eviction does not know which values still wait for their import (a value
// already imported was touched later than one still waiting; S3-FIFO
// evicts a value never read from its small queue first), so a bound of
// just the values in flight evicts some that wait. MiniCPM-o/P4096_h0_c32,
// 64 requests of 32 MiB, 32 in flight: 1 GiB recomputed 17 requests, 2 GiB
// none (replay --pd 1:2 --verify --tier-mib); MiniCPM-o/P1024_h0_c64, 128
// requests of 8 MiB, 64 in flight: 1 GiB (2x) recomputed 2.
const PDTierHeadroom = 2

// PDMaxAutoTierBytes caps the bound a P/D run sets by itself: a run that
// needs more says so (PDReport.InFlightBytes) and takes --tier-mib.
const PDMaxAutoTierBytes = 4 << 30

// sizeTier sets the report's in-flight bytes and, with the embedded tier
// and no bound given, the tier's bound: room for every value the run
// publishes (its rows and a sixteenth for the values' headers and keys),
// or PDTierHeadroom times the values in flight if that is more, at least
// tier.DefaultEmbeddedBytes, at most PDMaxAutoTierBytes.
func (rep *PDReport) sizeTier(spec Spec, o *PDOptions) error {
	rowBytes := int64(keyRowBytesSum(spec.Keys))
	src := spec.Source()
	var total int64
	for {
		q, ok, err := src.Next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		n := int64(len(q.Prompt)/o.BlockSize*o.BlockSize) * rowBytes
		rep.MaxRequestBytes = max(rep.MaxRequestBytes, n)
		total += n
	}
	rep.InFlightBytes = int64(spec.Concurrency) * rep.MaxRequestBytes
	if o.Tier != "embedded" || o.TierBytes != 0 {
		return nil
	}
	o.TierBytes = min(max(PDTierHeadroom*rep.InFlightBytes, total+total/16, tier.DefaultEmbeddedBytes), PDMaxAutoTierBytes)
	rep.TierAutoSized = true
	return nil
}
