package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay"
	"github.com/omnicache/omnicache/tier"
)

// The replay with replicas (--replicas N): N simulated engines behind a
// router, a simulated shared KV store, one cache each, one shared tier.

func replicaFlags(fs *flag.FlagSet, f *replayFlags) {
	fs.IntVar(&f.replicas, "replicas", 0, "run N engine replicas behind a router, sharing a simulated KV store and one tier (0: one engine, cache off vs on)")
	fs.StringVar(&f.tier, "tier", "embedded", "with --replicas or --pd: the shared tier: embedded, off (not with --pd) (each replica hits only its own KV), redis://[user:pass@]HOST:PORT, rediss://..., redis-cluster://H1:P1,H2:P2,...")
	fs.IntVar(&f.sharedKV, "shared-kv-blocks", 0, "with --replicas: blocks the simulated shared KV store holds, least recently used out first (0: 4 × the KV pool)")
	fs.BoolVar(&f.waitPublish, "wait-publish", false, "with --replicas: pace each forward until the blocks gathered so far are stored in the tier (tier hits then do not depend on the publishers' CPU time; costs wall time)")
	fs.IntVar(&f.tierMiB, "tier-mib", 0, "with --replicas or --pd, --tier embedded: the embedded tier's bound in MiB, evicted by --tier-policy (0: "+fmt.Sprint(tier.DefaultEmbeddedBytes>>20)+"; with --pd, room for every value the run publishes or "+fmt.Sprint(replay.PDTierHeadroom)+"x the values in flight, at least that, at most "+fmt.Sprint(replay.PDMaxAutoTierBytes>>20)+")")
	fs.BoolVar(&f.pacePark, "pace-park", false, "with --replicas or --pd: let the pacing Sync park after 50µs (default: it spins through the committer's work, Config.SyncSpin, as an engine thread waiting on its forward keeps its core)")
	fs.DurationVar(&f.tierRecent, "tier-recent", 0, "with --replicas or --pd: skip publishing a full block the tier stored within this window (0: "+tier.DefaultRecentWindow.String()+", with --pd: publish every block; negative: publish every block)")
	fs.StringVar(&f.tierPolicy, "tier-policy", string(tier.DefaultPolicy), "with --replicas or --pd, --tier embedded: the embedded tier's eviction policy: "+string(tier.PolicyLRU)+" or "+string(tier.PolicyS3FIFO)+" (scan-resistant)")
	fs.IntVar(&f.tierAdmit, "tier-admit", 1, "with --replicas: publish a full block to the tier only once it was seen (computed) this many times (TierConfig.AdmitAfter; 1: every block)")
	fs.StringVar(&f.route, "route", "auto", "with --replicas: the router: round-robin, session (by the prompt's first KV block), auto (session for --trace, else round-robin); with --pd: the proxy over each pool: round-robin (auto) or least-loaded")
}

const maxReplicas = 256

func checkReplicaFlags(f *replayFlags, set map[string]bool) error {
	if f.replicas < 0 || f.replicas > maxReplicas {
		return fmt.Errorf("--replicas %d: want 0..%d", f.replicas, maxReplicas)
	}
	if f.sharedKV < 0 || f.sharedKV > maxKVBlocks {
		return fmt.Errorf("--shared-kv-blocks %d: want 0..%d", f.sharedKV, maxKVBlocks)
	}
	if f.tierMiB < 0 || f.tierMiB > maxMirrorMiB {
		return fmt.Errorf("--tier-mib %d: want 0..%d", f.tierMiB, maxMirrorMiB)
	}
	if f.tierAdmit < 1 || f.tierAdmit > omnicache.MaxAdmitAfter {
		return fmt.Errorf("--tier-admit %d: want 1..%d", f.tierAdmit, omnicache.MaxAdmitAfter)
	}
	if p := tier.Policy(f.tierPolicy); p != tier.PolicyLRU && p != tier.PolicyS3FIFO {
		return fmt.Errorf("--tier-policy %q: want %s or %s", f.tierPolicy, tier.PolicyLRU, tier.PolicyS3FIFO)
	}
	if f.tierRecent > tier.MaxRecentWindow {
		return fmt.Errorf("--tier-recent %v: want at most %v", f.tierRecent, tier.MaxRecentWindow)
	}
	if f.replicas == 0 && f.pd == "" {
		for _, name := range []string{"tier", "tier-mib", "tier-recent", "tier-policy", "tier-admit", "pace-park", "route", "shared-kv-blocks", "wait-publish"} {
			if set[name] {
				return fmt.Errorf("--%s applies to --replicas or --pd only", name)
			}
		}
		return nil
	}
	mode := "--replicas"
	if f.pd != "" {
		mode = "--pd"
		if err := checkPDFlags(f, set); err != nil {
			return err
		}
	} else {
		switch f.route {
		case "auto":
			f.route = replay.RouteRoundRobin
			if f.trace != "" {
				f.route = replay.RouteSession
			}
		case replay.RouteRoundRobin, replay.RouteSession:
		default:
			return fmt.Errorf("--route %q: want auto, %s or %s", f.route, replay.RouteRoundRobin, replay.RouteSession)
		}
	}
	if f.tier != "embedded" && f.tier != "off" && !strings.Contains(f.tier, "://") {
		return fmt.Errorf("--tier %q: want embedded, off, redis://HOST:PORT or redis-cluster://H1:P1,...", tier.Redact(f.tier))
	}
	for _, name := range []string{"tier-mib", "tier-policy"} {
		if set[name] && f.tier != "embedded" {
			return fmt.Errorf("--%s applies to --tier embedded only", name)
		}
	}
	if set["tier-admit"] && f.tier == "off" {
		return fmt.Errorf("--tier-admit applies to a tier (not --tier off)")
	}
	for _, name := range []string{"cache", "device", "plot", "repeat", "warmup", "check", "wide", "materialize-on", "hold", "owned", "staging-depth", "decode-buffer", "pace", "step-time"} {
		if set[name] && !(name == "step-time" && f.pd != "") {
			return fmt.Errorf("--%s does not apply to %s", name, mode)
		}
	}
	return nil
}

