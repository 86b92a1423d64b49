// Package sim is the engine simulator behind the replay: a vLLM-v1-like
// scheduler with continuous batching, chunked prefill under a token budget,
// a KV block manager with chained prefix hashes and least-recently-freed
// reuse, and preemption by recompute. It produces, per engine step, the
// omnicache.Plan an engine would hand the cache.
//
// One step's life, driven by the caller (the engine goroutine):
//
//	st, err := s.Next()  // admit client requests, schedule, build st.Plan
//	cache.Begin(&st.Plan)
//	s.Release()          // now drop the requests st.Plan.Finished names
//	...forward, cache.Save...
//	s.Advance()          // the forward ran: advance positions, sample tokens
//
// Next calls Release and Advance itself when the caller skipped them (cache
// off). Tokens are a deterministic function of the prefix: the simulator
// keeps per request the rolling hash H[p] of tokens[0..p] and a sampled
// output token is derived from H[p-1], so equal prefixes continue equally and
// a row oracle keyed by H[p] is exact.
package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/omnicache/omnicache"
)

// Config sizes the simulated engine.
type Config struct {
	// BlockSize is the KV block size in tokens (default 16).
	BlockSize int
	// NumBlocks is the KV pool size in blocks.
	NumBlocks int
	// MaxBatchedTokens is the per-step token budget (default 8192).
	MaxBatchedTokens int
	// Concurrency is the number of requests the client keeps in flight and
	// the most the engine runs at once.
	Concurrency int
	// MaxModelLen bounds prompt+output tokens of any request; it sizes the
	// block table stride.
	MaxModelLen int
	// Vocab is the vocabulary sampled tokens are drawn from (default 151936).
	Vocab int
	// NoPrefixCaching turns the KV prefix cache off (vLLM's
	// enable_prefix_caching: false): no lookup hits, every prompt token is
	// computed, and freed blocks keep no hash.
	NoPrefixCaching bool
	// External, when set, is a KV store shared with other engines (a KV
	// connector): a fresh arrival's full blocks past its local hit that it
	// can load are loaded into newly allocated blocks and count as hit
	// tokens; the plan names them in TierBlocks/TierHashes so the cache
	// imports their rows.
	External External
	// FullBlocks fills Plan.FullBlocks/FullHashes with the full blocks each
	// step computes (for a cache that publishes them to a tier).
	FullBlocks bool
	// SpecTokens, when > 0, turns speculative decoding on: a decoding
	// request schedules its next token and up to SpecTokens draft tokens.
	// A draft is the true next token with probability SpecAcceptPct
	// percent (drawn from SpecSeed), else another token; the drafts are
	// accepted up to the first wrong one (Step.Accepted).
	SpecTokens    int
	SpecAcceptPct int
	SpecSeed      uint64
}

// External is a shared KV store seen from one engine.
type External interface {
	// Load returns how many leading blocks of hashes (chained block hashes,
	// the blocks following the local hit) the engine can load.
	Load(hashes []uint64) int
}

// Request is one prompt the client sends.
type Request struct {
	Prompt    []int32
	OutputLen int
	// Replace, when set, replaces the request's tokens mid-flight
	// (streaming input).
	Replace *Replace
	// NoExternal: Config.External loads nothing for this request (an
	// engine recomputing a prompt whose loaded rows were lost).
	NoExternal bool
}

// Replace is a replacement of a request's tokens: once the request has
// computed At positions (and still runs), its tokens from From on (From <=
// At) become Tokens, all of them input, and it generates OutputLen tokens
// after them. The engine rolls it back to From and recomputes from there.
type Replace struct {
	At, From int
	Tokens   []int32
}

// Source yields requests in admission order.
type Source interface {
	// Next returns the next request; ok is false when the source is done.
	// An error matching ErrNoRequestYet means none is ready now: the
	// simulator asks again at its next step.
	Next() (r Request, ok bool, err error)
}

// ErrTooLarge reports a request that cannot fit the KV pool or the model
// length even alone.
var ErrTooLarge = errors.New("sim: request larger than the KV pool or model length")

