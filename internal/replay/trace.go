package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/minio/simdjson-go"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
)

// TraceRecord is one request of a Mooncake-style JSONL trace: its arrival
// (ms, not replayed: requests are admitted in file order), its prompt and
// output lengths and one hash id per TraceBlockTokens of its prompt.
type TraceRecord struct {
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
	// Line is the record's line in the file (from 1), for errors.
	Line int `json:"-"`
}

// Trace parsers for ParseTrace.
const (
	ParserAuto = "auto" // simdjson when the CPU supports it, else encoding/json
	ParserSIMD = "simd" // github.com/minio/simdjson-go (AVX2 + CLMUL)
	ParserStd  = "std"  // encoding/json
)

// ErrNoSIMD reports -json-parser=simd on a CPU simdjson-go cannot use.
var ErrNoSIMD = errors.New("bench: simdjson-go needs AVX2 and CLMUL, which this CPU lacks")

// ResolveParser maps "auto" to the parser ParseTrace will use.
func ResolveParser(parser string) (string, error) {
	switch parser {
	case ParserAuto, "":
		if simdjson.SupportedCPU() {
			return ParserSIMD, nil
		}
		return ParserStd, nil
	case ParserSIMD:
		if !simdjson.SupportedCPU() {
			return "", ErrNoSIMD
		}
		return ParserSIMD, nil
	case ParserStd:
		return ParserStd, nil
	}
	return "", fmt.Errorf("bench: unknown JSON parser %q (auto, simd, std)", parser)
}

// ReadTrace reads and parses a trace file; see ParseTrace.
func ReadTrace(path, parser string, limit int) ([]TraceRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	recs, err := ParseTrace(data, parser, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// ParseTrace parses JSONL trace data with the named parser, keeping the first
// limit records (all when limit <= 0). Records stay in file order.
func ParseTrace(data []byte, parser string, limit int) ([]TraceRecord, error) {
	p, err := ResolveParser(parser)
	if err != nil {
		return nil, err
	}
	if limit > 0 {
		data = firstLines(data, limit)
	}
	var recs []TraceRecord
	if p == ParserSIMD {
		recs, err = parseSIMD(data)
	} else {
		recs, err = parseStd(data)
	}
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if r.InputLength <= 0 || r.OutputLength <= 0 {
			return nil, fmt.Errorf("%w: %s: input_length %d, output_length %d: both must be > 0",
				ErrTraceRecord, recordAt(i, r), r.InputLength, r.OutputLength)
		}
	}
	return recs, nil
}

// recordAt names record i (from 0) for an error: its number and, read
// from a file, its line.
func recordAt(i int, r TraceRecord) string {
	if r.Line == 0 {
		return fmt.Sprintf("record %d", i+1)
	}
	return fmt.Sprintf("record %d (line %d)", i+1, r.Line)
}

// firstLines cuts data after its n-th non-empty line.
func firstLines(data []byte, n int) []byte {
	off := 0
	for n > 0 && off < len(data) {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return data
		}
		if len(bytes.TrimSpace(data[off:off+i])) > 0 {
			n--
		}
		off += i + 1
	}
	return data[:off]
}

func parseStd(data []byte) ([]TraceRecord, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var recs []TraceRecord
	for {
		var r TraceRecord
		start := dec.InputOffset()
		if err := dec.Decode(&r); err == io.EOF {
			return recs, nil
		} else if err != nil {
			return nil, fmt.Errorf("record %d (line %d): %w", len(recs)+1, lineAt(data, start), err)
		}
		r.Line = lineAt(data, start)
		recs = append(recs, r)
	}
}

// lineAt is the line (from 1) of the first non-space byte at or after off.
func lineAt(data []byte, off int64) int {
	for off < int64(len(data)) && (data[off] == ' ' || data[off] == '\t' || data[off] == '\n' || data[off] == '\r') {
		off++
	}
	return bytes.Count(data[:off], []byte{'\n'}) + 1
}

