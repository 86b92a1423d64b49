// One replica of the replay with replicas: its engine steps, its failed
// requests, its report.

package replay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
	"github.com/omnicache/omnicache/tier"
)

// replicaSetup is what newReplica makes a replica of.
type replicaSetup struct {
	idx, blocks, conc int
	src               sim.Source
	kv                *sharedKV // nil: none (the P/D replay)
	// tier, when set, is shared by the replicas' caches; external is then
	// the simulator's KV connector, or with loadShared the replica itself
	// (Load: the shared KV store, intersected with the tier).
	tier       *tier.Tier
	external   sim.External
	loadShared bool
	withCache  bool
	fullBlocks bool // publish the full blocks a step computes
	// tierConfig adjusts the cache's TierConfig.
	tierConfig func(*omnicache.TierConfig)
}

// newReplica makes replica rs.idx of spec: its simulator and, withCache,
// its cache and verifier.
func newReplica(spec Spec, o ReplicaOptions, rs replicaSetup) (*replica, error) {
	r := &replica{idx: rs.idx, kv: rs.kv, keys: spec.Keys, o: o}
	scfg := sim.Config{BlockSize: o.BlockSize, NumBlocks: rs.blocks, MaxBatchedTokens: o.MaxBatchedTokens,
		Concurrency: rs.conc, MaxModelLen: spec.MaxModelLen, Vocab: Vocab, FullBlocks: rs.fullBlocks}
	if rs.tier != nil {
		scfg.External = rs.external
		if rs.loadShared {
			scfg.External = r
		}
	}
	if spec.Sim != nil {
		spec.Sim(&scfg)
	}
	var err error
	if r.s, err = sim.New(scfg, rs.src); err != nil {
		return nil, fmt.Errorf("replica %d: %w", rs.idx, err)
	}
	if !rs.withCache {
		return r, nil
	}
	cfg := omnicache.Config{NumBlocks: rs.blocks, BlockSize: o.BlockSize, Keys: spec.Keys, StagingCapacityTokens: o.MaxBatchedTokens}
	if !o.PacePark {
		cfg.SyncSpin = omnicache.MaxSyncSpin
	}
	r.rowBytes = keyRowBytes(spec.Keys)
	r.pool = newBufPool(r.rowBytes, o.MaxBatchedTokens, true)
	cfg.ReleaseHost = r.pool.release
	if rs.tier != nil {
		cfg.Tier = &omnicache.TierConfig{Tier: rs.tier, ImportTimeout: o.ImportTimeout, OnImport: r.onImport, AdmitAfter: o.AdmitAfter}
		if rs.tierConfig != nil {
			rs.tierConfig(cfg.Tier)
		}
	}
	cfg.Histograms = o.Histograms
	if r.c, err = omnicache.New(cfg); err != nil {
		return nil, fmt.Errorf("replica %d: %w", rs.idx, err)
	}
	if o.OnCache != nil {
		o.OnCache(rs.idx, r.c)
	}
	if o.Verify {
		r.ver = newVerifier(spec.Keys, rs.blocks*o.BlockSize, o.BlockSize)
	}
	return r, nil
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
	// pool recycles the step's output buffers (Config.ReleaseHost), as the
	// one-engine replay and an engine's buffer pool do. Allocated afresh
	// every step (and, without --verify, never written: backed by the
	// kernel's zero page, then copied on write when the garbage collector
	// handed their memory out again), they cost the synthetic trace with
	// the embedded tier many times the TLB-shootdown interrupts of a run
	// with the pool (perf's tlb:tlb_flush counts them: the copy-on-write
	// faults of the reused memory, whose shootdowns interrupt every core
	// the process runs on, the engine goroutine's included).
	pool     *bufPool
	rowBytes []int

	mu       sync.Mutex
	lat      []int64      // import latencies (OnImport, on the committer)
	nImports atomic.Int64 // len(lat)

	// The last step (nil after an idle Next), its engine time and its
	// Materialize time (-1: discarded), and the requests Materialize
	// failed: what the P/D replay reads after each step.
	last        *sim.Step
	lastEngine  int64
	lastMat     int64
	lastFailed  []int64
	lastFailErr []error

	engineNs, matNs, paceNs, lookupNs, lookupErrs, reqErrs, failedTok int64
	beginNs, saveNs, discardNs                                        int64
	stepNs                                                            []int64 // engine time per step
	stepAt                                                            []int64 // wall clock (unix ns) at the end of each step
}

// Load implements sim.External: the leading blocks the shared KV store
// holds, intersected with what the tier holds (the rows must follow).
func (r *replica) Load(hashes []uint64) int {
	n := r.kv.leading(hashes)
	if n == 0 || r.c == nil {
		return 0
	}
	t := time.Now()
	m, err := r.c.Lookup(context.Background(), hashes[:n])
	r.lookupNs += time.Since(t).Nanoseconds()
	if err != nil {
		r.lookupErrs++
	}
	r.kv.touch(hashes[:m])
	return m
}

func (r *replica) onImport(e omnicache.ImportEvent) {
	r.mu.Lock()
	r.nImports.Store(int64(len(r.lat) + 1))
	r.lat = append(r.lat, e.Latency.Nanoseconds())
	r.mu.Unlock()
}

// importLatency waits until the replica's cache reported its nth import
// (OnImport runs on the committer right after the import's rows are in the
// mirror, so just after a Materialize that waited for them) and returns
// that import's latency.
func (r *replica) importLatency(n int) (int64, error) {
	for deadline := time.Now().Add(time.Second); r.nImports.Load() < int64(n); {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("import %d not reported (%d were)", n, r.nImports.Load())
		}
		runtime.Gosched()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lat[n-1], nil
}

