package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	rtrace "runtime/trace"
	"slices"
	"strings"
	"time"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/cmd/internal/figures"
	"github.com/omnicache/omnicache/internal/replay"
)

const replayUsage = `usage: omnicache replay [flags]

Replays workloads through the engine simulator (continuous batching, chunked
prefill, a KV block manager with prefix hashing and least-recently-freed
reuse, preemption), once with the cache off (and the engine's prefix caching
off, as the reference measured it) and once driving the real cache, and
prints per workload the hit rate, the engine goroutine's time in cache calls,
the mirror's resident bytes, the model's cache-off throughput against the
reference's, and the projected throughput change beside the reference's
(--wide: every column, per mode), then the projected latency per request,
cache off vs on: time to first token and end to end (p50, p99; --wide and
--json add p90) and, for a workload with a downstream stage, time to first
packet. The projection prices every step with the step-cost model fitted to
the reference (omnicache fit); latency is measured on that projected clock.

Default: the embedded reference table, prompts scaled by --scale, and the
field's workloads (field/multi_turn, field/long_doc_qa,
field/prefix_repetition, field/tts, field/preempt_resume, field/replace,
field/spec_decode: generated at their own sizes), in under
a minute on 2 cores; --full runs the reference table at full size. --trace
FILE replays a Mooncake-style JSONL trace instead. --device cuda[:N] (a binary
built with the cuda tag: make gpu-replay) stages through the GPU, with the
forward's outputs in device memory and each forward held for the model step
time (--hold) while the cache's copies run.

The table's legend says what each column is. A target missed while the
machine was busy (its load average above its CPUs at the start, or the
figure's runs further apart than the target allows) is reported as not
judged rather than missed: other processes only add to the cache's time.

Exit status: 0; 1 when a run fails, --verify finds a wrong row, or --check
finds a missed target or one it could not judge; 2 for bad flags or input.

flags:
`

type replayFlags struct {
	scale         float64
	full          bool
	workloads     string
	table         string
	cache         string
	verify        bool
	owned         bool
	maxBatched    int
	blockSize     int
	kvBlocks      int
	mirrorMiB     int64
	stagingDepth  int
	allocStaging  string
	holdWait      string
	decodeBuffer  bool
	mirrorDirect  bool
	pace          bool
	stepTime      time.Duration
	seed          uint64
	trace         string
	limit         int
	widths        string
	concurrency   int
	jsonParser    string
	jsonOut       string
	plot          string
	samples       string
	cpuprofile    string
	execTrace     string
	memprofile    string
	metricsAddr   string
	progress      string
	repeat        int
	warmup        int
	wide          bool
	check         bool
	materializeOn string
	maxModelLen   int
	device        string
	hold          string
	replicas      int           // replicas.go
	tier          string        // replicas.go
	tierMiB       int           // replicas.go
	tierRecent    time.Duration // replicas.go
	tierPolicy    string        // replicas.go
	tierAdmit     int           // replicas.go
	pacePark      bool          // replicas.go
	route         string        // replicas.go
	sharedKV      int           // replicas.go
	waitPublish   bool          // replicas.go
	pd            string        // pd.go
	pdPrefill     int           // pd.go: parsed from pd
	pdDecode      int           // pd.go

	realScale bool
	busy      int

	// Parsed by checkFlags.
	scaleSet bool // --scale or --full given
	dev      deviceSpec
	holdFor  holdSpec
}

// newCache creates the cache of the cache-on runs (nil: bench's default,
// the real cache on the host device); tests plug in others.
var newCache func(omnicache.Config) (replay.Cache, error)

