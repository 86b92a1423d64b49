// Package replay is the engine replay, the project's main job: it replays
// workloads (the reference's workload table, or a Mooncake-style request
// trace) through the engine simulator of sim, drives the real cache
// through its public API exactly as an engine would, and reports what the
// cache costs the engine goroutine, what it writes, whether it is right
// (--verify) and the projected throughput change.
//
// In this package the engine is the simulated inference engine (package
// sim's Sim, one per replica) that drives a cache, and the engine loop
// its step loop.
//
// The command is `go run ./cmd/omnicache replay`; this package is the
// machinery behind it, internal to the module. It runs on the goroutine
// that calls Run (one engine loop per replica, each on its own goroutine in
// the replicas mode) and owns the simulated engines, their caches and the
// reports.
package replay

import (
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
)

//go:embed workloads.txt
var defaultTable string

// DefaultTable is the embedded reference workload table (the format
// ParseWorkloads reads).
func DefaultTable() string { return defaultTable }

// Workload is one row of the reference table: vLLM "random dataset"
// parameters, the benchmark's concurrency, prompt count and dataset seed, the
// reference's results and the model's per-token keys and step cost.
type Workload struct {
	Model        string
	Name         string
	SharedPrefix int
	InputLen     int
	OutputLen    int
	RangeRatio   float64
	Concurrency  int
	Prompts      int
	// Seed is the reference's dataset seed; it picks the prompts.
	Seed uint64
	Ref  Reference
	Keys []omnicache.Key
	// Cost is the model's fitted step cost (zero when the table has no
	// `cost` line for the model).
	Cost StepCost
	// Field, for a field workload (a `field` line), generates its requests;
	// Model then names the model whose keys and step cost it uses, and it
	// has no reference.
	Field *Field
}

// Reference is what the reference measured for a workload. Changes are
// fractions (+0.765 is +76.5%).
type Reference struct {
	// Hit is its engine's prefix-hit rate as it printed it ("49.4",
	// "0.3-64.7"), in percent.
	Hit string
	// ReqPerSecOff is its cache-off throughput.
	ReqPerSecOff float64
	// Before and After are its throughput change with the cache on, before
	// and after its fix; AfterLo..AfterHi is the range of the after runs.
	Before, After, AfterLo, AfterHi float64
}

// FullName is "model/name", or "field/name" for a field workload.
func (w Workload) FullName() string { return w.FullNameOf(w.Field) }

// DefaultWorkloads parses the embedded table.
func DefaultWorkloads() []Workload {
	ws, err := ParseWorkloads(defaultTable)
	if err != nil {
		panic("bench: embedded workload table: " + err.Error())
	}
	return ws
}

// ParseWorkloads reads a workload table: one workload a line
// (`model name shared_prefix input_len output_len range_ratio concurrency
// prompts dataset_seed | ref_hit ref_req_per_s_off ref_before% ref_after%
// ref_after_lo% ref_after_hi%`), field workloads (`field name model
// param=value ... [keys=...]`, see Field), one `keys model key=bytes,...`
// line per model and at most one `cost model a_ns b_ns c_ns d_ns` line per
// model (see StepCost). '#' starts a comment.
func ParseWorkloads(text string) ([]Workload, error) {
	var ws []Workload
	keys := map[string][]omnicache.Key{}
	costs := map[string]StepCost{}
	for ln, line := range strings.Split(text, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "keys":
			if len(f) != 3 {
				return nil, fmt.Errorf("line %d: want `keys model key=bytes,...`", ln+1)
			}
			k, err := ParseWidths(f[2])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", ln+1, err)
			}
			keys[f[1]] = k
			continue
		case "cost":
			c, err := parseCost(f)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", ln+1, err)
			}
			if _, dup := costs[c.Model]; dup {
				return nil, fmt.Errorf("line %d: second cost line for %s", ln+1, c.Model)
			}
			costs[c.Model] = c
			continue
		case "field":
			w, err := parseField(f, keys)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", ln+1, err)
			}
			ws = append(ws, w)
			continue
		}
		w, err := parseWorkload(f)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", ln+1, err)
		}
		ws = append(ws, w)
	}
	seen := map[string]bool{}
	for i := range ws {
		if name := ws[i].FullName(); seen[name] {
			return nil, fmt.Errorf("two workloads named %s", name)
		} else {
			seen[name] = true
		}
		k, ok := keys[ws[i].FullName()]
		if !ok || ws[i].Field == nil {
			k, ok = keys[ws[i].Model]
		}
		if !ok {
			return nil, fmt.Errorf("no `keys %s ...` line", ws[i].Model)
		}
		ws[i].Keys = k
		ws[i].Cost = costs[ws[i].Model]
	}
	return ws, nil
}

