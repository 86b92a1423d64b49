package replay

// The reports' pairing and number formats for a renderer outside the
// package: cmd/internal/plot draws the replay's figures with them, so a
// figure's labels read as the table's.

// Pair is one workload's cache-off and cache-on reports (either nil when
// that run was not made).
type Pair struct {
	Name    string
	Off, On *Report
}

// Pairs pairs reps by workload, in the order the workloads first ran.
func Pairs(reps []*Report) []Pair {
	runs := pairRuns(reps)
	out := make([]Pair, len(runs))
	for i, w := range runs {
		out[i] = Pair{Name: w.name, Off: w.off, On: w.on}
	}
	return out
}

// Pct is a fraction as a percentage with prec decimals: "12.5%".
func Pct(f float64, prec int) string { return pct(f, prec) }

// SignedPct is a change as a signed percentage with prec decimals, "0"
// for none: "+12.50%".
func SignedPct(f float64, prec int) string { return signedPct(f, prec) }

// RefPct is a reference's change as the reference printed it: one
// decimal, signed, "-0.0%" included.
func RefPct(f float64) string { return refPct(f) }

// ShortName is a workload name cut to the table's name column, its end
// kept.
func ShortName(s string) string { return shortName(s) }
