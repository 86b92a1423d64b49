// What a replay measures: the Report of one run, its per-step samples
// and its hit-versus-miss buckets.

package replay

import (
	"math/bits"

	"github.com/omnicache/omnicache"
)

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
	// HoldNs is the time the forward was held (Options.Hold).
	HoldNs  int64
	Tokens  int32
	Queried int32 // prompt tokens looked up at arrival
	Hit     int32 // of which hit
	Pure    bool  // a pure decode step
}

// SchemaVersion is Report's JSON schema version: 2 has computed_tokens
// (was tokens), the step-cost projection (model_*, ref_*, fit_error) and no
// nested stats object; 3 adds the projected latencies (ttft_*, e2e_*,
// ttfp_*, first_request_ttft_ns), new_ns and the process's RSS; 4 adds the
// repeats and their range (repeats, projected_change_min,
// projected_change_max) and the machine (cpus, load_average).
const SchemaVersion = 4

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
	BlockSize     int    `json:"block_size"`
	// MirrorReservedBytes is the mirror's address space: KV slots × the
	// keys' row bytes (cache on; resident only where rows were written).
	MirrorReservedBytes int64 `json:"mirror_reserved_bytes"`

	Steps int `json:"steps"`
	// ComputedTokens are the tokens the engine computed: scheduled, so
	// prefix hits excluded.
	ComputedTokens int64   `json:"computed_tokens"`
	QueriedTokens  int64   `json:"queried_tokens"`
	HitTokens      int64   `json:"hit_tokens"`
	HitRate        float64 `json:"hit_rate"`
	Preemptions    int64   `json:"preemptions"`
	// ResumedHits are resumes after a preemption that hit the request's
	// own cached blocks; Replaces are requests whose tokens were replaced
	// mid-flight; SpecDrafts and SpecRejected are the speculative draft
	// tokens scheduled and rejected.
	ResumedHits  int64 `json:"resumed_hits"`
	Replaces     int64 `json:"replaces"`
	SpecDrafts   int64 `json:"spec_drafts"`
	SpecRejected int64 `json:"spec_rejected"`
	Evictions    int64 `json:"evictions"` // cached blocks handed to a new tenant
	PureDecode   int   `json:"pure_decode_steps"`

	// Engine goroutine time in cache calls (Begin + Save +
	// Materialize/Discard), stalls excluded.
	EngineNsTotal   int64   `json:"engine_ns_total"`
	EngineNsPerStep float64 `json:"engine_ns_per_step_mean"`
	EngineNsP50     int64   `json:"engine_ns_per_step_p50"`
	EngineNsP99     int64   `json:"engine_ns_per_step_p99"`
	EngineNsMax     int64   `json:"engine_ns_per_step_max"`
	// BySize is the cache-on run's Begin + Save time of the steps that are
	// not pure decodes, per power-of-two bucket of their tokens: what a hit
	// costs the engine goroutine against steps of the same size without
	// one (HitVsMiss).
	BySize         SizeBuckets `json:"begin_save_by_size"`
	BeginNsTotal   int64       `json:"begin_ns_total"`
	SaveNsTotal    int64       `json:"save_ns_total"`
	ConsumeNsTotal int64       `json:"consume_ns_total"` // Discard, and Materialize on the engine goroutine
	Materialized   int         `json:"materialized_steps"`
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
	// Repeats is the number of cache-on runs this report is the best of
	// (the one of highest projected throughput: Best); ProjectedChangeMin
	// and ProjectedChangeMax are the range of their projected changes
	// (both ProjectedChange for one run).
	Repeats            int     `json:"repeats"`
	ProjectedChangeMin float64 `json:"projected_change_min"`
	ProjectedChangeMax float64 `json:"projected_change_max"`

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
	// NewNs is the cache's New.
	NewNs int64 `json:"new_ns"`

	// Projected per-request latency (ns), nearest-rank percentiles over the
	// run's requests, on the projection's clock: every step takes its
	// model time t(step), plus with the cache on the engine goroutine's
	// cache time of the step and the output goroutine's backlog (as
	// model_req_per_s counts them; the first step's cache time is start-up,
	// outside the clock). A request arrives when the client sends it (the
	// end of the step that finished the request before it: a closed loop
	// of Concurrency clients). Time to first token ends with the step that
	// samples its first token, end to end with the one that samples its
	// last. Time to first packet (workloads with a downstream stage, else
	// 0) ends when the rows of the request's first step reach the next
	// stage: the end of that step, plus its Materialize when the request
	// hit. FirstRequestTTFTNs is the first request's time to first token,
	// with the cache's start-up (first_request_ns) when it is on.
	TTFTP50            int64 `json:"ttft_p50_ns"`
	TTFTP90            int64 `json:"ttft_p90_ns"`
	TTFTP99            int64 `json:"ttft_p99_ns"`
	E2EP50             int64 `json:"e2e_p50_ns"`
	E2EP90             int64 `json:"e2e_p90_ns"`
	E2EP99             int64 `json:"e2e_p99_ns"`
	TTFPP50            int64 `json:"ttfp_p50_ns"`
	TTFPP90            int64 `json:"ttfp_p90_ns"`
	TTFPP99            int64 `json:"ttfp_p99_ns"`
	FirstRequestTTFTNs int64 `json:"first_request_ttft_ns"`
	// TTFTs are the requests' projected times to first token, in request
	// order (for plots).
	TTFTs []int64 `json:"-"`

	// The process's resident set (VmRSS) at the end of the run, before the
	// cache is closed, and its peak (VmHWM) during the run (since the
	// process started where Linux cannot reset it); 0 where /proc has none.
	ProcessRSSBytes     int64 `json:"process_rss_bytes"`
	ProcessPeakRSSBytes int64 `json:"process_peak_rss_bytes"`
	// FirstStepEngineNs is the first step's engine time (in
	// EngineNsTotal): start-up, outside the projected throughput.
	FirstStepEngineNs int64 `json:"first_step_engine_ns"`

	// The device (Options.Device): its name ("host", "cuda:0"), where the
	// forward's outputs lived ("host" or "device"), the device→host bytes
	// the cache copied (into staging pages, and hit reads of device rows),
	// the time spent waiting for device events (staging_wait_ns: the cache
	// waiting for its device→host copies, on the engine goroutine in Save
	// and on the committer; 0 on the host device, whose copies complete
	// at once), the host staging bytes allocated (pinned on CUDA), the
	// device output buffers allocated, and the time the forward was held
	// (Options.Hold).
	Device         string `json:"device"`
	Outputs        string `json:"outputs"`
	DtoHBytes      int64  `json:"dtoh_bytes"`
	StagingWaitNs  int64  `json:"staging_wait_ns"`
	StagingWaits   int64  `json:"staging_waits"`
	PinnedBytes    int64  `json:"pinned_bytes"`
	OutputBuffers  int    `json:"output_buffers"`
	ForwardHoldNs  int64  `json:"forward_hold_ns"`
	ForwardHoldMax int64  `json:"forward_hold_max_ns"`

	VerifiedRows   int64 `json:"verified_rows"`
	VerifyFailures int64 `json:"verify_failures"`
	// VerifyRepeated and VerifyMissing are rows a request was delivered a
	// second time, or never (delivery positions; part of the failures).
	VerifyRepeated int64     `json:"verify_repeated_rows"`
	VerifyMissing  int64     `json:"verify_missing_rows"`
	Failures       []Failure `json:"failures,omitempty"`

	WallNs int64 `json:"wall_ns"`
	// BusyCores are the cores kept busy beside the engine (Options.Busy).
	BusyCores int `json:"busy_cores"`
	// CPUs are the machine's logical CPUs, LoadAverage its 1-minute load
	// average when the replay started (Options.LoadAverage; negative:
	// unknown). A load above the CPUs leaves a missed target unjudged
	// (Check).
	CPUs        int     `json:"cpus"`
	LoadAverage float64 `json:"load_average"`
	// Stats is the cache's Stats at the end (flattened above for JSON).
	Stats *omnicache.Stats `json:"-"`

	Samples []StepSample `json:"-"`
}