// checkReplicas refuses, before anything runs, what would fail a run of
// specs on f.replicas engines part way: a workload whose KV pool split over
// the replicas leaves one less than a request, and a tier spec that opens
// no store (an unknown scheme, no address, a server that cannot be
// reached or does not speak the Redis protocol).
func checkReplicas(f *replayFlags, specs []replay.Spec) error {
	o := replay.Options{BlockSize: f.blockSize, MaxBatchedTokens: f.maxBatched, KVBlocks: replicasKVBlocks(f)}
	for _, s := range specs {
		if _, err := replay.ReplicaKVBlocks(s, o, f.replicas); err != nil {
			return err
		}
	}
	return checkTierSpec(f.tier)
}

// checkTierSpec refuses a tier spec that opens no store (an unknown
// scheme, no address, a server that cannot be reached or does not speak
// the Redis protocol).
func checkTierSpec(spec string) error {
	if spec == "embedded" || spec == "off" {
		return nil
	}
	b, err := tier.Open(spec, tier.RedisOptions{})
	if err != nil {
		hint := ""
		if strings.Contains(err.Error(), "unknown message type") {
			hint = " (the server there does not speak the Redis protocol: is it a Redis server's address?)"
		}
		return fmt.Errorf("--tier %s: %s%s", tier.Redact(spec), tier.Redact(err.Error()), hint)
	}
	return b.Close()
}

// runSpecs runs every spec in turn with run (given the --metrics-addr
// server, nil without), writes each report to the --json file (JSON
// Lines) and returns them with the runs' failures joined: a run whose
// verification failed (replay.ErrVerify) is reported and the next runs;
// any other failure ends the loop. err is an error of the output itself.
func runSpecs[R any](f *replayFlags, specs []replay.Spec, stderr io.Writer,
	run func(s replay.Spec, ms *metricsServer) (*R, error)) (reps []*R, failed, err error) {
	var js *json.Encoder
	if f.jsonOut != "" {
		jf, err := os.Create(f.jsonOut)
		if err != nil {
			return nil, nil, err
		}
		defer jf.Close()
		js = json.NewEncoder(jf)
	}
	var ms *metricsServer
	if f.metricsAddr != "" {
		if ms, err = startMetrics(f.metricsAddr, stderr); err != nil {
			return nil, nil, err
		}
		defer ms.close()
	}
	for _, s := range specs {
		rep, err := run(s, ms)
		if rep != nil && (err == nil || errors.Is(err, replay.ErrVerify)) {
			reps = append(reps, rep)
			if js != nil {
				if err := js.Encode(rep); err != nil {
					return reps, failed, err
				}
			}
		}
		if err != nil {
			failed = errors.Join(failed, err)
			if !errors.Is(err, replay.ErrVerify) {
				break
			}
		}
	}
	return reps, failed, nil
}

// replicasKVBlocks is the KV pool of all replicas (ReplicaOptions.KVBlocks):
// --kv-blocks, or a trace's default pool, split over the replicas; 0 for the
// table's workloads without --kv-blocks: each replica is a whole engine.
func replicasKVBlocks(f *replayFlags) int {
	if f.kvBlocks == 0 && f.trace != "" {
		return defaultTraceKVBlocks
	}
	return f.kvBlocks
}

// runReplicas replays every spec on f.replicas engines and prints the
// per-replica and total table (JSON Lines to --json).
func runReplicas(f *replayFlags, specs []replay.Spec, stdout, stderr io.Writer) (int, error) {
	if err := checkReplicas(f, specs); err != nil {
		return 2, err
	}
	o := replay.ReplicaOptions{Replicas: f.replicas, Tier: f.tier, TierBytes: int64(f.tierMiB) << 20, TierRecent: f.tierRecent, PacePark: f.pacePark, Route: f.route, Verify: f.verify,
		BlockSize: f.blockSize, MaxBatchedTokens: f.maxBatched, KVBlocks: replicasKVBlocks(f), SharedKVBlocks: f.sharedKV, WaitPublish: f.waitPublish,
		TierPolicy: tier.Policy(f.tierPolicy), AdmitAfter: f.tierAdmit}
	reps, failed, err := runSpecs(f, specs, stderr, func(s replay.Spec, ms *metricsServer) (*replay.ReplicasReport, error) {
		fmt.Fprintf(stderr, "%s: %d replicas, tier %s, route %s...\n", s.Name, f.replicas, tier.Redact(f.tier), f.route)
		if ms != nil {
			workload := s.Model + "/" + s.Name
			o.Histograms = true
			o.OnCache = func(i int, c *omnicache.Cache) { ms.attachReplica(workload, i, c) }
			o.AfterRound = func(round int) {
				if metricsHook != nil {
					metricsHook(metricsEvent{url: ms.url, workload: workload, step: round})
				}
			}
		}
		return replay.RunReplicas(s, o)
	})
	if err != nil {
		return 1, err
	}
	if err := replay.WriteReplicaTable(stdout, reps); err != nil {
		return 1, err
	}
	if failed != nil {
		return 1, failed
	}
	return 0, nil
}
