package bench

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/bench/sim"
)

// Spec is one replay: where its requests come from and what the model looks
// like.
type Spec struct {
	Name  string
	Model string
	// Keys are the per-token outputs the forward produces and the cache
	// keeps, in Outputs.Tensors order.
	Keys        []omnicache.Key
	Concurrency int
	// Prompts is the number of requests Source yields.
	Prompts int
	// MaxModelLen bounds prompt+output tokens of any request.
	MaxModelLen int
	// Ref is what the reference measured (zero for a trace).
	Ref Reference
	// Cost is the model's step cost (zero: a constant Options.StepTime).
	Cost StepCost
	// KVBlocks overrides the automatic KV pool size when > 0.
	KVBlocks int
	// Source returns a fresh source of the requests (called once a run).
	Source func() sim.Source
}

// Defaults of Options.
const (
	DefaultMaxBatchedTokens = 8192
	DefaultBlockSize        = 16
	DefaultMirrorBudget     = 1 << 30
	DefaultStepTime         = 20 * time.Millisecond
)

// Options control one replay run.
type Options struct {
	// Cache on drives the cache; off runs the simulator alone (no cache
	// call at all).
	Cache bool
	// Verify fills every output row from the oracle and checks every row
	// Materialize returns (every step is materialized) and, after Sync, the
	// mirror. Verification time is not cache time.
	Verify bool
	// NotOwned reuses one engine buffer for all steps (Owned false) instead
	// of handing the cache owned buffers (recycled through
	// Config.ReleaseHost).
	NotOwned bool
	// MaxBatchedTokens is the engine's per-step token budget (default 8192);
	// it is also the cache's staging page capacity.
	MaxBatchedTokens int
	// BlockSize is the KV block size (default 16).
	BlockSize int
	// KVBlocks sizes the KV pool (and the cache's slot space); 0 is
	// automatic: enough for Concurrency requests of MaxModelLen tokens,
	// capped so that the mirror stays within MirrorBudget bytes, and never
	// less than one request.
	KVBlocks int
	// MirrorBudget caps the automatic KV pool (default 1 GiB).
	MirrorBudget int64
	// StagingDepth is the cache's staging page count (0: its default).
	StagingDepth int
	// DisableDecodeBuffer turns the cache's decode buffer off.
	DisableDecodeBuffer bool
	// Pace emulates the forward's duration for the committer, outside the
	// timed calls: in the forward of every step that is not a pure decode
	// step (the decode buffer is empty then) it waits with Sync until every
	// write handed over so far has landed, and before every Save it waits
	// for a free staging page. A real engine's forward gives the committer
	// that time; without it the simulator, whose forward takes no time,
	// would charge the committer's backlog to Materialize joins and Save page
	// claims. The waits are reported as stall; the part of a wait beyond the
	// model step time (a backlog a real engine would feel) as backlog.
	Pace bool
	// MaterializeOnEngine calls Materialize on the engine goroutine, timed
	// as engine time, instead of on an output goroutine that overlaps the
	// next step's forward (an engine's output path, which hands stage 0's
	// outputs to the next stage). Either way the engine waits for the output
	// goroutine during the next forward at the latest: the wait is a stall,
	// and its part beyond the model step time backlog.
	MaterializeOnEngine bool
	// StepTime is the constant model step time of the projection when the
	// spec has no step cost, or when ForceStepTime.
	StepTime      time.Duration
	ForceStepTime bool
	// NewCache creates the cache (default NewRealCache).
	NewCache func(omnicache.Config) (Cache, error)
	// OnStep, when set, is called on the engine goroutine with every step
	// of a cache-on run before its Begin, outside the timed calls (e.g. to
	// count prefix-cache queries, Step.Queried). The step is borrowed.
	OnStep func(st *sim.Step)
	// Progress, when set, is called with the number of requests that
	// finished in each step.
	Progress func(finished int)
	// KeepSamples records per-step samples in Report.Samples (for plots).
	KeepSamples bool
}