func parseSIMD(data []byte) ([]TraceRecord, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	pj, err := simdjson.ParseND(data, nil)
	if err != nil {
		// simdjson validates the whole file at once and names no record:
		// encoding/json names the first bad one. Should it accept the file,
		// its records are the answer.
		recs, stdErr := parseStd(data)
		if stdErr != nil {
			return nil, fmt.Errorf("%w (simdjson: %v)", stdErr, err)
		}
		return recs, nil
	}
	var recs []TraceRecord
	var el simdjson.Element
	var arr simdjson.Array
	var scratch []int64
	line, off := 0, 0 // the line of the record: ParseND takes one a line
	err = pj.ForEach(func(it simdjson.Iter) error {
		var r TraceRecord
		n := len(recs) + 1
		for {
			line++
			end := bytes.IndexByte(data[off:], '\n')
			if end < 0 {
				end = len(data) - off
			}
			blank := len(bytes.TrimSpace(data[off:off+end])) == 0
			off = min(off+end+1, len(data))
			if !blank || off == len(data) {
				break
			}
		}
		r.Line = line
		geti := func(name string) (int64, error) {
			e, err := it.FindElement(&el, name)
			if err != nil {
				return 0, fmt.Errorf("record %d: %s: %w", n, name, err)
			}
			// As encoding/json into an int: an integer literal, not 1e12.
			if t := e.Iter.Type(); t != simdjson.TypeInt && t != simdjson.TypeUint {
				return 0, fmt.Errorf("record %d: %s: %s is not an integer", n, name, t)
			}
			v, err := e.Iter.Int()
			if err != nil {
				return 0, fmt.Errorf("record %d: %s: %w", n, name, err)
			}
			return v, nil
		}
		var v int64
		if v, err = geti("timestamp"); err != nil {
			return err
		}
		r.Timestamp = v
		if v, err = geti("input_length"); err != nil {
			return err
		}
		r.InputLength = int(v)
		if v, err = geti("output_length"); err != nil {
			return err
		}
		r.OutputLength = int(v)
		e, err := it.FindElement(&el, "hash_ids")
		if err != nil {
			return fmt.Errorf("record %d: hash_ids: %w", n, err)
		}
		a, err := e.Iter.Array(&arr)
		if err != nil {
			return fmt.Errorf("record %d: hash_ids: %w", n, err)
		}
		// Not Array.AsInteger: it sizes its result from the rest of the whole
		// tape, which is quadratic over a file.
		ids := scratch[:0]
		ai := a.Iter()
		for ai.Advance() != simdjson.TypeNone {
			v, err := ai.Int()
			if err != nil {
				return fmt.Errorf("record %d: hash_ids[%d]: %w", n, len(ids), err)
			}
			ids = append(ids, v)
		}
		scratch = ids
		r.HashIDs = append([]int64(nil), ids...)
		recs = append(recs, r)
		return nil
	})
	return recs, err
}

// DefaultTraceMaxModelLen is the model length a trace's requests are checked
// against by default: 256k tokens (the Mooncake traces' longest requests are
// about 191k).
const DefaultTraceMaxModelLen = 1 << 18

// TraceLimits are what a trace's requests must fit: the model length and,
// each request alone, the KV pool.
type TraceLimits struct {
	MaxModelLen int // tokens, prompt + output
	KVBlocks    int // KV pool size
	BlockSize   int // tokens a KV block
}

// ErrTraceRecord reports a trace record the engine could never serve.
var ErrTraceRecord = errors.New("bench: trace record out of range")

// CheckTrace checks every record against the limits before anything is sized
// from it, and its arrival time (not negative) and hash ids (one per
// TraceBlockTokens of its prompt); the error names the first record out of
// range.
func CheckTrace(recs []TraceRecord, lim TraceLimits) error {
	if lim.MaxModelLen <= 0 || lim.KVBlocks <= 0 || lim.BlockSize <= 0 {
		return fmt.Errorf("bench: trace limits %+v: every limit must be > 0", lim)
	}
	pool := int64(lim.KVBlocks) * int64(lim.BlockSize)
	for i, r := range recs {
		if r.InputLength <= 0 || r.OutputLength <= 0 {
			return fmt.Errorf("%w: %s: input_length %d, output_length %d: both must be > 0",
				ErrTraceRecord, recordAt(i, r), r.InputLength, r.OutputLength)
		}
		// Each length alone first: their sum could wrap past the check.
		total := int64(r.InputLength) + int64(r.OutputLength)
		if r.InputLength > lim.MaxModelLen || r.OutputLength > lim.MaxModelLen || total > int64(lim.MaxModelLen) {
			return fmt.Errorf("%w: %s: input_length %d + output_length %d = %d tokens, more than the model length %d",
				ErrTraceRecord, recordAt(i, r), r.InputLength, r.OutputLength, total, lim.MaxModelLen)
		}
		if total > pool {
			return fmt.Errorf("%w: %s: %d tokens, more than the KV pool (%d blocks of %d tokens)",
				ErrTraceRecord, recordAt(i, r), total, lim.KVBlocks, lim.BlockSize)
		}
		if r.Timestamp < 0 {
			return fmt.Errorf("%w: %s: timestamp %d: must be >= 0 (ms)", ErrTraceRecord, recordAt(i, r), r.Timestamp)
		}
		if need := (r.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(r.HashIDs) < need {
			return fmt.Errorf("%w: %s: %d hash_ids for input_length %d: want %d, one per %d prompt tokens",
				ErrTraceRecord, recordAt(i, r), len(r.HashIDs), r.InputLength, need, TraceBlockTokens)
		}
	}
	return nil
}

// TraceSpec is the replay spec of a parsed trace: requests admitted in file
// order (timestamps are not replayed), keys and concurrency as given. Every
// record is checked against lim first (CheckTrace); the spec's KV pool is
// lim.KVBlocks.
func TraceSpec(name string, recs []TraceRecord, keys []omnicache.Key, concurrency int, lim TraceLimits) (Spec, error) {
	if err := CheckTrace(recs, lim); err != nil {
		return Spec{}, err
	}
	maxLen := 1
	for _, r := range recs {
		maxLen = max(maxLen, r.InputLength+r.OutputLength)
	}
	return Spec{
		Name:        name,
		Model:       "trace",
		Keys:        keys,
		Concurrency: concurrency,
		Prompts:     len(recs),
		MaxModelLen: maxLen,
		KVBlocks:    lim.KVBlocks,
		Source:      func() sim.Source { return NewTraceSource(recs) },
	}, nil
}
