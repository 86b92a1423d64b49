// The P/D replay's table.

package replay

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WritePDTable writes one line per P/D run, a line per pool, and what the
// run's targets say: the decode side's import p99 at most one projected
// decode step, the time to first packet through the tier below
// recomputing's.
func WritePDTable(w io.Writer, reps []*PDReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tp:d\ttier\treq\ttier rows\tpubl/req\timpt/req\tpub wait p50/p99\timport p50/p99\timport wait p50/p99\tdecode step\t"+
		"ttfp p50 tier/recomp\tttfp p99 tier/recomp\tdecode ttfp p50\tdecode ttfp p99\trecomputed\tverify\t")
	for _, r := range reps {
		fmt.Fprintf(tw, "%s\t%d:%d\t%s\t%d\t%d\t%s\t%s\t%s/%s\t%s/%s\t%s/%s\t%s\t%s/%s\t%s/%s\t%s/%s\t%s/%s\t%d\t%s\t\n", shortName(r.Name), r.Prefill, r.Decode,
			shortTier(r.Tier), r.Requests, r.TierRows, shortBytes(int64(r.PublishedBytesPerRequest)), shortBytes(int64(r.ImportedBytesPerRequest)),
			dur(float64(r.PublishWaitP50Ns)), dur(float64(r.PublishWaitP99Ns)), dur(float64(r.ImportP50Ns)), dur(float64(r.ImportP99Ns)),
			dur(float64(r.ImportWaitP50Ns)), dur(float64(r.ImportWaitP99Ns)), durOrDash(r.DecodeStepNs), dur(float64(r.TTFPP50Ns)), dur(float64(r.RecomputeTTFPP50Ns)),
			dur(float64(r.TTFPP99Ns)), dur(float64(r.RecomputeTTFPP99Ns)), dur(float64(r.DecodeTTFPP50Ns)), dur(float64(r.RecomputeDecodeTTFPP50Ns)),
			dur(float64(r.DecodeTTFPP99Ns)), dur(float64(r.RecomputeDecodeTTFPP99Ns)), r.Recomputed, pdVerifyCol(r))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, r := range reps {
		name := shortName(r.Name)
		fmt.Fprintf(&b, "%s: prefill: %d requests, %d steps, hit %s, eng/step %s; decode: %d arrivals (%d recomputed: %d publish, %d import, %d other failures), %d steps, eng/step %s, mat/step %s\n",
			name, r.PrefillPool.Requests, r.PrefillPool.Steps, pct(r.PrefillPool.HitRate, 1), dur(r.PrefillPool.EngineNsPerStep),
			r.DecodePool.Requests, r.Recomputed, r.PublishFailed, r.ImportFailed, r.OtherFailed, r.DecodePool.Steps,
			dur(r.DecodePool.EngineNsPerStep), dur(float64(r.DecodePool.MaterializeNs)/float64(max(1, r.DecodePool.Steps))))
		fmt.Fprintf(&b, "%s: in flight at most %s (%d requests of up to %s)", name, shortBytes(r.InFlightBytes),
			r.InFlightBytes/max(1, r.MaxRequestBytes), shortBytes(r.MaxRequestBytes))
		if r.TierBoundBytes > 0 {
			sized := "given"
			if r.TierAutoSized {
				sized = "sized by the run"
			}
			fmt.Fprintf(&b, "; tier: policy %s, holds %s of %s (%s), %d values evicted", r.TierPolicy,
				shortBytes(r.TierStoredBytes), shortBytes(r.TierBoundBytes), sized, r.TierEvicted)
			if r.ImportFailed > 0 && r.TierEvicted > 0 {
				fmt.Fprintf(&b, "; TIER TOO SMALL: %d requests recomputed, their values evicted before the import (give a larger --tier-mib)",
					r.ImportFailed)
			}
		}
		b.WriteString("\n")
		if r.DecodeStepNs > 0 {
			fmt.Fprintf(&b, "%s: step cost %s; import wait p99 %s one decode step (the import itself %s)\n", name, r.StepCost,
				pdVerdict(r.ImportWaitP99Ns <= r.DecodeStepNs, "within", "OVER"),
				pdVerdict(r.ImportP99Ns <= r.DecodeStepNs, "within it at p99", "over it at p99"))
		} else {
			fmt.Fprintf(&b, "%s: step cost %s; import wait p99 not judged: no pure-decode step to compare with\n", name, r.StepCost)
		}
		fmt.Fprintf(&b, "%s: through the tier, ttfp from the send %s recomputing's, from the handover %s\n", name,
			pdCompare(r.TTFPP50Ns, r.RecomputeTTFPP50Ns, r.TTFPP99Ns, r.RecomputeTTFPP99Ns),
			pdCompare(r.DecodeTTFPP50Ns, r.RecomputeDecodeTTFPP50Ns, r.DecodeTTFPP99Ns, r.RecomputeDecodeTTFPP99Ns))
		if r.Note != "" {
			fmt.Fprintf(&b, "%s: note: %s\n", name, r.Note)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// pdCompare says how a p50 and p99 compare with another's.
func pdCompare(p50, other50, p99, other99 int64) string {
	switch {
	case p50 < other50 && p99 < other99:
		return "below (p50, p99)"
	case p50 < other50:
		return "below at p50, NOT at p99"
	case p99 < other99:
		return "below at p99, NOT at p50"
	}
	return "NOT below"
}

func pdVerdict(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

func durOrDash(ns int64) string {
	if ns <= 0 {
		return "-"
	}
	return dur(float64(ns))
}

// pdVerifyCol is "-" without verification, "ok", or the wrong, repeated
// and missing rows.
func pdVerifyCol(r *PDReport) string {
	if !r.Verify {
		return "-"
	}
	p, d := r.PrefillPool, r.DecodePool
	if n := r.VerifyFailures(); n > 0 {
		return fmt.Sprintf("%d wrong (%d repeated, %d missing)", n, p.VerifyRepeated+d.VerifyRepeated, p.VerifyMissing+d.VerifyMissing)
	}
	return "ok"
}