func (o *Options) defaults() {
	if o.MaxBatchedTokens <= 0 {
		o.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if o.BlockSize <= 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.MirrorBudget <= 0 {
		o.MirrorBudget = DefaultMirrorBudget
	}
	if o.StepTime <= 0 {
		o.StepTime = DefaultStepTime
	}
	if o.NewCache == nil {
		o.NewCache = NewRealCache
	}
}

// StepSample is one step's measurements.
type StepSample struct {
	EngineNs  int64 // Begin + Save + Materialize/Discard of the previous step
	BeginNs   int64
	SaveNs    int64
	ConsumeNs int64
	StallNs   int64
	// OutputWaitNs is the part of StallNs spent waiting for the output
	// goroutine's Materialize.
	OutputWaitNs int64
	Tokens       int32
	Queried      int32 // prompt tokens looked up at arrival
	Hit          int32 // of which hit
}

// SchemaVersion is Report's JSON schema version: 2 has computed_tokens
// (was tokens), the step-cost projection (model_*, ref_*, fit_error) and no
// nested stats object.
const SchemaVersion = 2

// Report is one run's result. JSON names are snake_case and stable within a
// SchemaVersion.
type Report struct {
	SchemaVersion int    `json:"schema_version"`
	Name          string `json:"name"`
	Model         string `json:"model,omitempty"`
	Cache         string `json:"cache"` // "off" or "on"
	Verify        bool   `json:"verify"`
	Owned         bool   `json:"owned"`
	Keys          string `json:"keys"`
	Prompts       int    `json:"prompts"`
	Concurrency   int    `json:"concurrency"`
	KVBlocks      int    `json:"kv_blocks"`

	Steps int `json:"steps"`
	// ComputedTokens are the tokens the engine computed: scheduled, so
	// prefix hits excluded.
	ComputedTokens int64   `json:"computed_tokens"`
	QueriedTokens  int64   `json:"queried_tokens"`
	HitTokens      int64   `json:"hit_tokens"`
	HitRate        float64 `json:"hit_rate"`
	Preemptions    int64   `json:"preemptions"`
	Evictions      int64   `json:"evictions"` // cached blocks handed to a new tenant
	PureDecode     int     `json:"pure_decode_steps"`

	// Engine goroutine time in cache calls (Begin + Save +
	// Materialize/Discard), stalls excluded.
	EngineNsTotal   int64   `json:"engine_ns_total"`
	EngineNsPerStep float64 `json:"engine_ns_per_step_mean"`
	EngineNsP50     int64   `json:"engine_ns_per_step_p50"`
	EngineNsP99     int64   `json:"engine_ns_per_step_p99"`
	EngineNsMax     int64   `json:"engine_ns_per_step_max"`
	BeginNsTotal    int64   `json:"begin_ns_total"`
	SaveNsTotal     int64   `json:"save_ns_total"`
	ConsumeNsTotal  int64   `json:"consume_ns_total"` // Discard, and Materialize on the engine goroutine
	Materialized    int     `json:"materialized_steps"`
	// MaterializeOn is where Materialize runs: "output" (a goroutine
	// overlapping the next forward) or "engine" (Options.MaterializeOnEngine).
	MaterializeOn      string `json:"materialize_on"`
	MaterializeNsTotal int64  `json:"materialize_ns_total"`
	MaterializeNsP99   int64  `json:"materialize_ns_p99"`
	Discarded          int    `json:"discarded_steps"`
	StallNs            int64  `json:"stall_ns"`
	StallSteps         int    `json:"stall_steps"`
	BacklogNs          int64  `json:"backlog_ns"`
	// OutputBacklogNs is the part of the waits for the output goroutine
	// beyond the model step time (and all of them after the last step): hit
	// reads the forward could not hide. It is charged to the projection.
	OutputBacklogNs  int64   `json:"output_backlog_ns"`
	SyncNs           int64   `json:"sync_ns"`
	CommitterNsTotal int64   `json:"committer_ns_total"`
	CommitterPerStep float64 `json:"committer_ns_per_step"`
	CommitterShare   float64 `json:"committer_share_of_step"`

	// StepCost describes the step-cost model of the projection.
	StepCost string `json:"step_cost"`
	// ModelStepNs is the mean model step time t(step) of this run's
	// schedule.
	ModelStepNs float64 `json:"model_step_ns"`
	// ModelReqPerSec is the projected throughput of this run: prompts /
	// Σ_steps (t(step) + the engine goroutine's cache time of the step),
	// where the cache time includes the output goroutine's backlog (hit
	// reads that outlast the forward they overlap). The first step's cache
	// time is the cache's start-up (first_request_ns, with New) and not
	// part of it: the reference measured throughput on a running server and
	// its first request apart (WarmEngineNs).
	ModelReqPerSec float64 `json:"model_req_per_s"`
	// ModelReqPerSecOff is the projected cache-off throughput of the same
	// workload: prompts / Σ t(step) over the simulator's schedule with
	// prefix caching off (every prompt token computed).
	ModelReqPerSecOff float64 `json:"model_req_per_s_off"`
	// ProjectedChange is ModelReqPerSec/ModelReqPerSecOff − 1: positive for
	// a gain, 0 with the cache off. At a 0% hit rate the schedules are the
	// same and it is −cache/(cache + model time).
	ProjectedChange float64 `json:"projected_throughput_change"`

	// The reference's results for the workload (0 and "" for a trace):
	// its cache-off throughput, fit_error = model_req_per_s_off /
	// ref_req_per_s_off − 1, its hit rate as it printed it, and its
	// throughput change before and after its fix with the after range.
	RefReqPerSecOff  float64 `json:"ref_req_per_s_off"`
	FitError         float64 `json:"fit_error"`
	RefHit           string  `json:"ref_hit"`
	RefChangeBefore  float64 `json:"ref_change_before"`
	RefChangeAfter   float64 `json:"ref_change_after"`
	RefChangeAfterLo float64 `json:"ref_change_after_lo"`
	RefChangeAfterHi float64 `json:"ref_change_after_hi"`

	RowsWritten         int64 `json:"rows_written"`
	BytesWritten        int64 `json:"bytes_written"`
	RowsSkipped         int64 `json:"rows_skipped"`
	WriteTasks          int64 `json:"write_tasks"`
	BufferedSteps       int64 `json:"buffered_steps"`
	BufferFlushes       int64 `json:"buffer_flushes"`
	BudgetFlushes       int64 `json:"budget_flushes"`
	BudgetPeakBytes     int64 `json:"budget_peak_bytes"`
	ClonedBytes         int64 `json:"cloned_bytes"`
	HitRowsRead         int64 `json:"hit_rows_read"`
	MirrorResidentBytes int64 `json:"mirror_resident_bytes"`
	// FirstRequestNs is New plus the first step's Begin and Save.
	FirstRequestNs int64 `json:"first_request_ns"`
	// FirstStepEngineNs is the first step's engine time (in
	// EngineNsTotal): start-up, outside the projected throughput.
	FirstStepEngineNs int64 `json:"first_step_engine_ns"`

	VerifiedRows   int64     `json:"verified_rows"`
	VerifyFailures int64     `json:"verify_failures"`
	Failures       []Failure `json:"failures,omitempty"`

	WallNs int64 `json:"wall_ns"`
	// Stats is the cache's Stats at the end (flattened above for JSON).
	Stats *omnicache.Stats `json:"-"`

	Samples []StepSample `json:"-"`
}

// WarmEngineNs is the engine goroutine's cache time after the first step:
// the part of EngineNsTotal a running server pays per workload.
func (r *Report) WarmEngineNs() int64 { return r.EngineNsTotal - r.FirstStepEngineNs }

// ErrVerify is returned (wrapped) by Replay when --verify found wrong rows;
// the report is complete.
var ErrVerify = errors.New("bench: verification failed")

// AutoKVBlocks is the automatic KV pool size (see Options.KVBlocks).
func AutoKVBlocks(spec Spec, o Options) int {
	o.defaults()
	perReq := (spec.MaxModelLen + o.BlockSize - 1) / o.BlockSize
	want := spec.Concurrency*perReq + spec.Concurrency
	rowBytes := 0
	for _, k := range spec.Keys {
		rowBytes += k.RowBytes
	}
	capBlocks := int(o.MirrorBudget / int64(o.BlockSize*max(rowBytes, 1)))
	return max(min(want, capBlocks), perReq+1)
}

// KVPool is the KV pool size a run of spec under o uses, in blocks.
func KVPool(spec Spec, o Options) int {
	o.defaults()
	switch {
	case o.KVBlocks > 0:
		return o.KVBlocks
	case spec.KVBlocks > 0:
		return spec.KVBlocks
	}
	return AutoKVBlocks(spec, o)
}

// newSim is the simulated engine of a run: prefix caching on with the cache
// on, off with the cache off, as the reference's enable_prefix_caching.
func newSim(spec Spec, o Options, prefixCaching bool) (*sim.Sim, error) {
	return sim.New(sim.Config{
		BlockSize:        o.BlockSize,
		NumBlocks:        KVPool(spec, o),
		MaxBatchedTokens: o.MaxBatchedTokens,
		Concurrency:      spec.Concurrency,
		MaxModelLen:      spec.MaxModelLen,
		Vocab:            Vocab,
		NoPrefixCaching:  !prefixCaching,
	}, spec.Source())
}

// Schedule is what the simulator alone schedules for a spec.
type Schedule struct {
	Steps int
	// Work is what the steps compute, summed (the step-cost model's input).
	Work                                     sim.Work
	ComputedTokens, QueriedTokens, HitTokens int64
	Preemptions, Evictions                   int64
}

// HitRate is hit tokens / queried prompt tokens.
func (s *Schedule) HitRate() float64 {
	if s.QueriedTokens == 0 {
		return 0
	}
	return float64(s.HitTokens) / float64(s.QueriedTokens)
}

// Simulate runs spec's requests through the engine simulator alone (no
// cache, nothing timed), with the KV prefix cache on or off.
func Simulate(spec Spec, o Options, prefixCaching bool) (*Schedule, error) {
	o.defaults()
	s, err := newSim(spec, o, prefixCaching)
	if err != nil {
		return nil, err
	}
	for {
		st, err := s.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.Name, err)
		}
		if st == nil {
			break
		}
	}
	return scheduleOf(s), nil
}

