package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnicache/omnicache/internal/redistest"
)

// sessionTrace writes a multi-turn trace: each conversation's turn repeats
// its previous prompt and adds a 512-token block, turns interleaved.
func sessionTrace(t *testing.T, convs, turns int) string {
	t.Helper()
	var b strings.Builder
	for k := 0; k < turns; k++ {
		for c := 0; c < convs; c++ {
			var ids []string
			for j := 0; j <= k+1; j++ {
				ids = append(ids, fmt.Sprint(c*100+j))
			}
			fmt.Fprintf(&b, `{"timestamp": 0, "input_length": %d, "output_length": 3, "hash_ids": [%s]}`+"\n", len(ids)*512-50, strings.Join(ids, ", "))
		}
	}
	p := filepath.Join(t.TempDir(), "sessions.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReplayReplicas(t *testing.T) {
	tr := sessionTrace(t, 5, 3)
	js := filepath.Join(t.TempDir(), "r.jsonl")
	mem := filepath.Join(t.TempDir(), "mem.pprof")
	code, out, errs := run(t, "--trace", tr, "--replicas", "2", "--route", "round-robin", "--verify", "--wait-publish", "--concurrency", "2", "--json", js, "--widths", "hidden=32,extra=8:opt", "--memprofile", mem)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	if st, err := os.Stat(mem); err != nil || st.Size() == 0 {
		t.Fatalf("--memprofile with --replicas wrote no profile: %v", err)
	}
	if !strings.Contains(out, "all 2") || !strings.Contains(out, "without a tier") {
		t.Fatalf("table:\n%s", out)
	}
	recs := readJSONL(t, js)
	if len(recs) != 1 {
		t.Fatalf("%d JSON records", len(recs))
	}
	r := recs[0]
	checkSnake(t, map[string]any(r), "")
	if r["replicas"] != 2.0 || r["tier"] != "embedded" || r["verify_failures"] != 0.0 || r["tier_hit_tokens"].(float64) <= 0 {
		b, _ := json.Marshal(r)
		t.Fatalf("record %s", b)
	}
	if per := r["per_replica"].([]any); len(per) != 2 {
		t.Fatalf("%d per-replica records", len(per))
	}
}

func TestReplayReplicasBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--tier", "off"},                      // without --replicas
		{"--route", "session"},                 // without --replicas
		{"--replicas", "2", "--route", "rand"}, // unknown route
		{"--replicas", "2", "--tier", "memcached"},
		{"--replicas", "-1"},
		{"--replicas", "2", "--cache", "off"}, // a flag of the one-engine replay
		{"--replicas", "2", "--warmup", "0"},
		{"--tier-mib", "64"}, // without --replicas
		{"--replicas", "2", "--tier", "off", "--tier-mib", "64"},
		{"--replicas", "2", "--tier-mib", "-1"},
		{"--tier-recent", "2s"}, // without --replicas
		{"--pace-park"},         // without --replicas
		{"--replicas", "2", "--tier-recent", "11m"},
		{"--tier-policy", "lru"}, // without --replicas
		{"--tier-admit", "2"},    // without --replicas
		{"--replicas", "2", "--tier-policy", "arc"},
		{"--replicas", "2", "--tier-admit", "0"},
		{"--replicas", "2", "--tier-admit", "70000"},
		{"--replicas", "2", "--tier", "off", "--tier-admit", "2"},
		{"--replicas", "2", "--tier", "redis://127.0.0.1:1", "--tier-policy", "lru"}, // the server evicts
	} {
		if code, _, errs := run(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errs)
		}
	}
}

// TestReplayReplicasOnDefaults: each replica is a whole engine, so the
// reference workload whose automatic pool, split over two replicas, was
// below its one request (P4096_h0_c1) runs, as does a field workload with
// a pool of its own (preempt_resume); a --kv-blocks too small to split is
// refused before anything runs, saying what would fit.
func TestReplayReplicasOnDefaults(t *testing.T) {
	code, out, errs := run(t, "--replicas", "2", "--workloads", "Qwen3-Omni/P4096_h0_c1$|field/preempt_resume", "--scale", "0.01")
	if code != 0 || !strings.Contains(out, "Qwen3-Omni/P4096_h0_c1") || !strings.Contains(out, "field/preempt_resume") {
		t.Fatalf("exit %d:\n%s%s", code, out, errs)
	}
	oneLine(t, 2, []string{"--replicas", "2", "--kv-blocks", "300", "--workloads", "Qwen3-Omni/P4096_h0_c1$"},
		"300 KV blocks over 2 replicas leave 150 each", "give at least 514 blocks")
}

