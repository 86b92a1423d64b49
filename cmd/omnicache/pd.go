package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay"
	"github.com/omnicache/omnicache/tier"
)

// The P/D replay (--pd P:D): prefill/decode disaggregation, P prefill and D
// decode replicas with one cache each over one tier, every request prefilled
// on one and decoded on another; the same run without the tier (the decode
// side recomputing the prompt) is its baseline.

func pdFlags(fs *flag.FlagSet, f *replayFlags) {
	fs.StringVar(&f.pd, "pd", "", "prefill/decode disaggregation: P:D prefill and decode replicas over one tier (--tier), every request prefilled on one and decoded on another, against the same run without the tier")
}

// checkPDFlags parses --pd and refuses what does not apply to it.
func checkPDFlags(f *replayFlags, set map[string]bool) error {
	p, d, ok := strings.Cut(f.pd, ":")
	var err error
	if ok {
		if f.pdPrefill, err = strconv.Atoi(p); err == nil {
			f.pdDecode, err = strconv.Atoi(d)
		}
	}
	if !ok || err != nil || f.pdPrefill < 1 || f.pdDecode < 1 || f.pdPrefill+f.pdDecode > maxReplicas {
		return fmt.Errorf("--pd %q: want P:D, at least one replica of each, %d in all at most", f.pd, maxReplicas)
	}
	if set["replicas"] {
		return fmt.Errorf("--pd runs its own replicas: not with --replicas")
	}
	if f.tier == "off" {
		return fmt.Errorf("--pd moves the prompt's rows through a tier: not with --tier off")
	}
	if f.tierAdmit > 1 {
		return fmt.Errorf("--pd: the prefill side publishes every full block: not with --tier-admit %d", f.tierAdmit)
	}
	for _, name := range []string{"wait-publish", "shared-kv-blocks"} {
		if set[name] {
			return fmt.Errorf("--%s does not apply to --pd", name)
		}
	}
	switch f.route {
	case "auto":
		f.route = replay.RouteRoundRobin
	case replay.RouteRoundRobin, replay.RouteLeastLoaded:
	default:
		return fmt.Errorf("--route %q with --pd: want %s or %s", f.route, replay.RouteRoundRobin, replay.RouteLeastLoaded)
	}
	return nil
}

// runPD replays every spec with the P/D pools and prints the table (JSON
// Lines to --json).
func runPD(f *replayFlags, specs []replay.Spec, stdout, stderr io.Writer) (int, error) {
	o := replay.Options{BlockSize: f.blockSize, MaxBatchedTokens: f.maxBatched, KVBlocks: replicasKVBlocks(f)}
	for _, s := range specs {
		if _, _, err := replay.PDKVBlocks(s, o, f.pdPrefill, f.pdDecode); err != nil {
			return 2, err
		}
	}
	if err := checkTierSpec(f.tier); err != nil {
		return 2, err
	}
	po := replay.PDOptions{Prefill: f.pdPrefill, Decode: f.pdDecode, Route: f.route, StepTime: f.stepTime, LoadAverage: loadAverage(),
		ReplicaOptions: replay.ReplicaOptions{Tier: f.tier, TierBytes: int64(f.tierMiB) << 20, TierRecent: f.tierRecent,
			TierPolicy: tier.Policy(f.tierPolicy), PacePark: f.pacePark, Verify: f.verify, BlockSize: f.blockSize,
			MaxBatchedTokens: f.maxBatched, KVBlocks: replicasKVBlocks(f)}}
	reps, failed, err := runSpecs(f, specs, stderr, func(s replay.Spec, ms *metricsServer) (*replay.PDReport, error) {
		fmt.Fprintf(stderr, "%s: %d:%d prefill:decode replicas, tier %s, route %s...\n", s.Name, f.pdPrefill, f.pdDecode, tier.Redact(f.tier), f.route)
		if ms != nil {
			workload := s.Model + "/" + s.Name
			po.Histograms = true
			po.OnCache = func(i int, c *omnicache.Cache) { ms.attachReplica(workload, i, c) }
		}
		return replay.RunPD(s, po)
	})
	if err != nil {
		return 1, err
	}
	if err := replay.WritePDTable(stdout, reps); err != nil {
		return 1, err
	}
	fmt.Fprintf(stdout, "machine: %d CPUs, load average %s at start\n", runtime.NumCPU(), loadString(po.LoadAverage))
	if failed != nil {
		return 1, failed
	}
	return 0, nil
}
