// The P/D replay's run: the prefill and decode replicas on one projected
// clock each, stepped earliest first; the client, the proxy's routing and
// the handover between the pools.

package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
	"github.com/omnicache/omnicache/tier"
)

// pdReq is one client request's way through the pools.
type pdReq struct {
	q      sim.Request
	sent   float64 // projected ns: the client sent it
	handed float64 // projected ns: its prefill was done and published (its KV transferred)
	first  float64 // projected ns: its first packet at the next stage (<0: not yet)
	// hashes are its prompt's full blocks' chained hashes (its prefill's).
	hashes []uint64
	failed int  // decode attempts that failed
	done   bool // its last token sampled
}

// maxDecodeFailures bounds a request's failed decode attempts: the
// recomputation of a request whose import failed loads nothing from the
// tier, so a second failure is a bug of the replay.
const maxDecodeFailures = 2

// pdItem is a request handed to a replica: admissible from ready on.
type pdItem struct {
	g     int
	ready float64
	rows  bool // decode: its prompt's rows are in the tier (WaitPublished said so)
}

// pdNode is one replica of a pool: its engine (replica), its projected
// clock, the requests handed to it; it is its simulator's source.
type pdNode struct {
	run     *pdRun
	r       *replica
	decode  bool
	i       int     // index in its pool
	clock   float64 // projected ns: the end of its last step (the start of the next, once picked)
	steps   int
	imports int // steps with a tier import
	queue   []pdItem
	// glob and rows: per simulator request (ID-1), the client request and
	// whether it came with its rows in the tier.
	glob     []int
	rows     []bool
	inflight int // handed to its simulator, not finished or aborted
	// conn (decode): the hashes its KV connector can load, counted per
	// request that brought them: the transferred prompts' blocks.
	conn map[uint64]int
}

// Next implements sim.Source: the earliest request handed to n that is
// admissible at its clock.
func (n *pdNode) Next() (sim.Request, bool, error) {
	k := -1
	for i, it := range n.queue {
		if it.ready <= n.clock && (k < 0 || it.ready < n.queue[k].ready) {
			k = i
		}
	}
	if k < 0 {
		if n.finished() {
			return sim.Request{}, false, nil
		}
		return sim.Request{}, false, sim.ErrNoRequestYet
	}
	it := n.queue[k]
	n.queue = slices.Delete(n.queue, k, k+1)
	q := n.run.reqs[it.g].q
	// Clipped: each simulator appends its own sampled tokens.
	req := sim.Request{Prompt: slices.Clip(q.Prompt), OutputLen: 1}
	if n.decode {
		req.OutputLen, req.Replace, req.NoExternal = q.OutputLen, q.Replace, !it.rows
		if !it.rows {
			n.run.recomputed++
		}
	}
	n.glob, n.rows = append(n.glob, it.g), append(n.rows, it.rows)
	n.inflight++
	return req, true, nil
}

// Load implements sim.External (decode): the leading blocks of hashes that
// a transferred prompt brought.
func (n *pdNode) Load(hashes []uint64) int {
	for i, h := range hashes {
		if n.conn[h] == 0 {
			return i
		}
	}
	return len(hashes)
}

// finished reports that no request will be handed to n any more.
func (n *pdNode) finished() bool {
	run := n.run
	return (run.srcDone || run.arrivals != nil && len(run.reqs) >= len(run.arrivals)) && len(n.queue) == 0 && n.inflight == 0 && (!n.decode || run.atPrefill == 0)
}

// next is when n can run its next step (+Inf: nothing to run now).
func (n *pdNode) next() float64 {
	if n.r.done {
		return math.Inf(1)
	}
	if n.r.s.Pending() > 0 {
		return n.clock
	}
	t := math.Inf(1)
	for _, it := range n.queue {
		t = min(t, it.ready)
	}
	return max(n.clock, t)
}

func (n *pdNode) push(it pdItem) {
	n.queue = append(n.queue, it)
	if it.rows {
		for _, h := range n.run.reqs[it.g].hashes {
			n.conn[h]++
		}
	}
}

func (n *pdNode) name() string {
	if n.decode {
		return fmt.Sprintf("decode replica %d", n.i)
	}
	return fmt.Sprintf("prefill replica %d", n.i)
}

// pdRun is one run of the P/D replay (tr nil: without the tier).
type pdRun struct {
	o       PDOptions
	cost    StepCost
	tr      *tier.Tier
	bs      int
	src     sim.Source
	srcDone bool
	err     error
	reqs    []*pdReq
	// open: sent and not finished; atPrefill: sent and not handed to
	// a decode replica.
	open, atPrefill int
	pre, dec        []*pdNode
	rrPre, rrDec    int

	// arrivals, when set, are the client's send times (projected ns, in
	// its order): an open loop replaying another run's sends, so that both
	// runs' time to first packet is under the same offered load. Without
	// them the client is a closed loop of Concurrency requests.
	arrivals []float64

	promptTokens                                         int64
	pubWait, importWait, decodeSteps                     []int64
	publishFailed, importFailed, otherFailed, recomputed int64
}

