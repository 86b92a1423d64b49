package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/omnicache/omnicache/bench"
)

const replayUsage = `usage: omnicache replay [flags]

Replays workloads through the engine simulator (continuous batching, chunked
prefill, a KV block manager with prefix hashing and least-recently-freed
reuse, preemption), once with the cache off and once driving the real cache,
and prints per workload the engine goroutine's time in cache calls, the
committer's time, the hit rate, rows and bytes written, the mirror's resident
bytes, the time to the first request and the projected throughput change.

Default: the embedded reference table (DESIGN §6), prompts scaled by --scale
so the run takes a few minutes on 2 cores; --full runs it at full size.
--trace FILE replays a Mooncake-style JSONL trace instead.

flags:
`

type replayFlags struct {
	scale        float64
	full         bool
	workloads    string
	table        string
	cache        string
	verify       bool
	owned        bool
	maxBatched   int
	blockSize    int
	kvBlocks     int
	mirrorMiB    int64
	stagingDepth int
	decodeBuffer bool
	pace         bool
	stepTime     time.Duration
	seed         uint64
	trace        string
	limit        int
	widths       string
	concurrency  int
	jsonParser   string
	jsonOut      string
	plot         string
	cpuprofile   string
	memprofile   string
	metricsAddr  string
	progress     string
	repeat       int
}