func replayMain(args []string, stdout, stderr io.Writer) int {
	var f replayFlags
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, replayUsage)
		fs.PrintDefaults()
	}
	fs.Float64Var(&f.scale, "scale", 0.125, "scale the table's prompt counts (at least 2×concurrency prompts a workload)")
	fs.BoolVar(&f.full, "full", false, "run the whole table at full size (scale 1)")
	fs.StringVar(&f.workloads, "workloads", "", "regexp selecting table workloads by model/name (e.g. 'MiniCPM-o/DEC'; the field's workloads are field/NAME: field/multi_turn, field/long_doc_qa, field/prefix_repetition, field/tts, field/preempt_resume, field/replace, field/spec_decode)")
	fs.StringVar(&f.table, "table", "", "read the workload table from FILE instead of the embedded reference table")
	fs.StringVar(&f.cache, "cache", "both", "cache modes to run: off, on or both")
	fs.BoolVar(&f.verify, "verify", false, "fill rows from the content oracle and check every materialized row and, after Sync, the mirror")
	fs.BoolVar(&f.owned, "owned", true, "hand the cache fresh Owned output buffers (false: reuse one engine buffer, not owned)")
	fs.IntVar(&f.maxBatched, "max-batched-tokens", replay.DefaultMaxBatchedTokens, "engine token budget per step (also the staging page capacity)")
	fs.IntVar(&f.blockSize, "block-size", replay.DefaultBlockSize, "KV block size in tokens")
	fs.IntVar(&f.kvBlocks, "kv-blocks", 0, "KV pool size in blocks (0: auto for the table, 65536 for a trace); with --replicas the pool of all replicas, split evenly (0 for the table: each replica a whole engine)")
	fs.Int64Var(&f.mirrorMiB, "mirror-budget-mib", 0, "cap of the automatic KV pool, as mirror MiB (0: 1024)")
	fs.IntVar(&f.stagingDepth, "staging-depth", 0, "cache staging pages (0: the cache's default)")
	fs.StringVar(&f.holdWait, "hold-wait", "spin", "how the engine goroutine waits out a held forward: spin (as an engine thread synchronizing with its device does under CUDA's default scheduling, cudaDeviceScheduleAuto, with fewer contexts than CPUs: it keeps its core and its caches) or sleep (then spin the last 100µs; as under cudaDeviceScheduleBlockingSync)")
	fs.StringVar(&f.allocStaging, "alloc-staging", "auto", "when the cache allocates its staging pages: ahead (the first in New, the others in the background from New on, Config.AllocStagingAhead), new (all in New, Config.AllocStagingAtNew), first-use, or auto (ahead with cuda, first-use on the host)")
	fs.BoolVar(&f.decodeBuffer, "decode-buffer", true, "let the cache park pure-decode steps")
	fs.BoolVar(&f.mirrorDirect, "mirror-direct", false, "copy steps' device rows straight into the mirror (Config.MirrorDirect; with --device cuda)")
	fs.BoolVar(&f.pace, "pace", true, "wait outside the timed calls for a free staging page (reported as stall)")
	fs.DurationVar(&f.stepTime, "step-time", 0, "price every step at this constant model step time instead of the fitted step cost (default for a trace: 20ms)")
	fs.Uint64Var(&f.seed, "seed", 0, "prompt seed (0: each workload's dataset seed)")
	fs.StringVar(&f.trace, "trace", "", "replay a Mooncake-style JSONL trace FILE instead of the table")
	fs.IntVar(&f.limit, "limit", 0, "replay only the first N trace requests (0: all)")
	fs.IntVar(&f.maxModelLen, "max-model-len", replay.DefaultTraceMaxModelLen, "a trace request's prompt + output tokens must fit this model length")
	fs.StringVar(&f.widths, "widths", "", "per-token keys name=bytes[:opt|:req|:deferred],... (default: the model's; hidden=64 for a trace)")
	fs.IntVar(&f.concurrency, "concurrency", 0, "requests in flight (default: the workload's; 32 for a trace)")
	fs.StringVar(&f.jsonParser, "json-parser", replay.ParserAuto, "trace parser: auto, simd (simdjson-go) or std (encoding/json)")
	fs.StringVar(&f.jsonOut, "json", "", "write one JSON object per workload and mode (JSON Lines) to FILE")
	fs.StringVar(&f.plot, "plot", "", "draw the projected change per workload beside the reference's to FILE.png, the projected time-to-first-token distributions off vs on to FILE-ttft.png, and per-step cache time and hit rate to FILE-steps.png")
	fs.StringVar(&f.samples, "samples", "", "write every run's per-step engine times (Begin, Save, consume, waits, hold; ns) as CSV to FILE")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile to FILE")
	fs.StringVar(&f.execTrace, "exec-trace", "", "write a Go execution trace to FILE (go tool trace; the engine's Begin, Save and consume calls are regions)")
	fs.StringVar(&f.memprofile, "memprofile", "", "write a heap profile to FILE at the end")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics of the cache-on runs and /debug/pprof/ on HOST:PORT while the replay runs")
	fs.StringVar(&f.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, off")
	fs.IntVar(&f.repeat, "repeat", 3, "run each cache-on replay N times and keep the one with the least cache cost (the highest projected throughput): other processes on a shared machine only add time")
	fs.IntVar(&f.warmup, "warmup", 1, "untimed cache-on runs of each workload before the --repeat ones (none under --verify): the first run of a workload's size faults in memory the process never touched, a start-up cost a running server does not pay per step")
	fs.BoolVar(&f.wide, "wide", false, "print every column, one line per workload and mode (wider than 120 columns)")
	fs.BoolVar(&f.check, "check", false, "exit 1 when a target is missed (0%-hit loss, hit gain against the reference)")
	fs.StringVar(&f.materializeOn, "materialize-on", "output", "where Materialize runs: output (a goroutine overlapping the next forward) or engine (timed as engine time)")
	fs.StringVar(&f.device, "device", "host", "device the cache stages through: host, or cuda[:ordinal] (the forward's outputs then live in device memory; needs a cuda build: make gpu-replay)")
	fs.StringVar(&f.hold, "hold", "auto", "hold the engine goroutine in each forward for the model step time while the device's copies run: off, model, or a cap such as 5ms (auto: "+defaultCUDAHoldMax.String()+" with cuda, off on the host)")
	fs.BoolVar(&f.realScale, "real-scale", false, fmt.Sprintf("run at the scale upstream measured: a KV pool of %d blocks of %d tokens, a 4 KiB hidden row and two 4 KiB layer keys (%s; %.2f GiB of mirror a key, allocated lazily), and print start-up and memory: New, the first request, RSS", realScaleBlocks, realScaleBlockSize, realScaleWidths, float64(realScaleBlocks*realScaleBlockSize*4096)/(1<<30)))
	fs.IntVar(&f.busy, "busy", 0, "keep N cores busy beside the engine (N child processes spinning) for the whole replay, as a colocated stage sharing the machine: what it costs the cache-on runs' measured cache time, and so their projection")
	replicaFlags(fs, &f)
	pdFlags(fs, &f)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if err := checkFlags(&f, set); err != nil {
		fmt.Fprintf(stderr, "replay: %v\n", err)
		return 2
	}
	if f.dev.cuda && !cudaCompiled {
		fmt.Fprintf(stderr, "replay: --device %s: %v\n", f.device, errNoCUDA)
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

// Flag ranges: values a run can use; anything else is an error (exit 2)
// rather than a silent default, a hang or an allocation that cannot succeed.
const (
	maxConcurrency  = 4096
	maxBlockSize    = 4096
	maxKVBlocks     = 1 << 26
	maxBatched      = 1 << 20
	maxStagingDepth = 1024
	maxRepeat       = 1000
	maxMirrorMiB    = 1 << 20 // 1 TiB
	maxStepTime     = time.Hour
	maxModelLen     = 1 << 24
)

// --real-scale: what upstream measured at 0.92 GiB of pinned mirror a key.
const (
	realScaleBlocks    = 15092
	realScaleBlockSize = 16
	realScaleWidths    = "hidden=4096,layer_a=4096:opt,layer_b=4096:opt"
)

// checkFlags checks every flag's range; set names the flags given.
func checkFlags(f *replayFlags, set map[string]bool) error {
	intIn := func(name string, v, lo, hi int) error {
		if v < lo || v > hi {
			return fmt.Errorf("--%s %d: want %d..%d", name, v, lo, hi)
		}
		return nil
	}
	concLo := 0 // 0: the workload's
	if set["concurrency"] {
		concLo = 1
	}
	for _, err := range []error{
		intIn("limit", f.limit, 0, math.MaxInt32),
		intIn("kv-blocks", f.kvBlocks, 0, maxKVBlocks),
		intIn("block-size", f.blockSize, 1, maxBlockSize),
		intIn("concurrency", f.concurrency, concLo, maxConcurrency),
		intIn("max-batched-tokens", f.maxBatched, 1, maxBatched),
		intIn("staging-depth", f.stagingDepth, 0, maxStagingDepth),
		intIn("repeat", f.repeat, 1, maxRepeat),
		intIn("warmup", f.warmup, 0, maxRepeat),
		intIn("max-model-len", f.maxModelLen, 1, maxModelLen),
		intIn("busy", f.busy, 0, maxBusy),
	} {
		if err != nil {
			return err
		}
	}
	if f.mirrorMiB < 0 || f.mirrorMiB > maxMirrorMiB {
		return fmt.Errorf("--mirror-budget-mib %d: want 0..%d", f.mirrorMiB, maxMirrorMiB)
	}
	if f.stepTime < 0 || f.stepTime > maxStepTime {
		return fmt.Errorf("--step-time %v: want 0..%v", f.stepTime, maxStepTime)
	}
	if !(f.scale > 0 && f.scale <= 1) {
		return fmt.Errorf("--scale %v: want 0 < scale <= 1", f.scale)
	}
	for _, e := range []struct {
		name, v string
		ok      []string
	}{
		{"cache", f.cache, []string{"off", "on", "both"}},
		{"progress", f.progress, []string{"auto", "on", "off"}},
		{"materialize-on", f.materializeOn, []string{"output", "engine"}},
		{"alloc-staging", f.allocStaging, []string{"auto", "ahead", "new", "first-use"}},
		{"hold-wait", f.holdWait, []string{"sleep", "spin"}},
		{"json-parser", f.jsonParser, []string{replay.ParserAuto, replay.ParserSIMD, replay.ParserStd}},
	} {
		if !slices.Contains(e.ok, e.v) {
			return fmt.Errorf("--%s %q: want %s", e.name, e.v, strings.Join(e.ok, ", "))
		}
	}
	var err error
	if f.dev, err = parseDevice(f.device); err != nil {
		return err
	}
	if f.holdFor, err = parseHold(f.hold, f.dev); err != nil {
		return err
	}
	f.holdFor.spin = f.holdWait == "spin"
	if err := checkReplicaFlags(f, set); err != nil {
		return err
	}
	if f.trace == "" {
		for _, name := range []string{"limit", "max-model-len", "json-parser"} {
			if set[name] {
				return fmt.Errorf("--%s applies to --trace only", name)
			}
		}
	} else {
		for _, name := range []string{"scale", "full", "workloads", "table", "seed"} {
			if set[name] {
				return fmt.Errorf("--%s applies to the workload table, not to --trace", name)
			}
		}
	}
	if f.realScale {
		for _, name := range []string{"kv-blocks", "block-size", "widths", "mirror-budget-mib", "replicas", "pd"} {
			if set[name] {
				return fmt.Errorf("--real-scale sets the KV pool and keys: not with --%s", name)
			}
		}
		f.kvBlocks, f.blockSize, f.widths = realScaleBlocks, realScaleBlockSize, realScaleWidths
	}
	if f.busy > 0 && (f.replicas > 0 || f.pd != "") {
		return fmt.Errorf("--busy applies to one engine's replay: not with --replicas or --pd")
	}
	f.scaleSet = set["scale"] || set["full"]
	if set["full"] && set["scale"] {
		return fmt.Errorf("--full runs the table at scale 1: not with --scale")
	}
	if f.verify && f.cache == "off" {
		return fmt.Errorf("--verify checks the cache's rows: not with --cache off")
	}
	return nil
}

// writeMemProfile writes a heap profile, after a GC, to path.
func writeMemProfile(path string) error {
	mf, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(mf); err != nil {
		mf.Close()
		return err
	}
	return mf.Close()
}

func runReplay(f *replayFlags, stdout, stderr io.Writer) (int, error) {
	specs, err := buildSpecs(f)
	if err != nil {
		return 2, err
	}
	modes := map[string][]bool{"off": {false}, "on": {true}, "both": {false, true}}[f.cache]

	for _, o := range []struct {
		path  string
		start func(io.Writer) error
		stop  func()
	}{
		{f.cpuprofile, pprof.StartCPUProfile, pprof.StopCPUProfile},
		{f.execTrace, rtrace.Start, rtrace.Stop},
	} {
		if o.path == "" {
			continue
		}
		out, err := os.Create(o.path)
		if err != nil {
			return 1, err
		}
		defer out.Close()
		if err := o.start(out); err != nil {
			return 1, err
		}
		defer o.stop() // before the file's Close (deferred first)
	}
	if f.replicas > 0 || f.pd != "" {
		run := runReplicas
		if f.pd != "" {
			run = runPD
		}
		code, err := run(f, specs, stdout, stderr)
		if f.memprofile != "" {
			if merr := writeMemProfile(f.memprofile); merr != nil && err == nil {
				return 1, merr
			}
		}
		return code, err
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

	opt := replay.Options{
		Verify:              f.verify,
		NotOwned:            !f.owned,
		MaxBatchedTokens:    f.maxBatched,
		BlockSize:           f.blockSize,
		KVBlocks:            f.kvBlocks,
		StagingDepth:        f.stagingDepth,
		DisableDecodeBuffer: !f.decodeBuffer,
		MirrorDirect:        f.mirrorDirect,
		Pace:                f.pace,
		StepTime:            f.stepTime,
		ForceStepTime:       f.stepTime > 0,
		KeepSamples:         f.plot != "" || f.samples != "",
		MaterializeOnEngine: f.materializeOn == "engine",
		NewCache:            newCache,
		MirrorBudget:        f.mirrorMiB << 20,
		Busy:                f.busy,
		ReleaseMemory:       f.realScale, // its RSS figures are each run's own
	}

	dev, err := openDevice(f.dev, f.holdFor, &opt)
	if err != nil {
		return 1, err
	}
	opt.AllocStagingAtNew = f.allocStaging == "new"
	opt.AllocStagingAhead = f.allocStaging == "ahead" || f.allocStaging == "auto" && f.dev.cuda
	if dev != nil {
		defer dev.Close()
	}

	repeat := max(f.repeat, 1)
	warmup := f.warmup
	if f.verify {
		warmup = 0 // its timings are not judged; every run checks every row
	}
	total := 0
	for _, s := range specs {
		for _, on := range modes {
			if on {
				total += s.Prompts * (warmup + repeat)
			} else {
				total += s.Prompts
			}
		}
	}
	load := loadAverage()
	opt.LoadAverage = load
	if f.busy > 0 {
		busy, err := startBusy(f.busy)
		if err != nil {
			return 1, err
		}
		defer busy.stop()
	}
	bar := newProgress(f.progress, total, stderr)

	var reps []*replay.Report
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
			var rep *replay.Report
			var err error
			for i := 0; on && i < warmup && err == nil; i++ {
				rep, err = replay.Replay(spec, o) // untimed: faults the process's memory in
			}
			if err == nil {
				rep, err = replay.Replay(spec, o)
			}
			if on && repeat > 1 && err == nil {
				runs := []*replay.Report{rep}
				for i := 1; i < repeat && err == nil; i++ {
					if rep, err = replay.Replay(spec, o); err == nil {
						runs = append(runs, rep)
					}
				}
				if err == nil {
					rep = replay.Best(runs)
				}
			}
			if err != nil {
				failed++
				if errors.Is(err, replay.ErrVerify) {
					verifyFailed = true
				}
				if bar != nil {
					bar.Clear()
				}
				fmt.Fprintf(stderr, "replay: %v\n", err)
			}
			if rep != nil && (err == nil || errors.Is(err, replay.ErrVerify)) {
				reps = append(reps, rep)
				if jsonFile != nil {
					if err := replay.WriteJSON(jsonFile, rep); err != nil {
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
	write := replay.WriteTable
	if f.wide {
		write = replay.WriteWideTable
	}
	if err := write(stdout, reps); err != nil {
		return 1, err
	}
	if f.realScale {
		fmt.Fprintln(stdout)
		if err := replay.WriteScaleTable(stdout, reps); err != nil {
			return 1, err
		}
	}
	if f.dev.cuda {
		fmt.Fprintln(stdout)
		if err := replay.WriteDeviceTable(stdout, reps); err != nil {
			return 1, err
		}
	}
	fmt.Fprintf(stdout, "machine: %d CPUs, GOMAXPROCS %d, load average %s at start%s; cache-on runs: best of %d after %d untimed\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), loadString(load), busyNote(f.busy), repeat, warmup)
	fmt.Fprintf(stdout, "device: %s%s; forward held: %s\n", f.dev, deviceNote(dev), f.holdFor)
	if f.plot != "" && len(reps) > 0 {
		if err := figures.WritePlots(f.plot, reps); err != nil {
			fmt.Fprintf(stderr, "replay: plot: %v\n", err)
			failed++
		}
	}
	if f.samples != "" && len(reps) > 0 {
		if err := writeSamples(f.samples, reps); err != nil {
			fmt.Fprintf(stderr, "replay: samples: %v\n", err)
			failed++
		}
	}
	if f.memprofile != "" {
		if err := writeMemProfile(f.memprofile); err != nil {
			return 1, err
		}
	}
	switch {
	case verifyFailed:
		return 1, fmt.Errorf("verification failed")
	case failed > 0:
		return 1, fmt.Errorf("%d runs failed", failed)
	}
	if f.check {
		v := replay.Check(reps)
		if len(v.Missed) > 0 {
			return 1, fmt.Errorf("--check: %d targets missed: %s", len(v.Missed), strings.Join(v.Missed, "; "))
		}
		if len(v.Unjudged) > 0 {
			return 1, fmt.Errorf("--check: %d targets not judged, the machine too busy: %s", len(v.Unjudged), strings.Join(v.Unjudged, "; "))
		}
	}
	return 0, nil
}

// busyNote is the machine line's note on --busy.
func busyNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d cores kept busy beside the engine (--busy)", n)
}

// doneLine is the progress line of a finished run.
func doneLine(rep *replay.Report, err error) string {
	switch {
	case err == nil:
		return fmt.Sprintf("%d steps in %.2fs", rep.Steps, float64(rep.WallNs)/1e9)
	case errors.Is(err, replay.ErrVerify):
		return fmt.Sprintf("%d steps, FAILED verification", rep.Steps)
	}
	return "failed"
}

// writeSamples writes the runs' per-step samples as CSV to path.
func writeSamples(path string, reps []*replay.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := replay.WriteSamples(f, reps); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
