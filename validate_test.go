package omnicache_test

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/omnicache/omnicache"
)

// TestPlanValidation runs Begin over plans each broken in one way and
// checks the error class and that the refusal changed nothing: Stats
// are the same, and the unbroken plan then begins, saves and serves the
// exact hit rows.
func TestPlanValidation(t *testing.T) {
	const bs, rb, stride = 4, 8, 4
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: bs, Keys: []omnicache.Key{{Name: "h", RowBytes: rb}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	table := []int32{0, 1, 2, 0, 0, 1, 3, 0}
	rows := func(id int64, start, n int) []byte {
		b := make([]byte, n*rb)
		for i := range b {
			b[i] = byte(id*32 + int64(start+i/rb))
		}
		return b
	}
	// request 1 prefills 8 tokens (blocks 0 and 1)
	if err := c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8},
		Table: table, Stride: stride, Arrivals: []int64{1}, HitTokens: []int32{0}}); err != nil {
		t.Fatal(err)
	}
	id, err := c.Save(&omnicache.Outputs{Tokens: 8, Padded: 8, Tensors: []omnicache.Tensor{{Host: rows(1, 0, 8), Rows: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Discard(id); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(); err != nil { // the committer is idle: Stats hold still
		t.Fatal(err)
	}
	// base: request 1 decodes position 8, request 2 arrives with a hit on
	// blocks 0 and 1 and computes positions 8 and 9
	base := func() *omnicache.Plan {
		return &omnicache.Plan{
			IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{8, 8}, Count: []int32{1, 2},
			Table: append([]int32(nil), table...), Stride: stride,
			Arrivals: []int64{2}, HitTokens: []int32{8}, HitBlocks: []int32{0, 1},
		}
	}
	cases := []struct {
		name   string
		break_ func(p *omnicache.Plan)
		want   error
	}{
		{"rows short", func(p *omnicache.Plan) { p.Rows = p.Rows[:1] }, omnicache.ErrPlan},
		{"counts short", func(p *omnicache.Plan) { p.Count = p.Count[:1] }, omnicache.ErrPlan},
		{"row outside the table", func(p *omnicache.Plan) { p.Rows[1] = 2 }, omnicache.ErrPlan},
		{"negative start", func(p *omnicache.Plan) { p.Start[0] = -1 }, omnicache.ErrPlan},
		{"past the table's row", func(p *omnicache.Plan) { p.Start[0] = stride * bs }, omnicache.ErrPlan},
		{"block id outside the cache", func(p *omnicache.Plan) { p.Table[2] = 16 }, omnicache.ErrPlan},
		{"negative block id", func(p *omnicache.Plan) { p.Table[2] = -1 }, omnicache.ErrPlan},
		{"id twice in the batch", func(p *omnicache.Plan) { p.IDs[1] = 1 }, omnicache.ErrPlan},
		{"hit not block aligned", func(p *omnicache.Plan) { p.HitTokens[0] = 6 }, omnicache.ErrUnalignedHit},
		{"hit without its blocks", func(p *omnicache.Plan) { p.HitBlocks = p.HitBlocks[:1] }, omnicache.ErrHitBlocks},
		{"hit block outside the cache", func(p *omnicache.Plan) { p.HitBlocks[1] = 99 }, omnicache.ErrPlan},
		{"arrival hit counts short", func(p *omnicache.Plan) { p.HitTokens = nil }, omnicache.ErrPlan},
		{"full hashes short", func(p *omnicache.Plan) { p.FullBlocks = []int32{2} }, omnicache.ErrPlan},
		{"full block outside the cache", func(p *omnicache.Plan) { p.FullBlocks, p.FullHashes = []int32{16}, []uint64{1} }, omnicache.ErrPlan},
		{"tier blocks without a tier", func(p *omnicache.Plan) { p.TierBlocks, p.TierHashes = []int32{1}, []uint64{7} }, omnicache.ErrConfig},
		{"tier hashes without blocks", func(p *omnicache.Plan) { p.TierHashes = []uint64{7} }, omnicache.ErrPlan},
		{"replaced not live", func(p *omnicache.Plan) { p.Replaced, p.ReplacedFrom = []int64{9}, []int32{0} }, omnicache.ErrPlan},
		{"replaced positions short", func(p *omnicache.Plan) { p.Replaced = []int64{1} }, omnicache.ErrPlan},
		{"replaced past its rows", func(p *omnicache.Plan) { p.Replaced, p.ReplacedFrom = []int64{1}, []int32{9} }, omnicache.ErrPlan},
	}
	before := c.Stats()
	for _, tc := range cases {
		p := base()
		tc.break_(p)
		err := c.Begin(p)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Begin = %v, want %v", tc.name, err, tc.want)
		}
		if err == nil {
			if err := c.Abort(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got := c.Stats(); !reflect.DeepEqual(got, before) {
			t.Errorf("%s: the refusal changed Stats:\n%+v\n%+v", tc.name, before, got)
		}
	}
	if err := c.Begin(base()); err != nil {
		t.Fatalf("the unbroken plan after the refusals: %v", err)
	}
	out := append(rows(1, 8, 1), rows(2, 8, 2)...)
	id, err = c.Save(&omnicache.Outputs{Tokens: 3, Padded: 3, Tensors: []omnicache.Tensor{{Host: out, Rows: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	var res omnicache.Result
	if err := c.Materialize(id, []int64{2}, &res); err != nil {
		t.Fatal(err)
	}
	want := append(rows(1, 0, 8), rows(2, 8, 2)...)
	if got := res.Rows(0, 0); !bytes.Equal(got, want) {
		t.Fatalf("request 2's rows after the refusals:\n got %v\nwant %v", got, want)
	}
}

// TestOutputsErrorTexts: each wrong output names its own condition, and
// only a tensor with too few rows or bytes says "too small". Each failed
// Save undoes its Begin (begun again for the next case).
func TestOutputsErrorTexts(t *testing.T) {
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: 4, Keys: []omnicache.Key{{Name: "h", RowBytes: 8}, {Name: "x", RowBytes: 4, Optional: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plan := func() *omnicache.Plan {
		return &omnicache.Plan{IDs: []int64{7}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{3}, Table: []int32{0, 1}, Stride: 2}
	}
	good := func() *omnicache.Outputs {
		return &omnicache.Outputs{Tokens: 3, Tensors: []omnicache.Tensor{{Host: make([]byte, 24), Rows: 3}, {Host: make([]byte, 12), Rows: 3}}}
	}
	for _, tc := range []struct {
		name  string
		outs  func() *omnicache.Outputs
		texts []string
	}{
		{"nil outputs", func() *omnicache.Outputs { return nil }, []string{"nil outputs"}},
		{"tensor count", func() *omnicache.Outputs { o := good(); o.Tensors = o.Tensors[:1]; return o }, []string{"1 tensors for 2 keys"}},
		{"accepted count", func() *omnicache.Outputs { o := good(); o.Accepted = []int32{4}; return o },
			[]string{"accepted count out of range", "request 7", "4 tokens accepted of 3 scheduled"}},
		{"accepted length", func() *omnicache.Outputs { o := good(); o.Accepted = []int32{1, 1}; return o },
			[]string{"2 accepted counts for 1 scheduled requests"}},
		{"omitted key", func() *omnicache.Outputs { o := good(); o.Tensors[0] = omnicache.Tensor{}; return o },
			[]string{`key "h" is required`, "omits it"}},
		{"rows", func() *omnicache.Outputs { o := good(); o.Tensors[1].Rows = 2; return o }, []string{`key "x"`, "tensor too small", "2 rows"}},
		{"bytes", func() *omnicache.Outputs { o := good(); o.Tensors[0].Host = o.Tensors[0].Host[:20]; return o },
			[]string{`key "h"`, "tensor too small", "20 bytes"}},
	} {
		if err := c.Begin(plan()); err != nil {
			t.Fatalf("%s: Begin: %v", tc.name, err)
		}
		_, err := c.Save(tc.outs())
		if !errors.Is(err, omnicache.ErrOutputs) {
			t.Fatalf("%s: %v, want ErrOutputs", tc.name, err)
		}
		msg := err.Error()
		for _, s := range tc.texts {
			if !strings.Contains(msg, s) {
				t.Errorf("%s: %q does not say %q", tc.name, msg, s)
			}
		}
		if tc.name != "rows" && tc.name != "bytes" && strings.Contains(msg, "too small") {
			t.Errorf("%s: %q says \"too small\"", tc.name, msg)
		}
	}
	if err := c.Begin(plan()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Save(good()); err != nil {
		t.Fatal(err)
	}
	var res omnicache.Result
	if err := c.Materialize(1<<40, nil, nil); !errors.Is(err, omnicache.ErrOutputs) || strings.Contains(err.Error(), "too small") ||
		!strings.Contains(err.Error(), "nil Result") {
		t.Errorf("Materialize into a nil Result: %v", err)
	}
	if err := c.Peek(0, []int32{0, 1}, make([]byte, 8)); !errors.Is(err, omnicache.ErrOutputs) || !strings.Contains(err.Error(), "too small for 2 rows") {
		t.Errorf("Peek into a short buffer: %v", err)
	}
	_ = res
}
