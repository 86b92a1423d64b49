package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnicache/omnicache/internal/redistest"
)

// TestReplayPD: --pd runs the prefill and decode pools over the embedded
// tier and over Redis, verifies every row and prints the table and a JSON
// record per workload.
func TestReplayPD(t *testing.T) {
	tr := sessionTrace(t, 4, 3)
	s := redistest.Start(t, redistest.Options{})
	for _, ts := range []string{"embedded", "redis://" + s.Addr} {
		js := filepath.Join(t.TempDir(), "pd.jsonl")
		code, out, errs := run(t, "--trace", tr, "--pd", "1:2", "--tier", ts, "--verify", "--concurrency", "3", "--json", js,
			"--widths", "hidden=32,extra=8:opt", "--route", "least-loaded")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s%s", ts, code, out, errs)
		}
		for _, want := range []string{"1:2", "import wait", "decode ttfp", "ttfp from the send", "machine: "} {
			if !strings.Contains(out, want) {
				t.Fatalf("%s: table lacks %q:\n%s", ts, want, out)
			}
		}
		recs := readJSONL(t, js)
		if len(recs) != 1 {
			t.Fatalf("%d JSON records", len(recs))
		}
		r := recs[0]
		checkSnake(t, map[string]any(r), "")
		if r["prefill_replicas"] != 1.0 || r["decode_replicas"] != 2.0 || r["tier"] != ts || r["route"] != "least-loaded" ||
			r["tier_rows"].(float64) <= 0 || r["recomputed"] != 0.0 || r["verify"] != true {
			b, _ := json.Marshal(r)
			t.Fatalf("%s: record %s", ts, b)
		}
		for _, pool := range []string{"prefill", "decode"} {
			p := r[pool].(map[string]any)
			if p["verify_failures"] != 0.0 || p["verify_missing_rows"] != 0.0 || p["verified_rows"].(float64) <= 0 {
				b, _ := json.Marshal(p)
				t.Fatalf("%s: %s pool %s", ts, pool, b)
			}
		}
	}
}

func TestReplayPDBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--pd", "1"},
		{"--pd", "0:1"},
		{"--pd", "1:x"},
		{"--pd", "200:100"},
		{"--pd", "1:2", "--replicas", "2"},
		{"--pd", "1:2", "--tier", "off"},
		{"--pd", "1:2", "--route", "session"},
		{"--pd", "1:2", "--tier-admit", "2"},
		{"--pd", "1:2", "--wait-publish"},
		{"--pd", "1:2", "--shared-kv-blocks", "100"},
		{"--pd", "1:2", "--cache", "on"},
		{"--pd", "1:2", "--busy", "1"},
		{"--pd", "1:2", "--real-scale"},
		{"--pd", "1:2", "--tier", "redis://127.0.0.1:1", "--tier-policy", "lru"},
		{"--pd", "1:2", "--kv-blocks", "300", "--workloads", "Qwen3-Omni/P4096_h0_c1$"},
	} {
		if code, _, errs := run(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errs)
		}
	}
}
