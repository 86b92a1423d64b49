// The replay with replicas: N simulated engines behind a router, sharing a
// simulated KV store and one tier (package tier), each with its own cache.

package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/bench/sim"
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
	// Route is RouteRoundRobin (default) or RouteSession.
	Route string
	// Verify checks every row Materialize returns on every replica, and
	// each replica's mirror at the end, against the oracle.
	Verify bool
	// BlockSize and MaxBatchedTokens as Options.
	BlockSize, MaxBatchedTokens int
	// KVBlocks is the KV pool over all replicas, split evenly (0: the
	// automatic pool of one engine serving the spec: AutoKVBlocks). Each
	// replica runs ceil(Concurrency/Replicas) requests at once.
	KVBlocks int
	// SharedKVBlocks bounds the simulated shared KV store (blocks, oldest
	// out first; 0: 4 × KVBlocks).
	SharedKVBlocks int
	// ImportTimeout is TierConfig.ImportTimeout (0: its default).
	ImportTimeout time.Duration
	// AfterRound, when set, is called after every round of the cache-on
	// run (one step of each replica still running), with the round's index
	// (tests kill a tier node mid-run).
	AfterRound func(round int)
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
	Imports                int   `json:"imports"`
	ImportP50Ns            int64 `json:"import_latency_p50_ns"`
	ImportP99Ns            int64 `json:"import_latency_p99_ns"`
	// EngineNs is the engine goroutine's time in Begin + Save + Discard;
	// MaterializeNs the time in Materialize (called right after Save here,
	// so it includes waiting for the step's imports and prefetch; an
	// engine calls it a step late, on its output goroutine); LookupNs the
	// time in Cache.Lookup (the scheduler's tier query, a network round
	// trip on Redis).
	EngineNs        int64   `json:"engine_ns_total"`
	EngineNsPerStep float64 `json:"engine_ns_per_step_mean"`
	MaterializeNs   int64   `json:"materialize_ns_total"`
	// PaceNs is the time waited, untimed, in the forward of every step that
	// is not a pure decode (Options.Pace's Sync): the simulator's forward
	// takes no time, a real one gives the committer (and a step's tier
	// import, fetched since Begin) that long. StallNs is the cache's
	// Stats.StallNanos: waits inside Save on back-pressure.
	PaceNs         int64 `json:"pace_ns_total"`
	StallNs        int64 `json:"stall_ns_total"`
	LookupNs       int64 `json:"lookup_ns_total"`
	LookupErrors   int64 `json:"lookup_errors"`
	RequestErrors  int64 `json:"request_errors"`
	VerifiedRows   int64 `json:"verified_rows"`
	VerifyFailures int64 `json:"verify_failures"`
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
	total := KVPool(spec, bo)
	rep := &ReplicasReport{Name: spec.Name, Replicas: o.Replicas, Tier: o.Tier, Route: o.Route, KVBlocks: total, Verify: o.Verify}
	keys := slices.Clone(spec.Keys)
	for i := range keys {
		if keys[i].Deferred && o.Tier != "off" {
			keys[i].Deferred = false
			rep.Note = "deferred keys run immediate (a tier keeps immediate keys only)"
		}
	}
	spec.Keys = keys

	single, err := Simulate(spec, bo, true)
	if err != nil {
		return rep, err
	}
	rep.SingleHitRate = single.HitRate()
	local, err := runReplicas(spec, o, total, nil, false)
	if err != nil {
		return rep, err
	}
	rep.LocalOnlyHitRate = local.HitRate

	var tr *tier.Tier
	if o.Tier != "off" {
		var b tier.Backend
		if o.Tier == "embedded" {
			b, err = tier.NewEmbedded(o.TierBytes)
		} else {
			b, err = tier.Open(o.Tier, o.Redis)
		}
		if err != nil {
			return rep, fmt.Errorf("tier %s: %w", o.Tier, err)
		}
		// A namespace of its own per run: a server kept from an earlier
		// run must not lend this one hits.
		ns := tier.Namespace{Model: fmt.Sprintf("%s/%s/%x", spec.Model, spec.Name, time.Now().UnixNano()), BlockSize: o.BlockSize}
		for _, k := range spec.Keys {
			ns.Keys = append(ns.Keys, tier.Key{Name: k.Name, RowBytes: k.RowBytes})
		}
		if tr, err = tier.New(b, ns, tier.Options{}); err != nil {
			b.Close()
			return rep, err
		}
		defer tr.Close()
	}
	wall := time.Now()
	res, err := runReplicas(spec, o, total, tr, true)
	rep.WallNs = time.Since(wall).Nanoseconds()
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

