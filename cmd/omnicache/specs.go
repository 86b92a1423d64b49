// The replay's inputs and its terminal: the specs the flags select, the
// progress bar, the load average and flag parsing.

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/omnicache/omnicache/internal/replay"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// defaultTraceKVBlocks is a trace's KV pool: 65536 blocks (1M tokens at
// block size 16).
const defaultTraceKVBlocks = 65536

// buildSpecs turns the flags into the runs' specs: the (scaled, filtered)
// table, or the trace.
func buildSpecs(f *replayFlags) ([]replay.Spec, error) {
	if f.trace != "" {
		recs, err := replay.ReadTrace(f.trace, f.jsonParser, f.limit)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			return nil, fmt.Errorf("%s: no requests", f.trace)
		}
		kv := f.kvBlocks
		if kv == 0 {
			kv = defaultTraceKVBlocks
		}
		widths := f.widths
		if widths == "" {
			widths = "hidden=64"
		}
		keys, err := replay.ParseWidths(widths)
		if err != nil {
			return nil, fmt.Errorf("--widths: %w", err)
		}
		conc := f.concurrency
		if conc <= 0 {
			conc = 32
		}
		spec, err := replay.TraceSpec(filepath.Base(f.trace), recs, keys, conc,
			replay.TraceLimits{MaxModelLen: f.maxModelLen, KVBlocks: kv, BlockSize: f.blockSize})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.trace, err)
		}
		return []replay.Spec{spec}, nil
	}
	ws, err := readTable(f.table)
	if err != nil {
		return nil, err
	}
	var re *regexp.Regexp
	if f.workloads != "" {
		var err error
		if re, err = regexp.Compile(f.workloads); err != nil {
			return nil, fmt.Errorf("--workloads: %w", err)
		}
	}
	scale := f.scale
	if f.full {
		scale = 1
	}
	var specs []replay.Spec
	scaled := false
	for _, w := range ws {
		if re != nil && !re.MatchString(w.FullName()) {
			continue
		}
		scaled = scaled || w.Field == nil
		if f.widths != "" {
			keys, err := replay.ParseWidths(f.widths)
			if err != nil {
				return nil, fmt.Errorf("--widths: %w", err)
			}
			w.Keys = keys
		}
		if f.concurrency > 0 {
			w.Concurrency = f.concurrency
		}
		specs = append(specs, w.Scaled(scale).Spec(f.seed))
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("--workloads %q matches no workload of the table", f.workloads)
	}
	if f.scaleSet && !scaled {
		return nil, fmt.Errorf("--scale and --full scale the reference table's workloads; the field's workloads selected are generated at their own sizes")
	}
	return specs, nil
}

func newProgress(mode string, total int, stderr io.Writer) *progressbar.ProgressBar {
	on := false
	switch mode {
	case "on":
		on = true
	case "auto":
		if fd, ok := stderr.(interface{ Fd() uintptr }); ok {
			on = term.IsTerminal(int(fd.Fd()))
		}
	}
	if !on || total <= 0 {
		return nil
	}
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionShowIts(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionFullWidth(),
	)
}

// loadAverage is the 1-minute load average (Linux; -1 where the system has
// none), for the report and its verdict: timings on a busy machine are
// noisy. A variable: tests set the machine's load.
var loadAverage = systemLoadAverage

func systemLoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// loadString is a load average as the report prints it.
func loadString(v float64) string {
	if v < 0 {
		return "unknown"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// parseFlags parses a command's flags: ok is false when the command must
// exit with code (0 after -h, which prints fs.Usage; 2 for a bad flag or an
// argument, which print one line and where the flags are described, not
// the whole usage).
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	usage := fs.Usage
	fs.Usage = func() {} // the flag package prints the error line itself
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return 0, false
	}
	if err == nil && fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
	}
	if err != nil || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "run 'omnicache %s -h' for its flags\n", fs.Name())
		return 2, false
	}
	return 0, true
}
