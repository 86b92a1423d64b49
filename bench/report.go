package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// TargetLoss is the projected throughput loss allowed at a 0% hit rate
// (DESIGN §7).
const TargetLoss = 0.001

// WriteTable prints the reports as a table, one line per workload and mode,
// and a summary against the 0%-hit target.
func WriteTable(w io.Writer, reps []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tcache\tsteps\ttokens\thit\tpreempt\teng p50\teng p99\teng mean\tstall\tcommit/step\tcommit share\trows\twritten\tmirror RSS\tfirst req\tthroughput\t")
	for _, r := range reps {
		if r.Cache == "off" {
			fmt.Fprintf(tw, "%s\toff\t%d\t%d\t%s\t%d\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t\n",
				r.Name, r.Steps, r.Tokens, pct(r.HitRate, 1), r.Preemptions, signedPct(r.ProjectedChange))
			continue
		}
		fmt.Fprintf(tw, "%s\ton\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t\n",
			r.Name, r.Steps, r.Tokens, pct(r.HitRate, 1), r.Preemptions,
			dur(float64(r.EngineNsP50)), dur(float64(r.EngineNsP99)), dur(r.EngineNsPerStep),
			dur(float64(r.StallNs)), dur(r.CommitterPerStep), pct(r.CommitterShare, 2),
			r.RowsWritten, bytesStr(r.BytesWritten), bytesStr(r.MirrorResidentBytes),
			dur(float64(r.FirstRequestNs)), signedPct(r.ProjectedChange))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	worst, name, n := 0.0, "", 0
	var failures int64
	for _, r := range reps {
		failures += r.VerifyFailures
		if r.Cache == "on" && r.HitTokens == 0 {
			n++
			if -r.ProjectedChange > worst || name == "" {
				worst, name = -r.ProjectedChange, r.Name
			}
		}
	}
	if n > 0 {
		verdict := "ok"
		if worst > TargetLoss {
			verdict = "OVER TARGET"
		}
		fmt.Fprintf(w, "\nworst projected loss at 0%% hit: %s (%s) over %d workloads; target <= %s: %s\n",
			pct(worst, 3), name, n, pct(TargetLoss, 1), verdict)
	}
	for _, r := range reps {
		if r.Verify {
			fmt.Fprintf(w, "verify %s: %d rows checked, %d wrong\n", r.Name, r.VerifiedRows, r.VerifyFailures)
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

func pct(f float64, prec int) string { return fmt.Sprintf("%.*f%%", prec, 100*f) }

func signedPct(f float64) string {
	if f == 0 {
		return "0"
	}
	return fmt.Sprintf("%+.3f%%", 100*f)
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