// ErrNoRequestYet is a Source's answer when it has no request ready now but
// may have one later (a decode instance waiting for prefills to finish).
var ErrNoRequestYet = errors.New("sim: no request ready yet")

// ErrIdle is Next's answer when nothing can be scheduled now: no request
// waits or runs and the source has none ready (ErrNoRequestYet). Nothing
// changed; call Next again once the source has one.
var ErrIdle = errors.New("sim: idle, no request ready")

// Req is a request inside the simulator. Tokens and H grow as tokens are
// sampled and never change once written: a replacement (Request.Replace)
// gives the request new slices, so a step's record of r.H (to its capacity)
// stays valid for its positions after later steps.
type Req struct {
	ID        int64
	PromptLen int
	OutputLen int
	// NoExternal: Config.External loads nothing for it (Request.NoExternal).
	NoExternal bool
	// Tokens are the prompt and the tokens sampled so far.
	Tokens []int32
	// H[p] is the rolling hash of Tokens[:p+1].
	H []uint64
	// ArrivalHit is the prefix hit (tokens) at the request's first step.
	ArrivalHit int
	// Sent is the number of steps the engine had run when the client sent
	// the request (it arrives at the end of step Sent-1, or at the start).
	Sent int
	// Replace is the replacement still to come (nil: none).
	Replace *Replace

	computed  int
	generated int
	blocks    []int32
	hashed    int
	loaded    int // leading blocks whose KV was hit or loaded, not computed
	row       int32
	state     uint8
	seen      bool
	preempted bool
}

const (
	stWaiting uint8 = iota
	stRunning
	stFinishing // last token sampled; reported in the next step's Finished
	stDone
)

// Computed is the number of positions whose KV exists.
func (r *Req) Computed() int { return r.computed }

// Generated is the number of output tokens sampled so far.
func (r *Req) Generated() int { return r.generated }

// Blocks returns the request's KV blocks in position order (borrowed).
func (r *Req) Blocks() []int32 { return r.blocks }

// Step is one scheduled engine step. Everything in it is reused by the next
// call to Next.
type Step struct {
	// Index counts steps from 0.
	Index int
	// Plan is what the engine hands to Cache.Begin.
	Plan omnicache.Plan
	// Reqs are the scheduled requests, parallel to Plan.IDs.
	Reqs []*Req
	// Prefix is, parallel to Plan.IDs, the hit prefix Materialize returns
	// for the request this step: its hit on its first step or on a resume
	// that hit, else 0.
	Prefix []int32
	// Accepted is, parallel to Plan.IDs, how many of the request's
	// scheduled tokens the step accepts (Outputs.Accepted): Count but for
	// speculative decodes.
	Accepted []int32
	// RowH is, with speculative decoding, per scheduled token (token
	// order) the prefix hash the forward sees there: a draft token's
	// prefix, which differs from the request's H from the first rejected
	// draft on. Nil without speculative decoding.
	RowH []uint64
	// Rejected is the number of rejected draft tokens this step.
	Rejected int
	// Tokens is the number of scheduled tokens.
	Tokens int
	// PureDecode: every request computes one token and nothing arrives,
	// finishes, is preempted, resumed or replaced.
	PureDecode bool
	// Queried and Hit are the prompt tokens looked up at arrival this step
	// and the tokens that hit; ExtHit are the hit tokens loaded through
	// Config.External (counted in Hit too).
	Queried, Hit, ExtHit int
	// Cost is what the step computes, the step-cost model's inputs.
	Cost Work
}

// Work is what the forward of one step (or of many, summed) computes.
type Work struct {
	// Steps is the number of steps (1 for one step).
	Steps int64
	// PrefillTokens are the scheduled tokens that are not decodes: prompt
	// chunks, and recomputation after preemption. Prefix hits are not
	// scheduled, so they are not counted.
	PrefillTokens int64
	// Attention is, over the prefill chunks, Σ chunk_len × context_len, with
	// context_len the tokens the chunk's last token attends to (start +
	// chunk_len): the quadratic part of a prefill.
	Attention int64
	// DecodeSeqs are the requests decoding one sampled token.
	DecodeSeqs int64
}