type replicasResult struct {
	ReplicaReport
	per []ReplicaReport
}

// runReplicas runs the replicas in turn, one step each, on this goroutine
// (each replica's calls are its engine goroutine's). withCache false runs
// the simulators alone (no cache, no tier).
func runReplicas(spec Spec, o ReplicaOptions, total int, tr *tier.Tier, withCache bool) (*replicasResult, error) {
	n := o.Replicas
	per := total / n
	conc := (spec.Concurrency + n - 1) / n
	kvCap := o.SharedKVBlocks
	if kvCap <= 0 {
		kvCap = 4 * total
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
		r := &replica{idx: i, kv: kv, keys: spec.Keys, o: o}
		reps[i] = r
		scfg := sim.Config{BlockSize: o.BlockSize, NumBlocks: per, MaxBatchedTokens: o.MaxBatchedTokens,
			Concurrency: conc, MaxModelLen: spec.MaxModelLen, Vocab: Vocab, FullBlocks: true}
		if tr != nil {
			scfg.External = r
		}
		var err error
		if r.s, err = sim.New(scfg, rt.source(i)); err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
		if !withCache {
			continue
		}
		cfg := omnicache.Config{NumBlocks: per, BlockSize: o.BlockSize, Keys: spec.Keys, StagingCapacityTokens: o.MaxBatchedTokens}
		if tr != nil {
			cfg.Tier = &omnicache.TierConfig{Tier: tr, ImportTimeout: o.ImportTimeout, OnImport: r.onImport}
		}
		if r.c, err = omnicache.New(cfg); err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
		if o.Verify {
			r.ver = newVerifier(spec.Keys, per*o.BlockSize, o.BlockSize)
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
	var lat []int64
	for _, r := range reps {
		pr, err := r.finish()
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", r.idx, err)
		}
		res.per = append(res.per, pr)
		res.add(pr)
		lat = append(lat, r.lat...)
	}
	res.Replica = -1
	res.finishRates(lat)
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
	t.Imports += pr.Imports
	t.EngineNs += pr.EngineNs
	t.MaterializeNs += pr.MaterializeNs
	t.PaceNs += pr.PaceNs
	t.StallNs += pr.StallNs
	t.LookupNs += pr.LookupNs
	t.LookupErrors += pr.LookupErrors
	t.RequestErrors += pr.RequestErrors
	t.VerifiedRows += pr.VerifiedRows
	t.VerifyFailures += pr.VerifyFailures
}

// finishRates computes the hit rate, engine time per step and import
// latency percentiles from the counts and the latencies.
func (t *ReplicaReport) finishRates(lat []int64) {
	if t.QueriedTokens > 0 {
		t.HitRate = float64(t.LocalHitTokens+t.TierHitTokens) / float64(t.QueriedTokens)
	}
	if t.Steps > 0 {
		t.EngineNsPerStep = float64(t.EngineNs) / float64(t.Steps)
	}
	slices.Sort(lat)
	t.ImportP50Ns, t.ImportP99Ns = percentile(lat, 0.50), percentile(lat, 0.99)
}

// replica is one engine: its simulator, its cache and its verifier.
type replica struct {
	idx  int
	o    ReplicaOptions
	keys []omnicache.Key
	s    *sim.Sim
	c    *omnicache.Cache
	ver  *verifier
	kv   *sharedKV
	res  omnicache.Result
	rec  stepRecord
	done bool

	mu  sync.Mutex
	lat []int64 // import latencies (OnImport, on the committer)

	engineNs, matNs, paceNs, lookupNs, lookupErrs, reqErrs, failedTok int64
}

// Load implements sim.External: the leading blocks the shared KV store
// holds, intersected with what the tier holds (the rows must follow).
func (r *replica) Load(hashes []uint64) int {
	n := r.kv.leading(hashes)
	if n == 0 || r.c == nil {
		return 0
	}
	t := time.Now()
	m, err := r.c.Lookup(hashes[:n])
	r.lookupNs += time.Since(t).Nanoseconds()
	if err != nil {
		r.lookupErrs++
	}
	return m
}

func (r *replica) onImport(e omnicache.ImportEvent) {
	r.mu.Lock()
	r.lat = append(r.lat, e.Latency.Nanoseconds())
	r.mu.Unlock()
}

// step runs one engine step (done when the replica has no work left).
func (r *replica) step() error {
	st, err := r.s.Next()
	if err != nil {
		return err
	}
	if st == nil {
		r.done = true
		return nil
	}
	if r.c == nil { // simulator alone
		r.kv.add(st.Plan.FullHashes)
		return nil
	}
	t := time.Now()
	if err := r.c.Begin(&st.Plan); err != nil {
		return fmt.Errorf("step %d: begin: %w", st.Index, err)
	}
	r.engineNs += time.Since(t).Nanoseconds()
	r.s.Release()
	out := omnicache.Outputs{Tokens: st.Tokens, Padded: st.Tokens}
	bufs := make([][]byte, len(r.keys))
	for k, kk := range r.keys {
		bufs[k] = make([]byte, st.Tokens*kk.RowBytes)
	}
	if r.ver != nil {
		r.ver.imported(st) // the imports land ahead of the step's own rows
		r.ver.produce(r.s, st, bufs)
	}
	for k := range bufs {
		out.Tensors = append(out.Tensors, omnicache.Tensor{Host: bufs[k], Rows: st.Tokens, Owned: true})
	}
	r.rec.set(st)
	if !st.PureDecode {
		t = time.Now()
		if err := r.c.Sync(); err != nil {
			return fmt.Errorf("step %d: pacing sync: %w", st.Index, err)
		}
		r.paceNs += time.Since(t).Nanoseconds()
	}
	t = time.Now()
	id, err := r.c.Save(&out)
	if err != nil {
		return fmt.Errorf("step %d: save: %w", st.Index, err)
	}
	r.engineNs += time.Since(t).Nanoseconds()
	r.s.Advance()
	r.kv.add(st.Plan.FullHashes) // the step's KV exists now: the shared store has it
	if r.ver == nil && len(r.rec.hits) == 0 {
		t = time.Now()
		err := r.c.Discard(id)
		r.engineNs += time.Since(t).Nanoseconds()
		return err
	}
	asked := r.rec.hits
	if r.ver != nil {
		asked = r.rec.ids
	}
	t = time.Now()
	err = r.c.Materialize(id, asked, &r.res)
	r.matNs += time.Since(t).Nanoseconds()
	var re *omnicache.RequestError
	if err != nil && !errors.As(err, &re) {
		return fmt.Errorf("step %d: materialize: %w", st.Index, err)
	}
	served := asked
	if re != nil {
		served = r.failed(st, asked)
	}
	if r.ver != nil {
		r.ver.check(&r.rec, served, servedRows{&r.res, asked, served})
	}
	return nil
}

// failed counts the requests Materialize could not serve and returns the
// served ones. A request whose tier import lost a block would be recomputed
// by a real engine: its loaded tokens are no hit, and the slots of its
// blocks are not verified (their rows are whatever was there: the cache
// refuses to serve them).
func (r *replica) failed(st *sim.Step, asked []int64) []int64 {
	var served []int64
	for i, id := range asked {
		err := r.res.Err(i)
		if err == nil {
			served = append(served, id)
			continue
		}
		r.reqErrs++
		if errors.Is(err, omnicache.ErrTierMiss) {
			blocks := r.ver.forget(st, r.o.BlockSize, id) // a nil verifier only counts
			r.failedTok += int64(blocks * r.o.BlockSize)
		}
	}
	return served
}

// finish syncs and checks the replica's mirror, closes its cache and
// reports.
func (r *replica) finish() (ReplicaReport, error) {
	pr := ReplicaReport{Replica: r.idx, Requests: r.s.Arrived, Steps: r.s.Steps, QueriedTokens: r.s.Queried,
		LocalHitTokens: r.s.Hit - r.s.ExtHit, TierHitTokens: r.s.ExtHit - r.failedTok, TierImportFailedTokens: r.failedTok,
		EngineNs: r.engineNs, MaterializeNs: r.matNs, PaceNs: r.paceNs, LookupNs: r.lookupNs, LookupErrors: r.lookupErrs, RequestErrors: r.reqErrs}
	if r.c != nil {
		if err := r.c.Sync(); err != nil {
			return pr, fmt.Errorf("sync: %w", err)
		}
		if r.ver != nil {
			if err := r.ver.checkMirror(RealCacheOf(r.c), r.s.Steps); err != nil {
				return pr, err
			}
			pr.VerifiedRows, pr.VerifyFailures = r.ver.rows, r.ver.failures
		}
		err := r.c.Close() // the publisher drains: every publish counted
		st := r.c.Stats()
		r.c = nil
		if err != nil {
			return pr, fmt.Errorf("close: %w", err)
		}
		pr.TierBytesPublished, pr.TierBytesImported, pr.TierPublishDropped = st.TierBytesPublished, st.TierBytesImported, st.TierPublishDropped
		pr.StallNs = st.StallNanos
	}
	r.mu.Lock()
	lat := slices.Clone(r.lat)
	r.mu.Unlock()
	pr.Imports = len(lat)
	pr.finishRates(lat)
	return pr, nil
}

func (r *replica) close() {
	if r.c != nil {
		r.c.Close()
		r.c = nil
	}
}

// RealCacheOf adapts c for the verifier's mirror check.
func RealCacheOf(c *omnicache.Cache) Cache { return &RealCache{C: c} }

// servedRows is the Rows of the requests served: res holds every request
// asked, in order; served is the subsequence without the failed ones.
type servedRows struct {
	res           *omnicache.Result
	asked, served []int64
}

func (s servedRows) idx(i int) int {
	if len(s.served) == len(s.asked) {
		return i
	}
	j := 0
	for n := 0; ; j++ {
		if s.asked[j] == s.served[n] {
			if n == i {
				return j
			}
			n++
		}
	}
}

func (s servedRows) Len() int             { return len(s.served) }
func (s servedRows) ID(i int) int64       { return s.res.ID(s.idx(i)) }
func (s servedRows) Prefix(i int) int     { return s.res.Prefix(s.idx(i)) }
func (s servedRows) Tokens(i int) int     { return s.res.Tokens(s.idx(i)) }
func (s servedRows) Rows(i, k int) []byte { return s.res.Rows(s.idx(i), k) }

// sharedKV is the simulated shared KV store: the chained hashes of the
// blocks any replica computed, oldest out first past its capacity.
type sharedKV struct {
	cap  int
	set  map[uint64]struct{}
	ring []uint64
	next int
}

func newSharedKV(capBlocks int) *sharedKV {
	return &sharedKV{cap: capBlocks, set: make(map[uint64]struct{}, capBlocks)}
}

func (kv *sharedKV) add(hashes []uint64) {
	for _, h := range hashes {
		if _, ok := kv.set[h]; ok {
			continue
		}
		if len(kv.ring) < kv.cap {
			kv.ring = append(kv.ring, h)
		} else {
			delete(kv.set, kv.ring[kv.next])
			kv.ring[kv.next] = h
			kv.next = (kv.next + 1) % kv.cap
		}
		kv.set[h] = struct{}{}
	}
}

func (kv *sharedKV) leading(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := kv.set[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// router hands a shared source's requests to the replicas' sources: round
// robin, or by session (the hash of the prompt's first block).
type router struct {
	src   sim.Source
	n     int
	route string
	bs    int
	k     int
	queue [][]sim.Request
	done  bool
	err   error
}

func newRouter(src sim.Source, n int, route string, bs int) *router {
	return &router{src: src, n: n, route: route, bs: bs, queue: make([][]sim.Request, n)}
}

func (rt *router) source(i int) sim.Source { return routed{rt, i} }

type routed struct {
	rt *router
	i  int
}

// Next pulls from the shared source until a request for replica i comes
// (the others wait in their replicas' queues).
func (s routed) Next() (sim.Request, bool, error) {
	rt := s.rt
	for len(rt.queue[s.i]) == 0 {
		if rt.done {
			return sim.Request{}, false, rt.err
		}
		q, ok, err := rt.src.Next()
		if err != nil || !ok {
			rt.done, rt.err = true, err
			continue
		}
		to := rt.k % rt.n
		if rt.route == RouteSession {
			h := sim.RootHash
			for _, t := range q.Prompt[:min(len(q.Prompt), rt.bs)] {
				h = sim.Mix(h, t)
			}
			to = int(h % uint64(rt.n))
		}
		rt.k++
		rt.queue[to] = append(rt.queue[to], q)
	}
	q := rt.queue[s.i][0]
	rt.queue[s.i] = rt.queue[s.i][1:]
	return q, true, nil
}

// WriteReplicaTable writes the per-replica and total lines of reps.
func WriteReplicaTable(w interface{ Write([]byte) (int, error) }, reps []*ReplicasReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %-9s %-28s %8s %8s %10s %10s %9s %9s %9s %10s %10s %10s %8s\n", "workload", "replica", "tier",
		"hit", "local", "local tok", "tier tok", "publ", "impt", "imp p50", "imp p99", "eng/step", "mat/step", "verify")
	for _, r := range reps {
		line := func(name string, x ReplicaReport) {
			fmt.Fprintf(&b, "%-22s %-9s %-28s %8s %8s %10d %10d %9s %9s %9s %10s %10s %10s %8s\n", shortName(r.Name), name, shortTier(r.Tier),
				pct(x.HitRate, 1), pct(float64(x.LocalHitTokens)/math.Max(1, float64(x.QueriedTokens)), 1),
				x.LocalHitTokens, x.TierHitTokens, shortBytes(x.TierBytesPublished), shortBytes(x.TierBytesImported),
				dur(float64(x.ImportP50Ns)), dur(float64(x.ImportP99Ns)), dur(x.EngineNsPerStep),
				dur(float64(x.MaterializeNs)/math.Max(1, float64(x.Steps))), verifyCol(r.Verify, x.VerifyFailures))
		}
		for _, pr := range r.PerReplica {
			line(fmt.Sprint(pr.Replica), pr)
		}
		line(fmt.Sprintf("all %d", r.Replicas), r.ReplicaReport)
		fmt.Fprintf(&b, "%-22s one engine with the whole pool: hit %s; these %d replicas without a tier: hit %s\n",
			"", pct(r.SingleHitRate, 1), r.Replicas, pct(r.LocalOnlyHitRate, 1))
		if r.Note != "" {
			fmt.Fprintf(&b, "%-22s note: %s\n", "", r.Note)
		}
	}
	_, err := w.Write([]byte(b.String()))
	return err
}

func shortTier(s string) string {
	if len(s) > 28 {
		return s[:25] + "..."
	}
	return s
}

func verifyCol(on bool, failures int64) string {
	if !on {
		return "-"
	}
	if failures == 0 {
		return "ok"
	}
	return fmt.Sprint(failures)
}
