// The verdict on a busy machine. The replay's projection adds the cache's
// measured time to a modelled step, so other processes competing for the
// cores can only lower a projected figure (more cache time), never raise
// it: a target met on a busy machine is met, but one missed there may be
// the machine's doing rather than the cache's. A missed target is judged
// only when the machine was quiet enough for the figure: its load average
// at the start at most its CPUs, and the figure's runs (--repeat) within
// the target's tolerance of one another. Otherwise it is reported as not
// judged, with the reason.

package replay

import "fmt"

// notJudgedBusy is the summary's verdict on a target missed on a busy
// machine (see Verdict.Unjudged).
const notJudgedBusy = "not judged: busy"

// busyMachine says why the machine was too busy for a missed target to
// be judged (empty: it was not): its 1-minute load average when the replay
// started above its CPUs (other processes had a runnable thread for every
// core before the replay added its own).
func busyMachine(reps []*Report) string {
	for _, r := range reps {
		if r.CPUs > 0 && r.LoadAverage > float64(r.CPUs) {
			return fmt.Sprintf("load average %.2f at start on %d CPUs", r.LoadAverage, r.CPUs)
		}
	}
	return ""
}

// unsteady says why r's figure moved too much over its runs to be judged
// against a target of tolerance tol (a fraction; empty: it did not): its
// runs' projected changes further apart than tol.
func unsteady(r *Report, tol float64, target string) string {
	if d := r.ProjectedChangeMax - r.ProjectedChangeMin; r.Repeats > 1 && d > tol {
		return fmt.Sprintf("%s moved %.3g points over %d runs, more than the %s target allows",
			shortName(r.Name), 100*d, r.Repeats, target)
	}
	return ""
}

// judge files a missed target: not judged (Unjudged, with why) when the
// machine or the figure's runs say the machine was too busy for it, else
// Missed. It returns the summary's verdict.
func (v *Verdict) judge(r *Report, tol float64, target, missed string) string {
	why := v.Busy
	if why == "" {
		why = unsteady(r, tol, target)
	}
	if why == "" {
		v.Missed = append(v.Missed, missed)
		return ""
	}
	v.Unjudged = append(v.Unjudged, fmt.Sprintf("%s (%s)", missed, why))
	if why != v.Busy {
		v.unsteady = append(v.unsteady, why)
	}
	return notJudgedBusy
}

// spreadCol is the default table's spread of a report's runs: how many
// points apart their projected changes were ("-" for one run), to 0.01
// points below 10, 0.1 below 100, whole points above.
func spreadCol(r *Report) string {
	if r == nil || r.Repeats <= 1 {
		return "-"
	}
	d := 100 * (r.ProjectedChangeMax - r.ProjectedChangeMin)
	prec := 2
	switch {
	case d >= 100:
		prec = 0
	case d >= 10:
		prec = 1
	}
	return fmt.Sprintf("%.*f", prec, d)
}
