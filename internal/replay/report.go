package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// TargetLoss is the projected throughput loss allowed at a 0% hit rate
// (the project's design target).
const TargetLoss = 0.001

// TargetGainPoints is how far a hit workload's projected change may be from
// the reference's change after its fix: ±15 percentage points.
const TargetGainPoints = 0.15

// TableWidth is the most columns the default table (WriteTable) takes.
const TableWidth = 120

// workloadRuns pairs the cache-off and cache-on reports of one workload.
type workloadRuns struct {
	name    string
	off, on *Report
}

// any is the report the workload-level numbers come from (the same in both).
func (w *workloadRuns) any() *Report {
	if w.on != nil {
		return w.on
	}
	return w.off
}

func pairRuns(reps []*Report) []*workloadRuns {
	var out []*workloadRuns
	byName := map[string]*workloadRuns{}
	for _, r := range reps {
		w := byName[r.Name]
		if w == nil {
			w = &workloadRuns{name: r.Name}
			byName[r.Name] = w
			out = append(out, w)
		}
		if r.Cache == "on" {
			w.on = r
		} else {
			w.off = r
		}
	}
	return out
}

// Verdict is the reports measured against the targets.
type Verdict struct {
	// ZeroHit counts the cache-on runs without a hit; WorstLoss is their
	// largest projected loss (a fraction ≥ 0), in WorstLossName.
	ZeroHit       int
	WorstLoss     float64
	WorstLossName string
	// Hits are the cache-on runs with hits, each against the reference.
	Hits []HitResult
	// Missed names every target missed, one line each.
	Missed []string
	// Verified: a run checked its rows (--verify), materializing and
	// checking every step's rows on the engine goroutine; its step times
	// are not the targets', so the 0%-hit loss and the hit gains are not
	// judged (not Missed).
	Verified bool
	// Busy says why the machine was too busy for a missed target to be
	// judged (empty: quiet): its load average at the start above its CPUs
	// (verdict.go).
	Busy string
	// Unjudged names every target missed while the machine (Busy) or the
	// figure's own runs (their range wider than the target's tolerance)
	// say it was too busy for the figure: neither met nor Missed.
	Unjudged []string
	// unsteady are the figures whose runs moved too much, with by how much.
	unsteady []string
	// lossVerdict, the hits' verdicts: the summary's words.
	lossVerdict string
}

// HitResult is a workload with hits: its projected change against the
// reference's change after its fix.
type HitResult struct {
	Name             string
	HitRate          float64
	Projected        float64
	HasRef           bool
	RefAfter         float64
	RefLo, RefHi     float64
	WithinGainTarget bool
	// Verdict is the summary's word on it: ok, OFF TARGET, or not judged.
	Verdict string
}

// Check measures the reports against the targets: every cache-on run without
// a hit loses at most TargetLoss, and every one with a hit projects within
// TargetGainPoints of the reference's change after its fix (when the
// workload has a reference). A target missed on a busy machine is not
// judged (Verdict.Unjudged; verdict.go), but a gain above the reference's
// band is Missed whatever the load: load only lowers a projection.
func Check(reps []*Report) Verdict {
	v := Verdict{Busy: busyMachine(reps), lossVerdict: "ok"}
	for _, r := range reps {
		v.Verified = v.Verified || r.Verify
	}
	var worst *Report
	for _, r := range reps {
		if r.Cache != "on" {
			continue
		}
		if r.HitTokens == 0 {
			v.ZeroHit++
			if loss := -r.ProjectedChange; loss > v.WorstLoss || v.WorstLossName == "" {
				v.WorstLoss, v.WorstLossName, worst = loss, r.Name, r
			}
			continue
		}
		h := HitResult{Name: r.Name, HitRate: r.HitRate, Projected: r.ProjectedChange, HasRef: r.RefReqPerSecOff > 0,
			RefAfter: r.RefChangeAfter, RefLo: r.RefChangeAfterLo, RefHi: r.RefChangeAfterHi, Verdict: "ok"}
		h.WithinGainTarget = !h.HasRef || math.Abs(h.Projected-h.RefAfter) <= TargetGainPoints
		switch {
		case v.Verified:
			h.Verdict = notJudged
		case h.WithinGainTarget:
		default:
			missed := fmt.Sprintf("%s: projected %s at %s hit, reference %s: more than %.0f points apart",
				r.Name, signedPct(h.Projected, 1), pct(h.HitRate, 1), signedPct(h.RefAfter, 1), 100*TargetGainPoints)
			h.Verdict = "OFF TARGET"
			if h.Projected > h.RefAfter {
				v.Missed = append(v.Missed, missed) // above the band: no load makes a projection higher
			} else if w := v.judge(r, TargetGainPoints, fmt.Sprintf("±%.0f points", 100*TargetGainPoints), missed); w != "" {
				h.Verdict = w
			}
		}
		v.Hits = append(v.Hits, h)
	}
	v.Missed = append(v.Missed, firstRequestMissed(reps)...) // New + Begin + Save: --verify adds nothing there
	switch {
	case v.Verified:
		v.lossVerdict = notJudged
	case v.ZeroHit > 0 && v.WorstLoss > TargetLoss:
		v.lossVerdict = "OVER TARGET"
		missed := fmt.Sprintf("%s: projected loss %s at 0%% hit, target <= %s",
			v.WorstLossName, pct(v.WorstLoss, 3), pct(TargetLoss, 1))
		if w := v.judge(worst, TargetLoss, fmt.Sprintf("%s loss", pct(TargetLoss, 1)), missed); w != "" {
			v.lossVerdict = w
		}
	}
	return v
}

