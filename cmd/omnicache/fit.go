package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/omnicache/omnicache/internal/replay"
)

const fitUsage = `usage: omnicache fit [flags]

Fits the step-cost model per model, t(step) = a + b·prefill_tokens +
c·Σ(chunk_len × context_len) + d·decode_seqs (non-negative, in ns), to the
reference's cache-off throughputs over the simulator's cache-off schedules of
the full-size reference workloads, and prints the parameters, the table's
` + "`cost`" + ` lines and, per workload, the model's and the reference's req/s.
The embedded table's cost lines are this command's output.

flags:
`

func fitMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, fitUsage)
		fs.PrintDefaults()
	}
	table := fs.String("table", "", "fit the workload table in FILE instead of the embedded reference table")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	ws, err := readTable(*table)
	if err != nil {
		fmt.Fprintf(stderr, "fit: %v\n", err)
		return 2
	}
	t := time.Now()
	fits, err := replay.Fit(ws, replay.Options{})
	if err != nil {
		fmt.Fprintf(stderr, "fit: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, replay.FormatFit(fits))
	fmt.Fprintf(stdout, "\nfitted in %.1fs (schedules of %d full-size workloads, cache off)\n", time.Since(t).Seconds(), len(ws))
	return 0
}

// readTable reads the workload table of FILE, or the embedded one.
func readTable(path string) ([]replay.Workload, error) {
	if path == "" {
		return replay.DefaultWorkloads(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ws, err := replay.ParseWorkloads(string(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("--table %s: no workloads (a line a workload: docs/replay.md)", path)
	}
	return ws, nil
}
