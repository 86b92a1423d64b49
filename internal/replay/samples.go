package replay

import (
	"bufio"
	"fmt"
	"io"
)

// WriteSamples writes every report's per-step samples (Options.KeepSamples)
// as CSV, one row per step: which run, the step's shape and the engine
// goroutine's time in each call (ns), the waits outside the timed calls and
// the forward's hold. Step 0 is the first step (with New's start-up apart:
// Report.FirstRequestNs).
func WriteSamples(w io.Writer, reps []*Report) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "workload,cache,device,step,tokens,queried,hit,pure,engine_ns,begin_ns,save_ns,consume_ns,stall_ns,output_wait_ns,hold_ns")
	for _, r := range reps {
		for i, s := range r.Samples {
			pure := 0
			if s.Pure {
				pure = 1
			}
			fmt.Fprintf(bw, "%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d\n", r.Name, r.Cache, r.Device, i,
				s.Tokens, s.Queried, s.Hit, pure, s.EngineNs, s.BeginNs, s.SaveNs, s.ConsumeNs, s.StallNs, s.OutputWaitNs, s.HoldNs)
		}
	}
	return bw.Flush()
}
