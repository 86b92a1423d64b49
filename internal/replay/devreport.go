package replay

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// TargetFirstRequestNs bounds first_request_ns of a run whose outputs live
// in device memory (a GPU run): New and the first step's Begin and Save,
// the first staging page's pinned allocation included.
const TargetFirstRequestNs = 50e6

// firstRequestMissed names the device runs over TargetFirstRequestNs.
func firstRequestMissed(reps []*Report) []string {
	var out []string
	for _, r := range reps {
		if r.Cache == "on" && r.Outputs == "device" && float64(r.FirstRequestNs) > TargetFirstRequestNs {
			out = append(out, fmt.Sprintf("%s: first request %s (pinned staging included), target <= %s",
				r.Name, dur(float64(r.FirstRequestNs)), dur(TargetFirstRequestNs)))
		}
	}
	return out
}

// WriteDeviceTable prints, per cache-on run, what went through the device:
// the device and where the outputs lived, the device→host bytes, the time
// waited for device events (staging wait: total, and per wait), the host
// staging memory allocated (pinned on CUDA), the device output buffers,
// the time the forward was held and the first request's time; then the
// first request's worst time against TargetFirstRequestNs.
func WriteDeviceTable(w io.Writer, reps []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tdevice\toutputs\td→h\tstaging wait\twait/event\tpinned\tout bufs\tforward held\tfirst req\t")
	var worst *Report
	for _, r := range reps {
		if r.Cache != "on" {
			continue
		}
		per := "-"
		if r.StagingWaits > 0 {
			per = dur(float64(r.StagingWaitNs) / float64(r.StagingWaits))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", shortName(r.Name), r.Device, r.Outputs,
			bytesStr(r.DtoHBytes), dur(float64(r.StagingWaitNs)), per, bytesStr(r.PinnedBytes), r.OutputBuffers,
			dur(float64(r.ForwardHoldNs)), dur(float64(r.FirstRequestNs)))
		if r.Outputs == "device" && (worst == nil || r.FirstRequestNs > worst.FirstRequestNs) {
			worst = r
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if worst != nil {
		verdict := "ok"
		if float64(worst.FirstRequestNs) > TargetFirstRequestNs {
			verdict = "OVER TARGET"
		}
		fmt.Fprintf(w, "\nworst first request (New + first Begin + Save, pinned staging page included): %s (%s); target <= %s: %s\n",
			dur(float64(worst.FirstRequestNs)), shortName(worst.Name), dur(TargetFirstRequestNs), verdict)
	}
	return nil
}