// WriteTable prints one line per workload, at most TableWidth columns: the
// hit rate, the engine goroutine's cache time per step (mean and p99), the
// output goroutine's Materialize time per step, the mirror's resident
// bytes, the projected change and the spread of its runs beside the
// reference's change after its fix and its range, and a legend; then the
// projected latency (WriteLatencyTable) and the summary against the
// targets (WriteSummary). --wide (WriteWideTable) has the throughputs.
func WriteTable(w io.Writer, reps []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\thit\teng/step\teng p99\tout/step\tmirror\tprojected\tspread\tref after\tref range\t")
	runs, repeats := pairRuns(reps), 0
	for _, run := range runs {
		a := run.any()
		hit, eng, p99, out, mirror, proj := "-", "-", "-", "-", "-", "-"
		if r := run.on; r != nil {
			hit = pct(r.HitRate, 1)
			eng, p99 = dur(r.EngineNsPerStep), dur(float64(r.EngineNsP99))
			if r.MaterializeOn == "output" && r.Steps > 0 {
				out = dur(float64(r.MaterializeNsTotal) / float64(r.Steps))
			}
			mirror = shortBytes(r.MirrorResidentBytes)
			proj = signedPct(r.ProjectedChange, 2)
			repeats = max(repeats, r.Repeats)
		}
		_, _, after, rng := refCols(a)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", shortName(run.name), hit, eng, p99, out, mirror,
			proj, spreadCol(run.on), after, strings.ReplaceAll(rng, "%", ""))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeLegend(w, repeats)
	if err := WriteLatencyTable(w, reps); err != nil {
		return err
	}
	return WriteSummary(w, reps)
}

