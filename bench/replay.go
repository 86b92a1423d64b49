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
	// RefReqPerSec is the reference cache-off throughput giving the model
	// step time (0: use Options.StepTime).
	RefReqPerSec float64
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
	// StepTime is the model step time for the projection when the spec has
	// no reference throughput, or when > 0 and ForceStepTime.
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
	Tokens    int32
	Queried   int32 // prompt tokens looked up at arrival
	Hit       int32 // of which hit
}

// Report is one run's result. JSON names are stable.
type Report struct {
	Name        string `json:"name"`
	Model       string `json:"model,omitempty"`
	Cache       string `json:"cache"` // "off" or "on"
	Verify      bool   `json:"verify"`
	Owned       bool   `json:"owned"`
	Keys        string `json:"keys"`
	Prompts     int    `json:"prompts"`
	Concurrency int    `json:"concurrency"`
	KVBlocks    int    `json:"kv_blocks"`

	Steps         int     `json:"steps"`
	Tokens        int64   `json:"tokens"`
	QueriedTokens int64   `json:"queried_tokens"`
	HitTokens     int64   `json:"hit_tokens"`
	HitRate       float64 `json:"hit_rate"`
	Preemptions   int64   `json:"preemptions"`
	Evictions     int64   `json:"evictions"` // cached blocks handed to a new tenant
	PureDecode    int     `json:"pure_decode_steps"`

	// Engine goroutine time in cache calls (Begin + Save +
	// Materialize/Discard), stalls excluded.
	EngineNsTotal    int64   `json:"engine_ns_total"`
	EngineNsPerStep  float64 `json:"engine_ns_per_step_mean"`
	EngineNsP50      int64   `json:"engine_ns_per_step_p50"`
	EngineNsP99      int64   `json:"engine_ns_per_step_p99"`
	EngineNsMax      int64   `json:"engine_ns_per_step_max"`
	BeginNsTotal     int64   `json:"begin_ns_total"`
	SaveNsTotal      int64   `json:"save_ns_total"`
	ConsumeNsTotal   int64   `json:"consume_ns_total"`
	Materialized     int     `json:"materialized_steps"`
	Discarded        int     `json:"discarded_steps"`
	StallNs          int64   `json:"stall_ns"`
	StallSteps       int     `json:"stall_steps"`
	BacklogNs        int64   `json:"backlog_ns"`
	SyncNs           int64   `json:"sync_ns"`
	CommitterNsTotal int64   `json:"committer_ns_total"`
	CommitterPerStep float64 `json:"committer_ns_per_step"`
	CommitterShare   float64 `json:"committer_share_of_step"`

	ModelStepNs float64 `json:"model_step_ns"`
	// ProjectedChange is -cache/(cache+step) with cache the mean engine ns
	// per step: negative for a loss, 0 with the cache off.
	ProjectedChange float64 `json:"projected_throughput_change"`

	RowsWritten         int64 `json:"rows_written"`
	BytesWritten        int64 `json:"bytes_written"`
	MirrorResidentBytes int64 `json:"mirror_resident_bytes"`
	// FirstRequestNs is New plus the first step's Begin and Save.
	FirstRequestNs int64 `json:"first_request_ns"`

	VerifiedRows   int64     `json:"verified_rows"`
	VerifyFailures int64     `json:"verify_failures"`
	Failures       []Failure `json:"failures,omitempty"`

	WallNs int64            `json:"wall_ns"`
	Stats  *omnicache.Stats `json:"stats,omitempty"`

	Samples []StepSample `json:"-"`
}

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

