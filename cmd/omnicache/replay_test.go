package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const trace = "../../bench/testdata/mooncake/synthetic_trace.jsonl"

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := replayMain(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestReplayTableCacheOff(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "r.jsonl")
	code, out, errs := run(t, "--cache", "off", "--workloads", "DEC100_c32$", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "Qwen3-Omni/DEC100_c32") || !strings.Contains(out, "MiniCPM-o/DEC100_c32") {
		t.Fatalf("table:\n%s", out)
	}
	f, err := os.Open(js)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"name", "cache", "hit_rate", "engine_ns_per_step_p50", "engine_ns_per_step_p99",
			"projected_throughput_change", "mirror_resident_bytes", "first_request_ns", "verify_failures", "steps", "tokens"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("JSON lacks %q: %s", k, sc.Text())
			}
		}
		if m["cache"] != "off" || m["prompts"].(float64) != 64 {
			t.Fatalf("%v", m)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("%d JSON objects, want 2", n)
	}
}

func TestReplayTraceParsers(t *testing.T) {
	var outs []string
	for _, p := range []string{"std", "auto"} {
		code, out, errs := run(t, "--trace", trace, "--limit", "30", "--cache", "off", "--json-parser", p, "--concurrency", "8")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", p, code, errs)
		}
		// The last line names the machine's load, which changes between runs.
		outs = append(outs, out[:strings.LastIndex(out, "machine:")])
	}
	if outs[0] != outs[1] {
		t.Fatalf("parsers give different replays:\n%s\n%s", outs[0], outs[1])
	}
}

func TestReplayBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--cache", "maybe"},
		{"--workloads", "nothing-matches"},
		{"--trace", trace, "--widths", "hidden"},
		{"--json-parser", "fast", "--trace", trace},
		{"extra"},
	} {
		if code, _, _ := run(t, args...); code == 0 {
			t.Errorf("%q accepted", args)
		}
	}
	if code, _, errs := run(t, "-h"); code != 0 || !strings.Contains(errs, "--verify") && !strings.Contains(errs, "-verify") {
		t.Errorf("-h: %d %s", code, errs)
	}
}