func replayMain(args []string, stdout, stderr io.Writer) int {
	var f replayFlags
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, replayUsage)
		fs.PrintDefaults()
	}
	fs.Float64Var(&f.scale, "scale", 0.125, "scale the table's prompt counts (at least 2×concurrency prompts a workload)")
	fs.BoolVar(&f.full, "full", false, "run the whole table at full size (scale 1, 4 GiB mirror budget)")
	fs.StringVar(&f.workloads, "workloads", "", "regexp selecting table workloads by model/name (e.g. 'MiniCPM-o/DEC')")
	fs.StringVar(&f.table, "table", "", "read the workload table from FILE instead of the embedded reference table")
	fs.StringVar(&f.cache, "cache", "both", "cache modes to run: off, on or both")
	fs.BoolVar(&f.verify, "verify", false, "fill rows from the content oracle and check every materialized row and, after Sync, the mirror")
	fs.BoolVar(&f.owned, "owned", true, "hand the cache fresh Owned output buffers (false: reuse one engine buffer, not owned)")
	fs.IntVar(&f.maxBatched, "max-batched-tokens", bench.DefaultMaxBatchedTokens, "engine token budget per step (also the staging page capacity)")
	fs.IntVar(&f.blockSize, "block-size", bench.DefaultBlockSize, "KV block size in tokens")
	fs.IntVar(&f.kvBlocks, "kv-blocks", 0, "KV pool size in blocks (0: auto for the table, 65536 for a trace)")
	fs.Int64Var(&f.mirrorMiB, "mirror-budget-mib", 0, "cap of the automatic KV pool, as mirror MiB (default 1024, 4096 with --full)")
	fs.IntVar(&f.stagingDepth, "staging-depth", 0, "cache staging pages (0: the cache's default)")
	fs.BoolVar(&f.decodeBuffer, "decode-buffer", true, "let the cache park pure-decode steps")
	fs.BoolVar(&f.pace, "pace", true, "wait outside the timed calls for a free staging page (reported as stall)")
	fs.DurationVar(&f.stepTime, "step-time", 0, "model step time for the projection (default: from the reference throughput; 20ms for a trace)")
	fs.Uint64Var(&f.seed, "seed", 1, "prompt seed")
	fs.StringVar(&f.trace, "trace", "", "replay a Mooncake-style JSONL trace FILE instead of the table")
	fs.IntVar(&f.limit, "limit", 0, "replay only the first N trace requests (0: all)")
	fs.StringVar(&f.widths, "widths", "", "per-token keys name=bytes[:opt|:req|:deferred],... (default: the model's; hidden=64 for a trace)")
	fs.IntVar(&f.concurrency, "concurrency", 0, "requests in flight (default: the workload's; 32 for a trace)")
	fs.StringVar(&f.jsonParser, "json-parser", bench.ParserAuto, "trace parser: auto, simd (simdjson-go) or std (encoding/json)")
	fs.StringVar(&f.jsonOut, "json", "", "write one JSON object per workload and mode (JSON Lines) to FILE")
	fs.StringVar(&f.plot, "plot", "", "draw per-step cache time and hit rate to FILE.png")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile to FILE")
	fs.StringVar(&f.memprofile, "memprofile", "", "write a heap profile to FILE at the end")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics of the cache-on runs and /debug/pprof/ on HOST:PORT while the replay runs")
	fs.StringVar(&f.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, off")
	fs.IntVar(&f.repeat, "repeat", 1, "run each cache-on replay N times and keep the one with the least engine time (noisy machines)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "replay: unexpected arguments %q\n", fs.Args())
		return 2
	}
	code, err := runReplay(&f, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "replay: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func runReplay(f *replayFlags, stdout, stderr io.Writer) (int, error) {
	specs, err := buildSpecs(f)
	if err != nil {
		return 2, err
	}
	var modes []bool
	switch f.cache {
	case "off":
		modes = []bool{false}
	case "on":
		modes = []bool{true}
	case "both":
		modes = []bool{false, true}
	default:
		return 2, fmt.Errorf("--cache %q: want off, on or both", f.cache)
	}

	if f.cpuprofile != "" {
		pf, err := os.Create(f.cpuprofile)
		if err != nil {
			return 1, err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return 1, err
		}
		defer pprof.StopCPUProfile()
	}
	var ms *metricsServer
	if f.metricsAddr != "" {
		if ms, err = startMetrics(f.metricsAddr, stderr); err != nil {
			return 2, err
		}
		defer ms.close()
	}
	var jsonFile *os.File
	if f.jsonOut != "" {
		if jsonFile, err = os.Create(f.jsonOut); err != nil {
			return 1, err
		}
		defer jsonFile.Close()
	}

	opt := bench.Options{
		Verify:              f.verify,
		NotOwned:            !f.owned,
		MaxBatchedTokens:    f.maxBatched,
		BlockSize:           f.blockSize,
		KVBlocks:            f.kvBlocks,
		StagingDepth:        f.stagingDepth,
		DisableDecodeBuffer: !f.decodeBuffer,
		Pace:                f.pace,
		StepTime:            f.stepTime,
		ForceStepTime:       f.stepTime > 0,
		KeepSamples:         f.plot != "",
	}
	switch {
	case f.mirrorMiB > 0:
		opt.MirrorBudget = f.mirrorMiB << 20
	case f.full:
		opt.MirrorBudget = 4 << 30
	}

	repeat := max(f.repeat, 1)
	total := 0
	for _, s := range specs {
		for _, on := range modes {
			if on {
				total += s.Prompts * repeat
			} else {
				total += s.Prompts
			}
		}
	}
	load := loadAverage()
	bar := newProgress(f.progress, total, stderr)

	var reps []*bench.Report
	failed := 0
	verifyFailed := false
	for _, spec := range specs {
		for _, on := range modes {
			o := opt
			o.Cache = on
			if ms != nil && on {
				ms.attach(&o, spec.Name)
			}
			mode := "off"
			if on {
				mode = "on"
			}
			if bar != nil {
				bar.Describe(fmt.Sprintf("%-26s cache %-3s", spec.Name, mode))
				o.Progress = func(n int) { bar.Add(n) }
			}
			rep, err := bench.Replay(spec, o)
			for i := 1; on && i < repeat && err == nil; i++ {
				var again *bench.Report
				if again, err = bench.Replay(spec, o); err == nil && again.EngineNsTotal < rep.EngineNsTotal {
					rep = again
				} else if err != nil {
					rep = again
				}
			}
			if err != nil {
				failed++
				if errors.Is(err, bench.ErrVerify) {
					verifyFailed = true
				}
				if bar != nil {
					bar.Clear()
				}
				fmt.Fprintf(stderr, "replay: %v\n", err)
			}
			if rep != nil && (err == nil || errors.Is(err, bench.ErrVerify)) {
				reps = append(reps, rep)
				if jsonFile != nil {
					if err := bench.WriteJSON(jsonFile, rep); err != nil {
						return 1, err
					}
				}
			}
			if bar == nil {
				fmt.Fprintf(stderr, "replay: %s cache %s: %s\n", spec.Name, mode, doneLine(rep, err))
			}
		}
	}
	if bar != nil {
		bar.Finish()
		fmt.Fprintln(stderr)
	}
	if err := bench.WriteTable(stdout, reps); err != nil {
		return 1, err
	}
	fmt.Fprintf(stdout, "machine: %d CPUs, GOMAXPROCS %d, load average %s at start; cache-on runs: best of %d\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), load, repeat)
	if f.plot != "" && len(reps) > 0 {
		if err := bench.WritePlot(f.plot, reps); err != nil {
			fmt.Fprintf(stderr, "replay: plot: %v\n", err)
			failed++
		}
	}
	if f.memprofile != "" {
		mf, err := os.Create(f.memprofile)
		if err != nil {
			return 1, err
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(mf); err != nil {
			mf.Close()
			return 1, err
		}
		mf.Close()
	}
	switch {
	case verifyFailed:
		return 1, fmt.Errorf("verification failed")
	case failed > 0:
		return 1, fmt.Errorf("%d runs failed", failed)
	}
	return 0, nil
}

func doneLine(rep *bench.Report, err error) string {
	switch {
	case rep == nil:
		return "failed"
	case err != nil:
		return fmt.Sprintf("%d steps, FAILED verification", rep.Steps)
	}
	return fmt.Sprintf("%d steps in %.2fs", rep.Steps, float64(rep.WallNs)/1e9)
}

// buildSpecs turns the flags into the runs' specs: the (scaled, filtered)
// table, or the trace.
func buildSpecs(f *replayFlags) ([]bench.Spec, error) {
	if f.trace != "" {
		recs, err := bench.ReadTrace(f.trace, f.jsonParser, f.limit)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			return nil, fmt.Errorf("%s: no requests", f.trace)
		}
		widths := f.widths
		if widths == "" {
			widths = "hidden=64"
		}
		keys, err := bench.ParseWidths(widths)
		if err != nil {
			return nil, fmt.Errorf("--widths: %w", err)
		}
		conc := f.concurrency
		if conc <= 0 {
			conc = 32
		}
		spec := bench.TraceSpec("trace:"+filepath.Base(f.trace), recs, keys, conc)
		if f.kvBlocks <= 0 {
			spec.KVBlocks = 65536
		}
		if f.stepTime <= 0 {
			f.stepTime = bench.DefaultStepTime
		}
		return []bench.Spec{spec}, nil
	}
	var ws []bench.Workload
	if f.table != "" {
		data, err := os.ReadFile(f.table)
		if err != nil {
			return nil, err
		}
		if ws, err = bench.ParseWorkloads(string(data)); err != nil {
			return nil, fmt.Errorf("%s: %w", f.table, err)
		}
	} else {
		ws = bench.DefaultWorkloads()
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
	if scale <= 0 {
		return nil, fmt.Errorf("--scale %v: want > 0", scale)
	}
	var specs []bench.Spec
	for _, w := range ws {
		if re != nil && !re.MatchString(w.FullName()) {
			continue
		}
		if f.widths != "" {
			keys, err := bench.ParseWidths(f.widths)
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
		return nil, fmt.Errorf("no workload matches %q", f.workloads)
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

// loadAverage is the 1-minute load average (Linux), for the report: timings
// on a busy machine are noisy.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}