// Add accumulates w into a sum.
func (a *Work) Add(w Work) {
	a.Steps += w.Steps
	a.PrefillTokens += w.PrefillTokens
	a.Attention += w.Attention
	a.DecodeSeqs += w.DecodeSeqs
}

// Sim is the simulated engine. Not safe for concurrent use.
type Sim struct {
	cfg    Config
	src    Source
	blocks *Blocks
	stride int
	table  []int32
	rows   []int32 // free block-table rows (stack)

	waiting   []*Req // FIFO; preempted requests go to the front
	running   []*Req // admission order; preemption takes the last
	finishing []*Req // finished in the last step, reported in the next
	reported  []*Req // reported in the current step's Finished, dropped by Release
	inFlight  int
	srcDone   bool
	nextID    int64

	step      Step
	stepValid bool
	advanced  bool
	released  bool
	hitBuf    []int32
	extBuf    []uint64

	// Counters over the whole run.
	Work        Work // summed over the steps
	Steps       int
	TokensTotal int64
	Queried     int64
	Hit         int64
	ExtHit      int64 // of Hit, loaded through Config.External
	Preemptions int64
	Finished    int64
	Arrived     int64
	Aborted     int64 // Abort
	// ResumedHits are resumes of preempted requests that hit their
	// prefix (listed in Plan.Arrivals as well as Plan.Resumed).
	ResumedHits int64
	// Replaces are requests whose tokens were replaced mid-flight.
	Replaces int64
	// Drafts and Rejected are the draft tokens scheduled and rejected.
	Drafts, Rejected int64

	rng uint64 // speculative decoding's draws
}

// maxTableEntries bounds the block table (1 GiB of int32).
const maxTableEntries = 1 << 28

// New returns a simulator reading requests from src.
func New(cfg Config, src Source) (*Sim, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.MaxBatchedTokens == 0 {
		cfg.MaxBatchedTokens = 8192
	}
	if cfg.Vocab == 0 {
		cfg.Vocab = 151936
	}
	if cfg.BlockSize <= 0 || cfg.NumBlocks <= 0 || cfg.MaxBatchedTokens <= 0 ||
		cfg.Concurrency <= 0 || cfg.MaxModelLen <= 0 || cfg.Vocab <= 0 {
		return nil, fmt.Errorf("sim: bad config %+v", cfg)
	}
	// The block table is 2*Concurrency rows of MaxModelLen/BlockSize: refuse
	// one that cannot be allocated rather than die trying.
	if stride := (int64(cfg.MaxModelLen) + int64(cfg.BlockSize) - 1) / int64(cfg.BlockSize); stride*2*int64(cfg.Concurrency) > maxTableEntries {
		return nil, fmt.Errorf("sim: block table of %d rows of %d blocks is too large (max model length %d, concurrency %d)",
			2*cfg.Concurrency, stride, cfg.MaxModelLen, cfg.Concurrency)
	}
	s := &Sim{
		cfg:    cfg,
		src:    src,
		blocks: NewBlocks(cfg.NumBlocks),
		stride: (cfg.MaxModelLen + cfg.BlockSize - 1) / cfg.BlockSize,
	}
	nrows := 2 * cfg.Concurrency
	s.table = make([]int32, nrows*s.stride)
	for i := nrows - 1; i >= 0; i-- {
		s.rows = append(s.rows, int32(i))
	}
	s.released, s.advanced = true, true
	s.rng = cfg.SpecSeed
	return s, nil
}

// Config returns the configuration with defaults applied.
func (s *Sim) Config() Config { return s.cfg }

// KV returns the block manager (for tests and reports).
func (s *Sim) KV() *Blocks { return s.blocks }

// Stride is the block table's row stride (max blocks per request).
func (s *Sim) Stride() int { return s.stride }

// Table returns the block table, row-major [2*Concurrency][Stride].
func (s *Sim) Table() []int32 { return s.table }

// Slot returns the KV slot of position pos of a request in table row row.
func (s *Sim) Slot(row int32, pos int) int32 {
	bs := s.cfg.BlockSize
	return s.table[int(row)*s.stride+pos/bs]*int32(bs) + int32(pos%bs)
}