// WriteLatencyTable prints the projected latency per workload, cache off
// vs on, at most TableWidth columns: time to first token p50 and p99 (off,
// on, change), the change of end-to-end p50 and p99, and time to first
// packet p50 off and on ("-" without a downstream stage).
func WriteLatencyTable(w io.Writer, reps []*Report) error {
	runs := pairRuns(reps)
	any := false
	for _, run := range runs {
		any = any || run.any().TTFTP50 > 0
	}
	if !any {
		return nil
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "projected latency per request (step-cost model), cache off and on: time to first token (ttft),")
	fmt.Fprintln(w, "end to end (e2e), time to first packet (ttfp: the first step's rows at the next stage; - without one)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tttft p50\t\t\tttft p99\t\t\te2e\te2e\tttfp p50\t\t")
	fmt.Fprintln(tw, "workload\toff\ton\tchange\toff\ton\tchange\tp50\tp99\toff\ton\t")
	for _, run := range runs {
		get := func(r *Report, v func(*Report) int64) string {
			if r == nil || v(r) == 0 {
				return "-"
			}
			return latDur(v(r))
		}
		change := func(v func(*Report) int64) string {
			if run.off == nil || run.on == nil || v(run.off) == 0 || v(run.on) == 0 {
				return "-"
			}
			return shortChange(float64(v(run.on))/float64(v(run.off)) - 1)
		}
		p50 := func(r *Report) int64 { return r.TTFTP50 }
		p99 := func(r *Report) int64 { return r.TTFTP99 }
		e50 := func(r *Report) int64 { return r.E2EP50 }
		e99 := func(r *Report) int64 { return r.E2EP99 }
		f50 := func(r *Report) int64 { return r.TTFPP50 }
		cols := []string{get(run.off, p50), get(run.on, p50), change(p50), get(run.off, p99), get(run.on, p99), change(p99),
			change(e50), change(e99), get(run.off, f50), get(run.on, f50)}
		fmt.Fprintf(tw, "%s\t%s\t\n", shortName(run.name), strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

// latDur is a latency in at most 6 characters: three significant digits
// from a millisecond on.
func latDur(ns int64) string {
	f := float64(ns)
	switch {
	case f < 1e6:
		return fmt.Sprintf("%.0fµs", f/1e3)
	case f < 100e6:
		return fmt.Sprintf("%.1fms", f/1e6)
	case f < 1e9:
		return fmt.Sprintf("%.0fms", f/1e6)
	case f < 100e9:
		return fmt.Sprintf("%.2fs", f/1e9)
	case f < 10000e9:
		return fmt.Sprintf("%.0fs", f/1e9)
	}
	return ">9999s"
}

// shortChange is a change in at most 6 characters.
func shortChange(f float64) string {
	switch {
	case f == 0:
		return "0"
	case f >= 10:
		return ">+999%"
	case f >= 1:
		return fmt.Sprintf("%+.0f%%", 100*f)
	}
	return signedPct(f, 1)
}

// writeLegend says under the default table what its columns are (each
// line within TableWidth).
func writeLegend(w io.Writer, repeats int) {
	fmt.Fprintln(w, "eng/step, eng p99: the engine goroutine's time in Begin, Save and Discard per step (mean, p99); out/step:")
	fmt.Fprintln(w, "  the output goroutine's Materialize per step, which overlaps the next forward: only the part that outlasts")
	fmt.Fprintln(w, "  it is charged to projected, the throughput change the step-cost model projects with the cache on")
	if repeats > 1 {
		fmt.Fprintf(w, "  (the best of %d cache-on runs; spread: how many points apart the %d were); ref: vLLM-Omni's, after its fix\n",
			repeats, repeats)
	} else {
		fmt.Fprintln(w, "  (one cache-on run); ref: vLLM-Omni's change and range after its fix")
	}
}

// refCols are the reference columns of a report ("-" without a reference).
func refCols(r *Report) (refOff, fit, after, rng string) {
	if r.RefReqPerSecOff == 0 {
		return "-", "-", "-", "-"
	}
	// Reference changes to its own precision (0.1 points).
	return fmt.Sprintf("%.2f", r.RefReqPerSecOff), signedPct(r.FitError, 1), refPct(r.RefChangeAfter),
		refPct(r.RefChangeAfterLo) + ".." + refPct(r.RefChangeAfterHi)
}

// WriteWideTable prints one line per workload and mode with every column.
func WriteWideTable(w io.Writer, reps []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tcache\tsteps\tcomputed\thit\tref hit\tpreempt\teng p50\teng p99\teng mean\tstall\t"+
		"commit/step\tcommit share\trows\twritten\tmirror RSS\tfirst req\tmodel step\treq/s\toff req/s\tref req/s\t"+
		"fit err\tprojected\tref before\tref after\tref range\t")
	for _, r := range reps {
		refOff, fit, after, rng := refCols(r)
		before, refHit := "-", "-"
		if r.RefReqPerSecOff > 0 {
			before, refHit = refPct(r.RefChangeBefore), r.RefHit+"%"
		}
		common := fmt.Sprintf("%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t", dur(r.ModelStepNs), r.ModelReqPerSec,
			r.ModelReqPerSecOff, refOff, fit, signedPct(r.ProjectedChange, 3), before, after, rng)
		if r.Cache == "off" {
			fmt.Fprintf(tw, "%s\toff\t%d\t%d\t%s\t%s\t%d\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n",
				r.Name, r.Steps, r.ComputedTokens, pct(r.HitRate, 1), refHit, r.Preemptions, common)
			continue
		}
		fmt.Fprintf(tw, "%s\ton\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
			r.Name, r.Steps, r.ComputedTokens, pct(r.HitRate, 1), refHit, r.Preemptions,
			dur(float64(r.EngineNsP50)), dur(float64(r.EngineNsP99)), dur(r.EngineNsPerStep),
			dur(float64(r.StallNs)), dur(r.CommitterPerStep), pct(r.CommitterShare, 2),
			r.RowsWritten, bytesStr(r.BytesWritten), bytesStr(r.MirrorResidentBytes),
			dur(float64(r.FirstRequestNs)), common)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeWideLatency(w, reps); err != nil {
		return err
	}
	return WriteSummary(w, reps)
}

// writeWideLatency prints every projected latency percentile per
// workload and mode.
func writeWideLatency(w io.Writer, reps []*Report) error {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "projected latency per request (step-cost model):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tcache\tttft p50\tttft p90\tttft p99\te2e p50\te2e p90\te2e p99\tttfp p50\tttfp p90\tttfp p99\tfirst req ttft\t")
	for _, r := range reps {
		fmt.Fprintf(tw, "%s\t%s\t", r.Name, r.Cache)
		for _, v := range []int64{r.TTFTP50, r.TTFTP90, r.TTFTP99, r.E2EP50, r.E2EP90, r.E2EP99, r.TTFPP50, r.TTFPP90, r.TTFPP99,
			r.FirstRequestTTFTNs} {
			s := "-"
			if v > 0 {
				s = dur(float64(v))
			}
			fmt.Fprintf(tw, "%s\t", s)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// notJudged is the summary's verdict on a timing target under --verify (see
// Verdict.Verified).
const notJudged = "not judged under --verify"

// WriteSummary prints the verdict: the worst 0%-hit loss against the target,
// each hit workload's gain against the reference, the worst fit error of the
// runs, and the --verify results. Lines fit TableWidth columns but for
// verification failures.
func WriteSummary(w io.Writer, reps []*Report) error {
	v := Check(reps)
	fmt.Fprintln(w)
	if v.ZeroHit > 0 {
		fmt.Fprintf(w, "worst projected loss at 0%% hit: %s (%s), %d workloads; target <= %s: %s\n",
			pct(v.WorstLoss, 3), shortName(v.WorstLossName), v.ZeroHit, pct(TargetLoss, 1), v.lossVerdict)
	}
	for _, h := range v.Hits {
		if !h.HasRef {
			fmt.Fprintf(w, "gain %s (hit %s): %s, no reference\n", shortName(h.Name), pct(h.HitRate, 1), signedPct(h.Projected, 1))
			continue
		}
		fmt.Fprintf(w, "gain %s at %s hit: %s vs reference %s, %+.1f points; target ±%.0f: %s\n",
			shortName(h.Name), pct(h.HitRate, 1), signedPct(h.Projected, 1), signedPct(h.RefAfter, 1),
			100*(h.Projected-h.RefAfter), 100*TargetGainPoints, h.Verdict)
	}
	if len(v.Unjudged) > 0 {
		why := v.unsteady
		if v.Busy != "" {
			why = append([]string{v.Busy}, why...)
		}
		for _, b := range why {
			fmt.Fprintf(w, "machine busy: %s\n", b)
		}
		fmt.Fprintln(w, "  other processes only add to the cache's measured time: a target met is met, one missed is not judged")
	}
	for _, r := range reps {
		if r.Cache != "on" {
			continue
		}
		if hit, miss, n, m := HitVsMiss(r, reps); n > 0 {
			fmt.Fprintf(w, "hit steps %s: Begin+Save %s (%d) vs %s, %d %s steps of that size without a hit\n",
				shortName(r.Name), dur(hit), n, dur(miss), m, r.Model)
		}
	}
	worst, name := 0.0, ""
	for _, r := range reps {
		if r.RefReqPerSecOff > 0 && math.Abs(r.FitError) >= worst {
			worst, name = math.Abs(r.FitError), r.Name
		}
	}
	if name != "" {
		fmt.Fprintf(w, "worst fit error, model vs reference cache-off req/s at these prompt counts: %s (%s)\n",
			pct(worst, 1), shortName(name))
	}
	for _, r := range reps {
		if r.Verify {
			fmt.Fprintf(w, "verify %s: %d rows checked, %d wrong, %d repeated, %d missing\n", r.Name, r.VerifiedRows, r.VerifyFailures, r.VerifyRepeated, r.VerifyMissing)
			if r.Preemptions+r.Replaces+r.SpecDrafts > 0 {
				fmt.Fprintf(w, "  engine: %d preemptions, %d resumed with a hit, %d replaced, %d drafts, %d rejected\n",
					r.Preemptions, r.ResumedHits, r.Replaces, r.SpecDrafts, r.SpecRejected)
			}
			for _, f := range r.Failures {
				fmt.Fprintf(w, "  %s\n", f)
			}
		}
	}
	return nil
}

// WriteJSON writes one JSON object (one line) for the report.
func WriteJSON(w io.Writer, r *Report) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// maxNameCols bounds the workload column of the default table.
const maxNameCols = 26

// shortName cuts a name to maxNameCols, keeping its end (the distinctive
// part of a file name or workload).
func shortName(s string) string {
	r := []rune(s)
	if len(r) <= maxNameCols {
		return s
	}
	return "…" + string(r[len(r)-maxNameCols+1:])
}

// shortBytes is bytesStr without decimals (MiB and up).
func shortBytes(n int64) string {
	switch {
	case n < 1<<20:
		return bytesStr(n)
	case n < 1<<30:
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
}

func pct(f float64, prec int) string { return fmt.Sprintf("%.*f%%", prec, 100*f) }

// refPct is a reference change as the reference printed it: one decimal,
// signed, "-0.0%" included.
func refPct(f float64) string { return fmt.Sprintf("%+.1f%%", 100*f) }

func signedPct(f float64, prec int) string {
	if f == 0 {
		return "0"
	}
	return fmt.Sprintf("%+.*f%%", prec, 100*f)
}

func dur(ns float64) string {
	switch {
	case ns == 0:
		return "0"
	case ns < 1e3:
		return fmt.Sprintf("%.0fns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.1fµs", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.1fms", ns/1e6)
	}
	return fmt.Sprintf("%.2fs", ns/1e9)
}

func bytesStr(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%dB", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2fGiB", float64(n)/(1<<30))
}
