// The runner: per-step accounting, the cache-off replay, the output
// goroutine, pacing and the report's totals.

package replay

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
)

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
	lat         latency
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
	// The forward's model time not already spent holding (Options.Hold):
	// what a wait after the forward could still overlap.
	t := max(int64(r.cost.Ns(st.Cost))-smp.HoldNs, 0)
	r.rep.ForwardHoldNs += smp.HoldNs
	r.rep.BacklogNs += max(0, smp.StallNs-t)
	r.rep.OutputBacklogNs += max(0, smp.OutputWaitNs-t)
	// The projected clock: as the throughput projection counts steps (the
	// first step's cache time is start-up, outside it).
	ns := r.cost.Ns(st.Cost)
	if r.rep.Cache == "on" {
		if len(r.engine) > 1 {
			ns += float64(smp.EngineNs)
		}
		ns += float64(max(0, smp.OutputWaitNs-t))
	}
	r.lat.step(st, ns)
	if st.PureDecode {
		r.rep.PureDecode++
	} else if r.rep.Cache == "on" {
		r.rep.BySize.add(st.Hit > 0, st.Tokens, smp.BeginNs+smp.SaveNs)
	}
	if r.o.KeepSamples {
		smp.Tokens, smp.Queried, smp.Hit, smp.Pure = int32(st.Tokens), int32(st.Queried), int32(st.Hit), st.PureDecode
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

// holdTime is how long the forward of st is held (Options.Hold): its model
// time, at most HoldMax when set.
func (r *runner) holdTime(st *sim.Step) time.Duration {
	d := time.Duration(r.cost.Ns(st.Cost))
	if r.o.HoldMax > 0 {
		d = min(d, r.o.HoldMax)
	}
	return d
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
	g.r.lat.materialized(j.rec.index, d.ns)
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

// pace waits outside the timed calls until a staging page is free and no
// page's memory is being allocated ahead (see Options.Pace; the forward
// gives the cache's background page allocation that time). It gives up
// after a second and lets Save wait (the wait then counts in Save's time).
func (r *runner) pace(c Cache, depth int) int64 {
	busy := func() bool {
		st := c.Stats()
		return st.PagesInUse >= depth || st.PagesAllocating > 0
	}
	if !busy() {
		return 0
	}
	t := time.Now()
	for i := 0; busy(); i++ {
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
	rep.ResumedHits, rep.Replaces = sch.ResumedHits, sch.Replaces
	rep.SpecDrafts, rep.SpecRejected = sch.SpecDrafts, sch.SpecRejected
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