// Live is the number of requests in flight (waiting, running or finishing).
func (s *Sim) Live() int {
	return len(s.waiting) + len(s.running) + len(s.finishing) + len(s.reported)
}

// Pending is the number of requests waiting or running: Next has something
// to schedule.
func (s *Sim) Pending() int { return len(s.waiting) + len(s.running) }

// Abort ends request id between steps (after Advance, before Next), as an
// engine aborting it does: a running or preempted one is reported in the
// next step's Plan.Finished (its blocks are freed by that step's Release,
// their hashes kept) and no longer counts in flight; one the engine never
// scheduled is dropped. It reports whether the request was live and not
// finishing already.
func (s *Sim) Abort(id int64) bool {
	for i, r := range s.running {
		if r.ID == id {
			s.running = slices.Delete(s.running, i, i+1)
			s.abort(r)
			return true
		}
	}
	for i, r := range s.waiting {
		if r.ID == id {
			s.waiting = slices.Delete(s.waiting, i, i+1)
			if r.seen {
				s.abort(r)
			} else {
				s.inFlight--
				r.state = stDone
			}
			return true
		}
	}
	return false
}

func (s *Sim) abort(r *Req) {
	r.state = stFinishing
	s.finishing = append(s.finishing, r)
	s.inFlight--
	s.Aborted++
}

// Next schedules the next step. It returns nil when every request has
// finished.
func (s *Sim) Next() (*Step, error) {
	if s.stepValid {
		s.Release()
		s.Advance()
	}
	if err := s.topUp(); err != nil {
		return nil, err
	}
	if len(s.waiting) == 0 && len(s.running) == 0 && !s.srcDone {
		s.stepValid = false
		return nil, ErrIdle // finished requests are reported by the next step
	}
	if len(s.waiting) == 0 && len(s.running) == 0 {
		// Done; requests finished in the last step are dropped unreported
		// (an engine with nothing to schedule runs no step).
		s.dropAll(&s.reported)
		s.dropAll(&s.finishing)
		s.stepValid = false
		return nil, nil
	}
	if err := s.schedule(); err != nil {
		return nil, err
	}
	s.stepValid, s.released, s.advanced = true, false, false
	return &s.step, nil
}

// Release frees the blocks of the requests the current step reports in
// Plan.Finished. Call it after Cache.Begin: Begin runs before the engine
// drops finished requests.
func (s *Sim) Release() {
	if !s.stepValid || s.released {
		return
	}
	s.released = true
	s.dropAll(&s.reported)
}

// Advance applies the current step's forward: positions advance, a request
// whose known tokens are all computed samples its next token, and one that
// sampled its last output token finishes (reported in the next step).
func (s *Sim) Advance() {
	if !s.stepValid || s.advanced {
		return
	}
	s.advanced = true
	st := &s.step
	finished := 0
	for i, r := range st.Reqs {
		r.computed += int(st.Accepted[i])
		if st.Accepted[i] < st.Plan.Count[i] {
			// Rejected drafts: their KV is dropped, the blocks only
			// they used go back to the pool (never hashed: hashes cover
			// known tokens).
			keep := s.blocksFor(r.computed)
			for j := len(r.blocks) - 1; j >= keep; j-- {
				s.blocks.Free(r.blocks[j])
			}
			r.blocks = r.blocks[:keep]
		}
		// Sample: the next token is a function of the prefix. Accepted
		// drafts were the tokens sampled here, the last sample the bonus.
		for r.computed >= len(r.Tokens) && r.state == stRunning {
			p := len(r.Tokens)
			t := int32(SplitMix64(r.H[p-1]) % uint64(s.cfg.Vocab))
			r.Tokens = append(r.Tokens, t)
			r.H = append(r.H, Mix(r.H[p-1], t))
			r.generated++
			if r.generated >= r.OutputLen {
				r.state = stFinishing
				s.finishing = append(s.finishing, r)
				s.Finished++
				s.inFlight-- // the client sees the last token now and sends the next request
				finished++
			}
		}
	}
	if finished > 0 {
		k := 0
		for _, r := range s.running {
			if r.state == stRunning {
				s.running[k] = r
				k++
			}
		}
		clear(s.running[k:])
		s.running = s.running[:k]
	}
}
