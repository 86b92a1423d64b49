package replay

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/replay/sim"
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
	// KVTokens, when > 0 and KVBlocks is 0, sizes the KV pool in tokens
	// (whatever the block size): a workload that must keep what it shares.
	KVTokens int
	// Downstream: a next stage consumes stage 0's per-token rows, so the
	// report projects the time to first packet.
	Downstream bool
	// Sim, when set, adjusts the simulated engine's configuration (e.g.
	// speculative decoding).
	Sim func(*sim.Config)
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
	// MirrorDirect has the cache copy steps' device rows straight into its
	// mirror (Config.MirrorDirect, every step of device rows); the device
	// budget then holds StagingDepth+2 pages.
	MirrorDirect bool
	// AllocStagingAtNew makes the cache allocate every staging page in New
	// (Config.AllocStagingAtNew; first_request_ns includes it).
	AllocStagingAtNew bool
	// AllocStagingAhead makes the cache allocate its first staging page in
	// New and the others in the background from New on
	// (Config.AllocStagingAhead; first_request_ns includes the first).
	AllocStagingAhead bool
	// Pace emulates the forward's duration for the committer, outside the
	// timed calls: in the forward of every step that is not a pure decode
	// step (the decode buffer is empty then) it waits with Sync until every
	// write handed over so far has landed, and before every Save it waits
	// for a free staging page. A real engine's forward gives the committer
	// that time; without it the simulator, whose forward takes no time,
	// would charge the committer's backlog to Materialize joins and Save page
	// claims. It also waits for a staging page's memory being allocated
	// ahead in the background (Stats.PagesAllocating), which the cache
	// starts once a page was taken. The waits are reported as stall; the
	// part of a wait beyond the model step time (a backlog a real engine
	// would feel) as backlog.
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
	// Busy is the number of cores the caller keeps busy beside the engine
	// (replay --busy), for the report.
	Busy int
	// LoadAverage is the machine's 1-minute load average when the caller
	// started (before its first run; negative: unknown), for the report
	// and the verdict (Check).
	LoadAverage float64
	// ReleaseMemory returns the process's free memory to the operating
	// system before the run (debug.FreeOSMemory), so that its RSS figures
	// are its own (replay --real-scale). Otherwise the run reuses the
	// memory earlier runs freed, as a running server reuses its own: the
	// first touch of memory returned to the system faults it in again page
	// by page, which made the hit workloads' Materialize several times
	// slower and their figures move with the machine's load.
	ReleaseMemory bool

	// Device is the device the cache stages through (Config.Device); nil:
	// the host device. The replay does not close it.
	Device gpu.Device
	// DeviceOutputs puts the forward's outputs in Device memory: a ring of
	// device buffers allocated once per run (owned mode: handed to the
	// cache and taken back when it frees them; NotOwned: one reused buffer
	// per key), filled on the device before Save (--verify: the oracle's
	// rows copied host→device; else a device memset, which Device must
	// implement as gpu.Filler). Off: host buffers, as an engine without a
	// GPU would hand over.
	DeviceOutputs bool
	// Hold holds the engine goroutine in every step's forward for the
	// step's model time, capped at HoldMax when HoldMax > 0, while the
	// device's copies issued so far run: a real engine's forward, which the
	// cache's copies and committer overlap. Not timed; waits after the hold
	// count as backlog beyond the part of the model time not held.
	Hold    bool
	HoldMax time.Duration
	// HoldSpin holds by spinning for the whole hold; otherwise the hold
	// sleeps and spins only its last 100 µs. CUDA's default scheduling
	// (cudaDeviceScheduleAuto) spins a thread waiting for the device while
	// the process has fewer contexts than logical CPUs, as an engine with
	// one GPU per process does: its thread stays on its core. Sleeping lets
	// the thread leave the core and come back to cold caches.
	HoldSpin bool
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
	case spec.KVTokens > 0:
		return (spec.KVTokens + o.BlockSize - 1) / o.BlockSize
	}
	return AutoKVBlocks(spec, o)
}

// newSim is the simulated engine of a run: prefix caching on with the cache
// on, off with the cache off, as the reference's enable_prefix_caching.
func newSim(spec Spec, o Options, prefixCaching bool) (*sim.Sim, error) {
	cfg := sim.Config{
		BlockSize:        o.BlockSize,
		NumBlocks:        KVPool(spec, o),
		MaxBatchedTokens: o.MaxBatchedTokens,
		Concurrency:      spec.Concurrency,
		MaxModelLen:      spec.MaxModelLen,
		Vocab:            Vocab,
		NoPrefixCaching:  !prefixCaching,
	}
	if spec.Sim != nil {
		spec.Sim(&cfg)
	}
	return sim.New(cfg, spec.Source())
}

// Schedule is what the simulator alone schedules for a spec.
type Schedule struct {
	Steps int
	// Work is what the steps compute, summed (the step-cost model's input).
	Work                                     sim.Work
	ComputedTokens, QueriedTokens, HitTokens int64
	Preemptions, Evictions                   int64
	ResumedHits, Replaces                    int64
	SpecDrafts, SpecRejected                 int64
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
		HitTokens: s.Hit, Preemptions: s.Preemptions, Evictions: s.KV().Evictions,
		ResumedHits: s.ResumedHits, Replaces: s.Replaces, SpecDrafts: s.Drafts, SpecRejected: s.Rejected}
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
		Concurrency: spec.Concurrency, KVBlocks: s.KV().Len(), BlockSize: o.BlockSize, BusyCores: o.Busy,
		CPUs: runtime.NumCPU(), LoadAverage: o.LoadAverage, Repeats: 1,
	}
	if o.Cache {
		rep.MirrorReservedBytes = int64(s.KV().Len()) * int64(o.BlockSize) * int64(keyRowBytesSum(spec.Keys))
	}

	r := &runner{spec: spec, o: o, s: s, rep: rep, cost: CostOf(spec, o)}
	// Start from a clean heap: the previous run's garbage should not be
	// collected during this one's timed calls.
	runtime.GC()
	if o.ReleaseMemory {
		debug.FreeOSMemory()
	}
	resetPeakRSS()
	wall := time.Now()
	if o.Cache {
		rep.Cache = "on"
		err = r.runOn()
	} else {
		err = r.runOff()
	}
	rep.WallNs = time.Since(wall).Nanoseconds()
	if !o.Cache {
		rep.ProcessRSSBytes, rep.ProcessPeakRSSBytes = processRSS()
	}
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
	rep.ProjectedChangeMin, rep.ProjectedChangeMax = rep.ProjectedChange, rep.ProjectedChange
	r.lat.fill(rep, spec.Downstream)
	if rep.VerifyFailures > 0 {
		return rep, fmt.Errorf("%s: %w: %d wrong rows, first: %s", spec.Name, ErrVerify, rep.VerifyFailures, rep.Failures[0])
	}
	return rep, nil
}