func parseWorkload(f []string) (Workload, error) {
	if len(f) != 16 || f[9] != "|" {
		return Workload{}, fmt.Errorf("want 9 fields, '|' and 6 reference fields, got %d fields", len(f))
	}
	w := Workload{Model: f[0], Name: f[1]}
	for i, p := range []*int{&w.SharedPrefix, &w.InputLen, &w.OutputLen} {
		v, err := strconv.Atoi(f[2+i])
		if err != nil || v < 0 {
			return w, fmt.Errorf("bad length %q", f[2+i])
		}
		*p = v
	}
	var err error
	if w.RangeRatio, err = strconv.ParseFloat(f[5], 64); err != nil || !(w.RangeRatio >= 0 && w.RangeRatio < 1) {
		return w, fmt.Errorf("bad range ratio %q", f[5])
	}
	if w.Concurrency, err = strconv.Atoi(f[6]); err != nil || w.Concurrency <= 0 {
		return w, fmt.Errorf("bad concurrency %q", f[6])
	}
	if w.Prompts, err = strconv.Atoi(f[7]); err != nil || w.Prompts <= 0 {
		return w, fmt.Errorf("bad prompt count %q", f[7])
	}
	if w.Seed, err = strconv.ParseUint(f[8], 10, 64); err != nil {
		return w, fmt.Errorf("bad dataset seed %q", f[8])
	}
	if w.InputLen+w.SharedPrefix == 0 || w.OutputLen == 0 {
		return w, fmt.Errorf("empty prompt or output")
	}
	w.Ref.Hit = f[10]
	if w.Ref.ReqPerSecOff, err = strconv.ParseFloat(f[11], 64); err != nil || !(w.Ref.ReqPerSecOff > 0) || math.IsInf(w.Ref.ReqPerSecOff, 0) {
		return w, fmt.Errorf("bad reference throughput %q", f[11])
	}
	for i, p := range []*float64{&w.Ref.Before, &w.Ref.After, &w.Ref.AfterLo, &w.Ref.AfterHi} {
		// Percent to fraction in the parse ("76.5e-2"), so the fraction is
		// the double nearest the decimal.
		v, err := strconv.ParseFloat(f[12+i]+"e-2", 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= -1 {
			return w, fmt.Errorf("bad reference change %q", f[12+i])
		}
		*p = v
	}
	if w.Ref.AfterLo > w.Ref.AfterHi {
		return w, fmt.Errorf("reference range %s..%s is empty", f[14], f[15])
	}
	return w, nil
}

// ParseWidths reads per-token keys: `name=bytes[:opt|:req|:deferred],...`.
// The first key is required and later ones optional unless marked.
func ParseWidths(s string) ([]omnicache.Key, error) {
	var keys []omnicache.Key
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, rest, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("bad key %q: want name=bytes", part)
		}
		if seen[name] {
			return nil, fmt.Errorf("duplicate key %q", name)
		}
		seen[name] = true
		flags := strings.Split(rest, ":")
		n, err := strconv.Atoi(flags[0])
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad row bytes in %q", part)
		}
		k := omnicache.Key{Name: name, RowBytes: n, Optional: i > 0}
		for _, f := range flags[1:] {
			switch f {
			case "opt":
				k.Optional = true
			case "req":
				k.Optional = false
			case "deferred":
				k.Deferred = true
			default:
				return nil, fmt.Errorf("unknown key flag %q in %q", f, part)
			}
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no keys")
	}
	return keys, nil
}

// FormatWidths is the inverse of ParseWidths (flags always explicit).
func FormatWidths(keys []omnicache.Key) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%d", k.Name, k.RowBytes)
		if k.Optional {
			b.WriteString(":opt")
		}
		if k.Deferred {
			b.WriteString(":deferred")
		}
	}
	return b.String()
}

// Scaled returns w with its prompt count scaled: ceil(Prompts*scale), at
// least 2*Concurrency, at most Prompts.
// A field workload is generated at its own size: Scaled returns it as is.
func (w Workload) Scaled(scale float64) Workload {
	if scale >= 1 || w.Field != nil {
		return w
	}
	n := int(math.Ceil(float64(w.Prompts) * scale))
	n = max(n, 2*w.Concurrency)
	w.Prompts = min(n, w.Prompts)
	return w
}

// lengthRange is vLLM's random-dataset range: [len*(1-r), len*(1+r)].
func lengthRange(n int, r float64) (lo, hi int) {
	lo = int(math.Floor(float64(n) * (1 - r)))
	hi = int(math.Floor(float64(n) * (1 + r)))
	return max(lo, 1), max(hi, 1)
}

// MaxModelLen is the longest request the workload can produce.
func (w Workload) MaxModelLen() int {
	if w.Field != nil {
		return w.Field.maxModelLen()
	}
	_, in := lengthRange(w.InputLen, w.RangeRatio)
	if w.InputLen == 0 {
		in = 0
	}
	_, out := lengthRange(w.OutputLen, w.RangeRatio)
	return w.SharedPrefix + in + out
}

// Spec returns the replay spec of the workload; seed picks the prompts (0:
// the workload's dataset seed).
func (w Workload) Spec(seed uint64) Spec {
	if seed == 0 {
		seed = w.Seed
	}
	s := Spec{
		Name:        w.FullName(),
		Model:       w.Model,
		Keys:        w.Keys,
		Concurrency: w.Concurrency,
		Prompts:     w.Prompts,
		MaxModelLen: w.MaxModelLen(),
		Cost:        w.Cost,
	}
	if w.Field != nil {
		s.KVTokens = w.Field.kvTokens(w.MaxModelLen(), w.Concurrency)
		s.KVBlocks = w.Field.kvBlocks()
		s.Downstream = w.Field.Downstream
		s.Sim = w.Field.tune(seed)
		s.Source = func() sim.Source { return newFieldSource(w, seed) }
		return s
	}
	s.Ref = w.Ref
	s.Source = func() sim.Source { return NewRandomSource(w, seed) }
	return s
}