func scheduleOf(s *sim.Sim) *Schedule {
	return &Schedule{Steps: s.Steps, Work: s.Work, ComputedTokens: s.TokensTotal, QueriedTokens: s.Queried,
		HitTokens: s.Hit, Preemptions: s.Preemptions, Evictions: s.KV().Evictions}
}

// CostOf is the step cost a run of spec under o projects with: the spec's
// fitted cost, or the constant Options.StepTime when it has none or
// ForceStepTime is set.
func CostOf(spec Spec, o Options) StepCost {
	o.defaults()
	if spec.Cost.IsZero() || o.ForceStepTime {
		return ConstantStep(o.StepTime)
	}
	return spec.Cost
}

// Replay runs spec once with the cache on or off. With the cache off the
// engine's KV prefix caching is off too (an omni model cannot skip a prefix
// without its per-token outputs), so nothing hits; with it on, hits are not
// computed. A cache-on run also simulates the cache-off schedule (no cache,
// nothing timed) for its projected change.
func Replay(spec Spec, o Options) (*Report, error) {
	o.defaults()
	s, err := newSim(spec, o, o.Cache)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		SchemaVersion: SchemaVersion,
		Name:          spec.Name, Model: spec.Model, Cache: "off", Verify: o.Verify && o.Cache,
		Owned: !o.NotOwned, Keys: FormatWidths(spec.Keys), Prompts: spec.Prompts,
		Concurrency: spec.Concurrency, KVBlocks: s.KV().Len(),
	}
	r := &runner{spec: spec, o: o, s: s, rep: rep, cost: CostOf(spec, o)}
	// Start from a clean heap: the previous run's garbage should not be
	// collected during this one's timed calls.
	runtime.GC()
	debug.FreeOSMemory()
	wall := time.Now()
	if o.Cache {
		rep.Cache = "on"
		err = r.runOn()
	} else {
		err = r.runOff()
	}
	rep.WallNs = time.Since(wall).Nanoseconds()
	if err != nil {
		return rep, fmt.Errorf("%s (cache %s): %w", spec.Name, rep.Cache, err)
	}
	off := scheduleOf(s)
	if o.Cache {
		if off, err = Simulate(spec, o, false); err != nil {
			return rep, err
		}
	}
	r.finish(off)
	if rep.VerifyFailures > 0 {
		return rep, fmt.Errorf("%s: %w: %d wrong rows, first: %s", spec.Name, ErrVerify, rep.VerifyFailures, rep.Failures[0])
	}
	return rep, nil
}