// pdResult is a finished run.
type pdResult struct {
	*pdRun
	prefill, decode ReplicaReport
	per             []ReplicaReport
	// ttfp from the client's send, decodeTTFP from the handover.
	ttfp, decodeTTFP Latency
}

// runPD runs spec's requests through pre prefill and dec decode... replicas
// of the given pools (KV blocks each) over tr (nil: none, the decode side
// recomputes every prompt).
func runPD(spec Spec, o PDOptions, cost StepCost, preBlocks, decBlocks int, tr *tier.Tier, arrivals []float64) (*pdResult, error) {
	run := &pdRun{o: o, cost: cost, tr: tr, bs: o.BlockSize, src: spec.Source(), arrivals: arrivals}
	var all []*pdNode
	defer func() {
		for _, n := range all {
			if n.r != nil {
				n.r.close()
			}
		}
	}()
	for k, size := range []int{o.Prefill, o.Decode} {
		decode := k == 1
		conc, blocks := (spec.Concurrency+size-1)/size, preBlocks
		if decode {
			blocks = decBlocks
		}
		for i := range size {
			n := &pdNode{run: run, decode: decode, i: i}
			rs := replicaSetup{idx: len(all), blocks: blocks, conc: conc, src: n, tier: tr, withCache: true}
			if decode {
				n.conn, rs.external = map[uint64]int{}, n
				run.dec = append(run.dec, n)
			} else {
				rs.fullBlocks = tr != nil
				// Every block the pool holds may wait to be published.
				rs.tierConfig = func(tc *omnicache.TierConfig) {
					tc.PublishBarrier, tc.AdmitAfter = true, 0
					tc.PublishQueue = min(max(omnicache.DefaultPublishQueue, blocks), omnicache.MaxPublishQueue)
				}
				run.pre = append(run.pre, n)
			}
			all = append(all, n)
			var err error
			if n.r, err = newReplica(spec, o.ReplicaOptions, rs); err != nil {
				return nil, err
			}
		}
	}
	if arrivals == nil {
		for range spec.Concurrency { // the client's first requests
			run.send(0)
		}
	}
	for round := 0; ; round++ {
		var n *pdNode
		at := math.Inf(1)
		for _, m := range all {
			if t := m.next(); t < at {
				n, at = m, t
			}
		}
		if run.err != nil {
			return nil, run.err
		}
		if k := len(run.reqs); k < len(arrivals) && arrivals[k] <= at {
			run.send(arrivals[k]) // the open loop's next request, before any step after it
			continue
		}
		if n == nil {
			break
		}
		n.clock = at
		if err := n.r.step(); err != nil {
			return nil, fmt.Errorf("%s: %w", n.name(), err)
		}
		st := n.r.last
		if st == nil {
			return nil, fmt.Errorf("%s: idle with %d requests handed to it", n.name(), len(n.queue))
		}
		ns := cost.Ns(st.Cost)
		if n.steps > 0 { // the first step's cache time is start-up
			ns += float64(n.r.lastEngine)
		}
		n.steps++
		n.clock += ns
		if n.decode && len(st.Plan.TierHashes) > 0 {
			// The step's forward covers its import; the engine waits for
			// what is left (the consumer's import wait).
			n.imports++
			lat, err := n.r.importLatency(n.imports)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n.name(), err)
			}
			wait := max(0, lat-int64(cost.Ns(st.Cost)))
			run.importWait = append(run.importWait, wait)
			n.clock += float64(wait)
		}
		if n.decode {
			if err := run.decoded(n, st); err != nil {
				return nil, fmt.Errorf("%s: %w", n.name(), err)
			}
		} else {
			run.prefilled(n, st)
		}
		if tr != nil && o.AfterRound != nil {
			o.AfterRound(round)
		}
	}
	if run.open > 0 {
		return nil, fmt.Errorf("bench: P/D: %d requests never finished", run.open)
	}
	return run.finish(all)
}

// send lets the client send its next request at projected time at, to a
// prefill replica.
func (run *pdRun) send(at float64) {
	if run.srcDone {
		return
	}
	q, ok, err := run.src.Next()
	if err != nil || !ok {
		run.srcDone, run.err = true, err
		return
	}
	g := len(run.reqs)
	run.reqs = append(run.reqs, &pdReq{q: q, sent: at, first: -1})
	run.open++
	run.atPrefill++
	run.promptTokens += int64(len(q.Prompt))
	run.route(run.pre, &run.rrPre).push(pdItem{g: g, ready: at})
}

// route picks a replica of pool as the proxy does.
func (run *pdRun) route(pool []*pdNode, rr *int) *pdNode {
	if run.o.Route == RouteLeastLoaded {
		best := pool[0]
		for _, n := range pool[1:] {
			if len(n.queue)+n.inflight < len(best.queue)+best.inflight {
				best = n
			}
		}
		return best
	}
	n := pool[*rr%len(pool)]
	*rr++
	return n
}