// engineStep records one step's engine time.
func (r *replica) engineStep(ns int64) {
	r.lastEngine = ns
	r.engineNs += ns
	r.stepNs = append(r.stepNs, ns)
	r.stepAt = append(r.stepAt, time.Now().UnixNano())
}

// step runs one engine step (done when the replica has no work left).
// An idle simulator (sim.ErrIdle) runs no step.
func (r *replica) step() error {
	r.last, r.lastEngine, r.lastMat = nil, 0, -1
	r.lastFailed, r.lastFailErr = r.lastFailed[:0], r.lastFailErr[:0]
	st, err := r.s.Next()
	if errors.Is(err, sim.ErrIdle) {
		return nil
	}
	if err != nil {
		return err
	}
	if st == nil {
		r.done = true
		return nil
	}
	r.last = st
	if r.c == nil { // simulator alone
		if r.kv != nil {
			r.kv.add(st.Plan.FullHashes)
		}
		return nil
	}
	if r.ver != nil {
		r.ver.replaced(st) // every step before is checked already
	}
	rg := region("begin")
	t := time.Now()
	if err := r.c.Begin(&st.Plan); err != nil {
		return fmt.Errorf("step %d: begin: %w", st.Index, err)
	}
	begin := time.Since(t).Nanoseconds()
	r.beginNs += begin
	endRegion(rg)
	r.s.Release()
	out := omnicache.Outputs{Tokens: st.Tokens, Padded: st.Tokens}
	if st.RowH != nil {
		out.Accepted = st.Accepted // speculative decoding
	}
	bufs := r.pool.get(st.Tokens).slices(st.Tokens, r.rowBytes)
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
		// WaitPublish: the forward also gives the publishers time, the
		// blocks gathered so far reach the tier (bounded: a stuck tier
		// only costs hits). The engine goroutine yields rather than sleeps,
		// as an engine thread synchronizing with its GPU keeps its core: a
		// sleep here would hand the timed Save that follows a cold cache
		// (runs with a tier would wait, and so pay, far more than runs
		// without).
		for end := time.Now().Add(time.Second); r.o.WaitPublish && r.c.Stats().TierPublishPending > 0 && time.Now().Before(end); {
			for range 32 { // Stats takes the cache's locks: not on every turn
				runtime.Gosched()
			}
		}
		r.paceNs += time.Since(t).Nanoseconds()
	}
	rg = region("save")
	t = time.Now()
	id, err := r.c.Save(&out)
	if err != nil {
		return fmt.Errorf("step %d: save: %w", st.Index, err)
	}
	save := time.Since(t).Nanoseconds()
	r.saveNs += save
	endRegion(rg)
	r.s.Advance()
	if r.kv != nil {
		r.kv.add(st.Plan.FullHashes) // the step's KV exists now: the shared store has it
	}
	if r.ver == nil && len(r.rec.hits) == 0 {
		rg = region("discard")
		t = time.Now()
		err := r.c.Discard(id)
		discard := time.Since(t).Nanoseconds()
		r.discardNs += discard
		endRegion(rg)
		r.engineStep(begin + save + discard)
		return err
	}
	r.engineStep(begin + save)
	asked := r.rec.hits
	if r.ver != nil {
		asked = r.rec.ids
	}
	t = time.Now()
	err = r.c.Materialize(id, asked, &r.res)
	r.lastMat = time.Since(t).Nanoseconds()
	r.matNs += r.lastMat
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
		r.lastFailed, r.lastFailErr = append(r.lastFailed, id), append(r.lastFailErr, err)
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
		EngineNs: r.engineNs, BeginNs: r.beginNs, SaveNs: r.saveNs, DiscardNs: r.discardNs, MaterializeNs: r.matNs, PaceNs: r.paceNs, LookupNs: r.lookupNs, LookupErrors: r.lookupErrs, RequestErrors: r.reqErrs}
	if r.c != nil {
		if err := r.c.Sync(); err != nil {
			return pr, fmt.Errorf("sync: %w", err)
		}
		if r.ver != nil {
			if err := r.ver.checkMirror(RealCacheOf(r.c), r.s.Steps); err != nil {
				return pr, err
			}
			pr.VerifiedRows, pr.VerifyFailures = r.ver.rows, r.ver.failures
			pr.VerifyRepeated, pr.VerifyMissing = r.ver.repeated, r.ver.missing
		}
		err := r.c.Close() // the publisher drains: every publish counted
		st := r.c.Stats()
		r.c = nil
		if err != nil {
			return pr, fmt.Errorf("close: %w", err)
		}
		pr.TierBytesPublished, pr.TierBytesImported, pr.TierPublishDropped = st.TierBytesPublished, st.TierBytesImported, st.TierPublishDropped
		pr.TierPublishRecent = st.TierPublishRecent
		pr.TierPublishUnadmitted = st.TierPublishUnadmitted
		pr.StallNs = st.StallNanos
	}
	r.mu.Lock()
	lat := slices.Clone(r.lat)
	r.mu.Unlock()
	pr.Imports = len(lat)
	pr.finishRates(lat, slices.Clone(r.stepNs))
	pr.StepsPerSec = windowCounts(r.stepAt, time.Second)
	pr.StepsPerSecP50, pr.StepsPerSecMin = windowRates(pr.StepsPerSec, time.Second)
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
func (s servedRows) From(i int) int       { return s.res.From(s.idx(i)) }
func (s servedRows) Rows(i, k int) []byte { return s.res.Rows(s.idx(i), k) }