type runner struct {
	spec   Spec
	o      Options
	s      *sim.Sim
	rep    *Report
	cost   StepCost
	engine []int64
	// materialize are the Materialize calls' times.
	materialize []int64
	clock       int64 // cost of one timed empty interval, subtracted from each call
}

// clockOverhead measures what timing an empty interval costs (the least of
// many tries), so that call times exclude the clock reads themselves.
func clockOverhead() int64 {
	best := int64(math.MaxInt64)
	for range 2000 {
		t := time.Now()
		best = min(best, time.Since(t).Nanoseconds())
	}
	return best
}

// since is the time since t, less the clock's own cost.
func (r *runner) since(t time.Time) int64 {
	return max(time.Since(t).Nanoseconds()-r.clock, 0)
}

func (r *runner) account(st *sim.Step, smp StepSample) {
	smp.EngineNs = smp.BeginNs + smp.SaveNs + smp.ConsumeNs
	r.engine = append(r.engine, smp.EngineNs)
	t := int64(r.cost.Ns(st.Cost))
	r.rep.BacklogNs += max(0, smp.StallNs-t)
	r.rep.OutputBacklogNs += max(0, smp.OutputWaitNs-t)
	if st.PureDecode {
		r.rep.PureDecode++
	}
	if r.o.KeepSamples {
		smp.Tokens, smp.Queried, smp.Hit = int32(st.Tokens), int32(st.Queried), int32(st.Hit)
		r.rep.Samples = append(r.rep.Samples, smp)
	}
}