// Replay runs spec once with the cache on or off.
func Replay(spec Spec, o Options) (*Report, error) {
	o.defaults()
	kv := o.KVBlocks
	if kv <= 0 {
		kv = spec.KVBlocks
	}
	if kv <= 0 {
		kv = AutoKVBlocks(spec, o)
	}
	s, err := sim.New(sim.Config{
		BlockSize:        o.BlockSize,
		NumBlocks:        kv,
		MaxBatchedTokens: o.MaxBatchedTokens,
		Concurrency:      spec.Concurrency,
		MaxModelLen:      spec.MaxModelLen,
		Vocab:            Vocab,
	}, spec.Source())
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Name: spec.Name, Model: spec.Model, Cache: "off", Verify: o.Verify && o.Cache,
		Owned: !o.NotOwned, Keys: FormatWidths(spec.Keys), Prompts: spec.Prompts,
		Concurrency: spec.Concurrency, KVBlocks: kv,
	}
	r := &runner{spec: spec, o: o, s: s, rep: rep}
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
	r.finish()
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
	engine []int64
	stalls []int64
	clock  int64 // cost of one timed empty interval, subtracted from each call
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
	r.stalls = append(r.stalls, smp.StallNs)
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
	var cur, prev stepRecord
	var curBufs *bufSet
	var prevID omnicache.StepID
	havePrev := false
	saved := 0

	t0 := time.Now()
	c, err := o.NewCache(cfg)
	newNs := time.Since(t0).Nanoseconds()
	if err != nil {
		return fmt.Errorf("new cache: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()

	consume := func() (int64, error) {
		var ns int64
		if o.Verify || len(prev.hits) > 0 {
			asked := prev.hits
			if o.Verify {
				asked = prev.ids
			}
			t := time.Now()
			res, err := c.Materialize(prevID, asked)
			ns = r.since(t)
			if err != nil {
				return ns, fmt.Errorf("step %d: materialize: %w", prev.index, err)
			}
			rep.Materialized++
			if ver != nil {
				ver.check(&prev, asked, res)
			}
		} else {
			t := time.Now()
			err := c.Discard(prevID)
			ns = r.since(t)
			if err != nil {
				return ns, fmt.Errorf("step %d: discard: %w", prev.index, err)
			}
			rep.Discarded++
		}
		rep.ConsumeNsTotal += ns
		return ns, nil
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
		cur.set(st)

		var stallNs int64
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
		if havePrev {
			if consumeNs, err = consume(); err != nil {
				return err
			}
		}
		prev, cur = cur, prev
		prevID, havePrev = id, true

		rep.BeginNsTotal += beginNs
		rep.SaveNsTotal += saveNs
		rep.StallNs += stallNs
		if stallNs > 0 {
			rep.StallSteps++
		}
		r.account(st, StepSample{BeginNs: beginNs, SaveNs: saveNs, ConsumeNs: consumeNs, StallNs: stallNs})
		r.progress(before)
	}
	if havePrev {
		ns, err := consume()
		if err != nil {
			return err
		}
		if n := len(r.engine); n > 0 {
			r.engine[n-1] += ns // the last step's id is consumed after the loop
			if o.KeepSamples {
				rep.Samples[n-1].EngineNs += ns
				rep.Samples[n-1].ConsumeNs += ns
			}
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
	if err := c.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
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

// finish derives the report's summary numbers.
func (r *runner) finish() {
	rep, s := r.rep, r.s
	rep.Steps = s.Steps
	rep.Tokens = s.TokensTotal
	rep.QueriedTokens = s.Queried
	rep.HitTokens = s.Hit
	if s.Queried > 0 {
		rep.HitRate = float64(s.Hit) / float64(s.Queried)
	}
	rep.Preemptions = s.Preemptions
	rep.Evictions = s.KV().Evictions
	if rep.Steps == 0 {
		return
	}
	var total int64
	for _, ns := range r.engine {
		total += ns
	}
	rep.EngineNsTotal = total
	rep.EngineNsPerStep = float64(total) / float64(rep.Steps)
	sorted := slices.Clone(r.engine)
	slices.Sort(sorted)
	rep.EngineNsP50 = percentile(sorted, 0.50)
	rep.EngineNsP99 = percentile(sorted, 0.99)
	rep.EngineNsMax = sorted[len(sorted)-1]

	stepNs := float64(r.o.StepTime.Nanoseconds())
	if r.spec.RefReqPerSec > 0 && !r.o.ForceStepTime {
		stepNs = float64(rep.Prompts) / r.spec.RefReqPerSec / float64(rep.Steps) * 1e9
	}
	rep.ModelStepNs = stepNs
	for _, ns := range r.stalls {
		rep.BacklogNs += max(0, ns-int64(stepNs))
	}
	if rep.Cache == "on" {
		rep.ProjectedChange = -rep.EngineNsPerStep / (rep.EngineNsPerStep + stepNs)
	}
	if st := rep.Stats; st != nil {
		rep.RowsWritten = st.RowsWritten
		rep.BytesWritten = st.BytesWritten
		rep.MirrorResidentBytes = st.MirrorResidentBytes
		rep.CommitterNsTotal = st.CommitterNanos
		rep.CommitterPerStep = float64(st.CommitterNanos) / float64(rep.Steps)
		rep.CommitterShare = rep.CommitterPerStep / stepNs
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