// TestReplayReplicasTierChecked: a tier spec that opens no store is
// refused before anything runs, with one line: an unknown scheme, no
// address, nothing listening, a server that does not speak Redis.
func TestReplayReplicasTierChecked(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	http, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer http.Close()
	go func() {
		for {
			c, err := http.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	for _, c := range []struct{ spec, want string }{
		{"foo://x", `unknown scheme "foo"`},
		{"redis-cluster://", `address ""`},
		{"redis://" + closedAddr, "connection refused"},
		{"redis://" + http.Addr().String(), "does not speak the Redis protocol"},
	} {
		oneLine(t, 2, []string{"--replicas", "2", "--tier", c.spec, "--workloads", "Qwen3-Omni/DEC100_c32$", "--scale", "0.01"},
			"--tier", c.want)
	}
}

// TestReplayReplicasRedactsPassword: a Redis password given in --tier
// shows in no output, error or JSON (here the server is unreachable, so
// the spec reaches an error message).
func TestReplayReplicasRedactsPassword(t *testing.T) {
	jf := filepath.Join(t.TempDir(), "r.jsonl")
	for _, args := range [][]string{
		{"--replicas", "2", "--tier", "redis://u:hunter2secret@127.0.0.1:1", "--trace", trace, "--limit", "8", "--json", jf},
		{"--replicas", "2", "--tier", "mem://u:hunter2secret@h"},
		// Passwords holding what ends a password for a scanner.
		{"--replicas", "2", "--tier", "redis://u:pa'hunter2secret@127.0.0.1:1", "--trace", trace, "--limit", "8", "--json", jf},
		{"--replicas", "2", "--tier", "redis://u:a@b:/hunter2secret%27'@127.0.0.1:1", "--trace", trace, "--limit", "8", "--json", jf},
		{"--replicas", "2", "--tier", "redsi://u:pa'hunter2secret@h"},
		{"--replicas", "2", "--tier", "redis:/u:pa'hunter2secret@h"},
	} {
		_, out, errs := run(t, args...)
		js, _ := os.ReadFile(jf)
		for what, s := range map[string]string{"stdout": out, "stderr": errs, "json": string(js)} {
			if strings.Contains(s, "hunter2secret") {
				t.Errorf("%v: the password shows in %s: %s", args, what, s)
			}
		}
	}
}

// TestReplayReplicasRedactsPasswordServed: a run against a real Redis whose
// password holds an apostrophe, "@" and ":" (given raw and %-escaped)
// prints its table, stderr and JSON record without it.
func TestReplayReplicasRedactsPasswordServed(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "pa'hunter2@x:y"})
	for _, pw := range []string{"pa'hunter2@x:y", "pa%27hunter2%40x%3Ay"} {
		jf := filepath.Join(t.TempDir(), "r.jsonl")
		spec := "redis://:" + pw + "@" + s.Addr
		code, out, errs := run(t, "--replicas", "2", "--tier", spec, "--trace", sessionTrace(t, 2, 2), "--json", jf, "--widths", "hidden=32")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s%s", spec, code, out, errs)
		}
		js, _ := os.ReadFile(jf)
		if !strings.Contains(out, "redis://:xxxxx@") || !strings.Contains(string(js), "redis://:xxxxx@"+s.Addr) {
			t.Errorf("%s: the table or the record does not name the redacted tier:\n%s\n%s", spec, out, js)
		}
		for what, o := range map[string]string{"stdout": out, "stderr": errs, "json": string(js)} {
			if strings.Contains(o, "hunter2") {
				t.Errorf("%s: the password shows in %s: %s", spec, what, o)
			}
		}
	}
}

// TestReplayReplicasPolicyAdmit: --tier-policy and --tier-admit reach the
// tier (the record names them; admission holds blocks back) and
// --metrics-addr serves every replica's cache with its histograms and
// its tier's, mid-run.
func TestReplayReplicasPolicyAdmit(t *testing.T) {
	tr := sessionTrace(t, 5, 3)
	var mid string
	metricsHook = func(ev metricsEvent) {
		if ev.step == 2 && mid == "" {
			mid = get(t, ev.url)
		}
	}
	t.Cleanup(func() { metricsHook = nil })
	for _, pol := range []string{"lru", "s3fifo"} {
		js := filepath.Join(t.TempDir(), "r.jsonl")
		args := []string{"--trace", tr, "--replicas", "2", "--route", "round-robin", "--verify", "--wait-publish", "--concurrency", "2",
			"--json", js, "--widths", "hidden=32", "--tier-policy", pol, "--tier-admit", "2"}
		if pol == "lru" {
			args = append(args, "--metrics-addr", "127.0.0.1:0")
		}
		code, out, errs := run(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s%s", code, out, errs)
		}
		if !strings.Contains(out, "tier: policy "+pol+", admit after 2 sightings") {
			t.Fatalf("table:\n%s", out)
		}
		r := readJSONL(t, js)[0]
		if r["tier_policy"] != pol || r["tier_admit_after"] != 2.0 || r["tier_publish_unadmitted"].(float64) <= 0 ||
			r["verify_failures"] != 0.0 || r["tier_bound_bytes"].(float64) <= 0 {
			b, _ := json.Marshal(r)
			t.Fatalf("record %s", b)
		}
	}
	for _, want := range []string{
		`omnicache_staging_page_wait_seconds_bucket{replica="0"`,
		`omnicache_tier_set_seconds_bucket{replica="1"`,
		`omnicache_tier_lookup_seconds_count{replica="0"`,
		`omnicache_tier_publish_unadmitted_blocks_total{replica="1"`,
	} {
		if !strings.Contains(mid, want) {
			t.Errorf("mid-run /metrics lacks %s:\n%.2000s", want, mid)
		}
	}
}