// prefilled hands the requests whose prefill step st finished to decode
// replicas, once their blocks are in the tier.
func (run *pdRun) prefilled(n *pdNode, st *sim.Step) {
	bs := run.bs
	for _, r := range st.Reqs {
		if r.Generated() < r.OutputLen {
			continue
		}
		n.inflight--
		run.atPrefill--
		g := n.glob[r.ID-1]
		q := run.reqs[g]
		full := r.PromptLen / bs
		q.hashes = make([]uint64, full)
		for j := range q.hashes {
			q.hashes[j] = r.H[(j+1)*bs-1]
		}
		handed, rows := n.clock, false
		if run.tr != nil {
			// The blocks this prefill computed; those its prefix cache hit
			// were published when they were computed.
			computed := q.hashes[min(r.ArrivalHit/bs, full):]
			ctx, cancel := context.WithTimeout(context.Background(), run.o.PublishTimeout)
			t := time.Now()
			err := n.r.c.WaitPublished(ctx, computed)
			w := time.Since(t).Nanoseconds()
			cancel()
			run.pubWait = append(run.pubWait, w)
			handed += float64(w)
			if rows = err == nil; !rows {
				run.publishFailed++
			} else if run.o.OnHandover != nil {
				run.o.OnHandover(g, q.hashes)
			}
		}
		q.handed = handed
		run.route(run.dec, &run.rrDec).push(pdItem{g: g, ready: handed, rows: rows})
	}
}

// decoded records decode step st: the transferred prompts it admitted, the
// requests whose rows it could not serve (aborted and recomputed), first
// packets and finished requests (the client sends its next).
func (run *pdRun) decoded(n *pdNode, st *sim.Step) error {
	for _, id := range st.Plan.Arrivals {
		if k := id - 1; n.rows[k] {
			n.rows[k] = false
			for _, h := range run.reqs[n.glob[k]].hashes {
				if n.conn[h]--; n.conn[h] == 0 {
					delete(n.conn, h)
				}
			}
		}
	}
	failed := n.r.lastFailed
	for i, id := range failed {
		// Its imported blocks' rows are lost: no later hit may take them.
		eachTierBlock(st, run.bs, func(_ *sim.Req, rid int64, block int32, _ int) {
			if rid == id {
				n.r.s.KV().Unregister(block)
			}
		})
		n.r.s.Abort(id)
		n.inflight--
		q := run.reqs[n.glob[id-1]]
		if q.failed++; q.failed >= maxDecodeFailures {
			return fmt.Errorf("request %d failed %d times on the decode side, last: %w", n.glob[id-1], q.failed, n.r.lastFailErr[i])
		}
		if errors.Is(n.r.lastFailErr[i], omnicache.ErrTierMiss) {
			run.importFailed++
		} else {
			run.otherFailed++
		}
		n.push(pdItem{g: n.glob[id-1], ready: n.clock})
	}
	for i, r := range st.Reqs {
		if slices.Contains(failed, r.ID) {
			continue
		}
		q := run.reqs[n.glob[r.ID-1]]
		if q.first < 0 && r.Computed() >= r.PromptLen {
			q.first = n.clock
			if st.Prefix[i] > 0 && n.r.lastMat > 0 {
				q.first += float64(n.r.lastMat)
			}
		}
		if r.Generated() >= r.OutputLen {
			if q.done {
				return fmt.Errorf("request %d finished twice", n.glob[r.ID-1])
			}
			q.done = true
			n.inflight--
			run.open--
			if run.arrivals == nil {
				run.send(n.clock)
			}
		}
	}
	if st.PureDecode {
		run.decodeSteps = append(run.decodeSteps, int64(run.cost.Ns(st.Cost)))
	}
	return nil
}

// finish closes the replicas and gathers the pools' reports and the time
// to first packet.
func (run *pdRun) finish(all []*pdNode) (*pdResult, error) {
	res := &pdResult{pdRun: run}
	var lat, steps [2][]int64
	for _, n := range all {
		pr, err := n.r.finish()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.name(), err)
		}
		k, pool := 0, &res.prefill
		if n.decode {
			k, pool = 1, &res.decode
		}
		res.per = append(res.per, pr)
		pool.add(pr)
		lat[k] = append(lat[k], n.r.lat...)
		steps[k] = append(steps[k], n.r.stepNs...)
	}
	res.prefill.Replica, res.decode.Replica = -1, -1
	res.prefill.finishRates(lat[0], steps[0])
	res.decode.finishRates(lat[1], steps[1])
	var ttfp, dec []int64
	for _, q := range run.reqs {
		if q.first < 0 {
			return nil, fmt.Errorf("bench: P/D: a request finished without its first packet")
		}
		ttfp, dec = append(ttfp, int64(q.first-q.sent)), append(dec, int64(q.first-q.handed))
	}
	res.ttfp, res.decodeTTFP = percentiles(ttfp), percentiles(dec)
	return res, nil
}