func (r *runner) progress(before int64) {
	if r.o.Progress != nil {
		if d := r.s.Finished - before; d > 0 {
			r.o.Progress(int(d))
		}
	}
}

func (r *runner) runOff() error {
	for {
		before := r.s.Finished
		st, err := r.s.Next()
		if err != nil {
			return err
		}
		if st == nil {
			return nil
		}
		r.s.Release()
		r.s.Advance()
		r.account(st, StepSample{})
		r.progress(before)
	}
}

func (r *runner) runOn() error {
	o, spec, s, rep := r.o, r.spec, r.s, r.rep
	r.clock = clockOverhead()
	cfg := omnicache.Config{
		NumBlocks:             s.KV().Len(),
		BlockSize:             o.BlockSize,
		Keys:                  spec.Keys,
		StagingDepth:          o.StagingDepth,
		StagingCapacityTokens: o.MaxBatchedTokens,
		DisableDecodeBuffer:   o.DisableDecodeBuffer,
	}
	depth := o.StagingDepth
	if depth <= 0 {
		depth = omnicache.DefaultStagingDepth
	}
	rowBytes := make([]int, len(spec.Keys))
	for k, kk := range spec.Keys {
		rowBytes[k] = kk.RowBytes
	}
	pool := newBufPool(rowBytes, o.MaxBatchedTokens, !o.NotOwned)
	if !o.NotOwned {
		cfg.ReleaseHost = pool.release
	}
	var ver *verifier
	if o.Verify {
		ver = newVerifier(spec.Keys, s.KV().Len()*o.BlockSize, o.BlockSize)
	}
	out := omnicache.Outputs{Tensors: make([]omnicache.Tensor, len(spec.Keys))}
	// Step records: the step being run, the previous one (consumed after
	// this step's Save) and the one the output goroutine may still read.
	var ring [3]stepRecord
	var curBufs *bufSet
	var prevID omnicache.StepID
	var prev *stepRecord
	saved := 0
	if o.MaterializeOnEngine {
		rep.MaterializeOn = "engine"
	} else {
		rep.MaterializeOn = "output"
	}

	t0 := time.Now()
	c, err := o.NewCache(cfg)
	newNs := time.Since(t0).Nanoseconds()
	if err != nil {
		return fmt.Errorf("new cache: %w", err)
	}
	closed := false
	out2 := newOutputGoroutine(c, r)
	defer func() {
		out2.stop()
		if !closed {
			c.Close()
		}
	}()

	// consume hands step rec (id) to Materialize when one of its requests
	// hit (or always with --verify), else discards it on the engine
	// goroutine (timed). Materialize runs on the output goroutine, where an
	// engine hands stage 0's outputs to the next stage, overlapping the next
	// forward; with MaterializeOnEngine it runs here, timed.
	consume := func(rec *stepRecord, id omnicache.StepID) (int64, error) {
		if !o.Verify && len(rec.hits) == 0 {
			t := time.Now()
			err := c.Discard(id)
			ns := r.since(t)
			rep.Discarded++
			rep.ConsumeNsTotal += ns
			if err != nil {
				return ns, fmt.Errorf("step %d: discard: %w", rec.index, err)
			}
			return ns, nil
		}
		asked := rec.hits
		if o.Verify {
			asked = rec.ids
		}
		out2.hand(rec, id, asked)
		if !o.MaterializeOnEngine {
			return 0, nil
		}
		_, ns, err := out2.wait(ver)
		rep.ConsumeNsTotal += ns
		return ns, err
	}

	for {
		before := s.Finished
		st, err := s.Next()
		if err != nil {
			return err
		}
		if st == nil {
			break
		}
		if o.OnStep != nil {
			o.OnStep(st)
		}
		tb := time.Now()
		err = c.Begin(&st.Plan)
		beginNs := r.since(tb)
		if err != nil {
			return fmt.Errorf("step %d: begin: %w", st.Index, err)
		}
		s.Release()

		// The forward.
		curBufs = pool.get(st.Tokens)
		bufs := curBufs.slices(st.Tokens, rowBytes)
		if ver != nil {
			ver.produce(s, st, bufs) // verification work: not cache time
		}
		for k := range out.Tensors {
			out.Tensors[k] = omnicache.Tensor{Host: bufs[k], Rows: st.Tokens, Owned: !o.NotOwned}
		}
		out.Tokens, out.Padded = st.Tokens, st.Tokens
		cur := &ring[st.Index%len(ring)]
		cur.set(st)

		// The output goroutine's Materialize of the step before the
		// previous one overlaps this forward: wait for it here.
		outputNs, _, err := out2.wait(ver)
		if err != nil {
			return err
		}
		stallNs := outputNs
		if o.Pace {
			if !st.PureDecode && saved > 0 {
				tw := time.Now()
				if err := c.Sync(); err != nil {
					return fmt.Errorf("step %d: pacing sync: %w", st.Index, err)
				}
				stallNs += time.Since(tw).Nanoseconds()
			}
			stallNs += r.pace(c, depth)
		}
		ts := time.Now()
		id, err := c.Save(&out)
		saveNs := r.since(ts)
		if err != nil {
			return fmt.Errorf("step %d: save: %w", st.Index, err)
		}
		if saved == 0 {
			// What the cache adds before the first request is served: New,
			// then the first step's Begin and Save (the simulator's own
			// work and the forward are not the cache's).
			rep.FirstRequestNs = newNs + beginNs + saveNs
		}
		saved++
		s.Advance()

		var consumeNs int64
		if prev != nil {
			if consumeNs, err = consume(prev, prevID); err != nil {
				return err
			}
		}
		prev, prevID = cur, id

		rep.BeginNsTotal += beginNs
		rep.SaveNsTotal += saveNs
		rep.StallNs += stallNs
		if stallNs > 0 {
			rep.StallSteps++
		}
		r.account(st, StepSample{BeginNs: beginNs, SaveNs: saveNs, ConsumeNs: consumeNs, StallNs: stallNs, OutputWaitNs: outputNs})
		r.progress(before)
	}
	// The tail: no forward is left to hide the output goroutine's work, so
	// its waits are backlog; the last step's Discard is engine time.
	tail := func() error {
		ns, _, err := out2.wait(ver)
		rep.StallNs += ns
		rep.BacklogNs += ns
		rep.OutputBacklogNs += ns
		return err
	}
	if err := tail(); err != nil {
		return err
	}
	if prev != nil {
		ns, err := consume(prev, prevID)
		if err != nil {
			return err
		}
		if n := len(r.engine); n > 0 {
			r.engine[n-1] += ns
			if o.KeepSamples {
				rep.Samples[n-1].EngineNs += ns
				rep.Samples[n-1].ConsumeNs += ns
			}
		}
		if err := tail(); err != nil {
			return err
		}
	}
	ts := time.Now()
	if err := c.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	rep.SyncNs = time.Since(ts).Nanoseconds()
	if ver != nil {
		if err := ver.checkMirror(c, s.Steps); err != nil {
			return err
		}
		rep.VerifiedRows = ver.rows
		rep.VerifyFailures = ver.failures
		rep.Failures = ver.kept
	}
	st := c.Stats()
	rep.Stats = &st
	closed = true
	out2.stop()
	if err := c.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// outputGoroutine runs Materialize for the engine, one step at a time, as an
// engine's output path that hands stage 0's outputs to the next stage.
type outputGoroutine struct {
	c       Cache
	r       *runner
	jobs    chan outputJob
	done    chan outputDone
	pending *outputJob
	stopped bool
}

type outputJob struct {
	rec   *stepRecord
	id    omnicache.StepID
	asked []int64
}

type outputDone struct {
	res Rows
	ns  int64
	err error
}

func newOutputGoroutine(c Cache, r *runner) *outputGoroutine {
	g := &outputGoroutine{c: c, r: r, jobs: make(chan outputJob), done: make(chan outputDone)}
	go func() {
		for j := range g.jobs {
			t := time.Now()
			res, err := c.Materialize(j.id, j.asked)
			g.done <- outputDone{res: res, ns: r.since(t), err: err}
		}
	}()
	return g
}

// hand starts Materialize of rec's requests asked (id). At most one is in
// flight: the caller waits for it before handing the next.
func (g *outputGoroutine) hand(rec *stepRecord, id omnicache.StepID, asked []int64) {
	if g.pending != nil {
		panic("bench: output goroutine busy")
	}
	g.pending = &outputJob{rec: rec, id: id, asked: asked}
	g.jobs <- *g.pending
}

// wait waits for the Materialize in flight, if any, and checks its rows
// (ver != nil). It returns the time waited and the time Materialize took.
func (g *outputGoroutine) wait(ver *verifier) (waited, took int64, err error) {
	j := g.pending
	if j == nil {
		return 0, 0, nil
	}
	t := time.Now()
	d := <-g.done
	waited = time.Since(t).Nanoseconds()
	g.pending = nil
	rep := g.r.rep
	rep.Materialized++
	rep.MaterializeNsTotal += d.ns
	g.r.materialize = append(g.r.materialize, d.ns)
	if d.err != nil {
		return waited, d.ns, fmt.Errorf("step %d: materialize: %w", j.rec.index, d.err)
	}
	if ver != nil {
		ver.check(j.rec, j.asked, d.res)
	}
	return waited, d.ns, nil
}

// stop ends the goroutine (after the job in flight, if any).
func (g *outputGoroutine) stop() {
	if g.stopped {
		return
	}
	g.stopped = true
	if g.pending != nil {
		<-g.done
		g.pending = nil
	}
	close(g.jobs)
}

// pace waits outside the timed calls until a staging page is free (see
// Options.Pace). It gives up after a second and lets Save wait (the wait
// then counts in Save's time).
func (r *runner) pace(c Cache, depth int) int64 {
	if c.Stats().PagesInUse < depth {
		return 0
	}
	t := time.Now()
	for i := 0; c.Stats().PagesInUse >= depth; i++ {
		if time.Since(t) > time.Second {
			break
		}
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return time.Since(t).Nanoseconds()
}

// finish derives the report's summary numbers; off is the cache-off
// schedule of the same workload.
func (r *runner) finish(off *Schedule) {
	rep, s := r.rep, r.s
	sch := scheduleOf(s)
	rep.Steps = sch.Steps
	rep.ComputedTokens = sch.ComputedTokens
	rep.QueriedTokens = sch.QueriedTokens
	rep.HitTokens = sch.HitTokens
	rep.HitRate = sch.HitRate()
	rep.Preemptions = sch.Preemptions
	rep.Evictions = sch.Evictions

	var total int64
	for _, ns := range r.engine {
		total += ns
	}
	rep.EngineNsTotal = total
	if len(r.engine) > 0 {
		rep.FirstStepEngineNs = r.engine[0]
	}
	if rep.Steps > 0 {
		rep.EngineNsPerStep = float64(total) / float64(rep.Steps)
		sorted := slices.Clone(r.engine)
		slices.Sort(sorted)
		rep.EngineNsP50 = percentile(sorted, 0.50)
		rep.EngineNsP99 = percentile(sorted, 0.99)
		rep.EngineNsMax = sorted[len(sorted)-1]
	}

	if len(r.materialize) > 0 {
		sorted := slices.Clone(r.materialize)
		slices.Sort(sorted)
		rep.MaterializeNsP99 = percentile(sorted, 0.99)
	}
	rep.StepCost = r.cost.Describe()
	if r.cost.Model != "" {
		rep.StepCost = "fitted " + r.cost.Model + ": " + rep.StepCost
	}
	modelNs := r.cost.Ns(sch.Work)
	if rep.Steps > 0 {
		rep.ModelStepNs = modelNs / float64(rep.Steps)
	}
	prompts := float64(rep.Prompts)
	rep.ModelReqPerSecOff = prompts / (r.cost.Ns(off.Work) / 1e9)
	rep.ModelReqPerSec = prompts / ((modelNs + float64(rep.WarmEngineNs()) + float64(rep.OutputBacklogNs)) / 1e9)
	if rep.Cache == "on" {
		rep.ProjectedChange = rep.ModelReqPerSec/rep.ModelReqPerSecOff - 1
	}
	if ref := r.spec.Ref; ref.ReqPerSecOff > 0 {
		rep.RefReqPerSecOff = ref.ReqPerSecOff
		rep.FitError = rep.ModelReqPerSecOff/ref.ReqPerSecOff - 1
		rep.RefHit = ref.Hit
		rep.RefChangeBefore, rep.RefChangeAfter = ref.Before, ref.After
		rep.RefChangeAfterLo, rep.RefChangeAfterHi = ref.AfterLo, ref.AfterHi
	}
	if st := rep.Stats; st != nil {
		rep.RowsWritten = st.RowsWritten
		rep.BytesWritten = st.BytesWritten
		rep.RowsSkipped = st.RowsSkipped
		rep.WriteTasks = st.WriteTasks
		rep.BufferedSteps = st.BufferedSteps
		rep.BufferFlushes = st.BufferFlushes
		rep.BudgetFlushes = st.BudgetFlushes
		rep.BudgetPeakBytes = st.BudgetPeak
		rep.ClonedBytes = st.ClonedBytes
		rep.HitRowsRead = st.HitRowsRead
		rep.MirrorResidentBytes = st.MirrorResidentBytes
		rep.CommitterNsTotal = st.CommitterNanos
		if rep.Steps > 0 {
			rep.CommitterPerStep = float64(st.CommitterNanos) / float64(rep.Steps)
			rep.CommitterShare = rep.CommitterPerStep / rep.ModelStepNs
		}
	}
}

// percentile of sorted values (nearest rank).
func percentile(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