// Best is the run of runs (the cache-on runs of one workload) with the
// highest projected throughput, other processes on a shared machine only
// adding to the cache's measured time, with Repeats and the range of the
// runs' projected changes set. nil for no runs.
func Best(runs []*Report) *Report {
	if len(runs) == 0 {
		return nil
	}
	best := runs[0]
	lo, hi := best.ProjectedChange, best.ProjectedChange
	for _, r := range runs[1:] {
		if r.ModelReqPerSec > best.ModelReqPerSec {
			best = r
		}
		lo, hi = min(lo, r.ProjectedChange), max(hi, r.ProjectedChange)
	}
	best.Repeats, best.ProjectedChangeMin, best.ProjectedChangeMax = len(runs), lo, hi
	return best
}

// WarmEngineNs is the engine goroutine's cache time after the first step:
// the part of EngineNsTotal a running server pays per workload.
func (r *Report) WarmEngineNs() int64 { return r.EngineNsTotal - r.FirstStepEngineNs }

// SizeBuckets sums steps' Begin + Save time per power-of-two bucket of
// their tokens (bucket b: tokens in [2^(b-1), 2^b)); [1] counts the steps
// whose arrivals hit, [0] the others. JSON: two arrays of 33 {n, ns}.
type SizeBuckets [2][33]SizeBucket

// SizeBucket is one bucket's steps and their summed Begin + Save time.
type SizeBucket struct {
	N  int64 `json:"n"`
	Ns int64 `json:"ns"`
}

// add counts one step.
func (s *SizeBuckets) add(hit bool, tokens int, ns int64) {
	k := 0
	if hit {
		k = 1
	}
	b := &s[k][bits.Len32(uint32(tokens))]
	b.N++
	b.Ns += ns
}

// HitVsMiss compares the Begin + Save of hit's steps whose arrivals hit
// with that of steps of the same size without a hit in any of runs (the
// same model's cache-on runs: the same keys): per bucket that has both,
// weighted as the hit steps are. n is the hit steps compared (0: none),
// misses the steps without a hit they were compared with.
func HitVsMiss(hit *Report, runs []*Report) (hitNs, missNs float64, n, misses int64) {
	var miss [33]SizeBucket
	for _, r := range runs {
		if r.Cache != "on" || r.Keys != hit.Keys || r.Model != hit.Model {
			continue
		}
		for b, m := range r.BySize[0] {
			miss[b].N += m.N
			miss[b].Ns += m.Ns
		}
	}
	var hitSum int64
	for b, h := range hit.BySize[1] {
		m := miss[b]
		if h.N == 0 || m.N == 0 {
			continue
		}
		n += h.N
		misses += m.N
		hitSum += h.Ns
		missNs += float64(h.N) * float64(m.Ns) / float64(m.N)
	}
	if n == 0 {
		return 0, 0, 0, 0
	}
	return float64(hitSum) / float64(n), missNs / float64(n), n, misses
}
