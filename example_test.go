package omnicache_test

import (
	"errors"
	"fmt"

	"github.com/omnicache/omnicache"
)

// An engine loop: request 1 prefills 8 tokens and decodes two more, then
// finishes; request 2 arrives with a hit on request 1's first two blocks
// and computes only its tail. Materialize hands request 2 the cached
// prefix rows followed by its own, exactly as if nothing had hit.
func Example() {
	const blockSize, rowBytes = 4, 8
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: 16,
		BlockSize: blockSize,
		Keys:      []omnicache.Key{{Name: "hidden", RowBytes: rowBytes}},
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// The engine's block table: request 1 holds blocks 0, 1 and 2;
	// request 2 is given blocks 0, 1 (the hit) and 3.
	const stride = 4
	table := []int32{
		0, 1, 2, 0, // row 0: request 1
		0, 1, 3, 0, // row 1: request 2
	}
	// rows builds a step's hidden states: token t of request id is the
	// byte id*16+t repeated.
	rows := func(id int64, start, n int) []byte {
		b := make([]byte, n*rowBytes)
		for t := 0; t < n; t++ {
			for j := 0; j < rowBytes; j++ {
				b[t*rowBytes+j] = byte(id*16 + int64(start+t))
			}
		}
		return b
	}
	var res omnicache.Result
	step := func(p *omnicache.Plan, id int64, start, n int) {
		if err := c.Begin(p); err != nil {
			panic(err)
		}
		// ... the forward runs here ...
		sid, err := c.Save(&omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{
			{Host: rows(id, start, n), Rows: n},
		}})
		if err != nil {
			panic(err)
		}
		if err := c.Materialize(sid, nil, &res); err != nil {
			panic(err)
		}
		out := res.Rows(0, 0)
		fmt.Printf("request %d: %d rows (prefix %d), first token %d, last token %d\n",
			res.ID(0), res.Tokens(0), res.Prefix(0), out[0]%16, out[len(out)-1]%16)
	}

	// Request 1 arrives without a hit and prefills 8 tokens.
	step(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8},
		Table: table, Stride: stride, Arrivals: []int64{1}, HitTokens: []int32{0}}, 1, 0, 8)
	// Two decode steps.
	for pos := 8; pos < 10; pos++ {
		step(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{int32(pos)}, Count: []int32{1},
			Table: table, Stride: stride}, 1, pos, 1)
	}
	// Request 1 finishes; request 2 arrives hitting its 8-token prefix
	// (blocks 0 and 1) and computes 3 tokens from position 8.
	step(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{8}, Count: []int32{3},
		Table: table, Stride: stride, Arrivals: []int64{2}, HitTokens: []int32{8}, HitBlocks: []int32{0, 1},
		Finished: []int64{1}}, 2, 8, 3)
	// Output:
	// request 1: 8 rows (prefix 0), first token 0, last token 7
	// request 1: 1 rows (prefix 0), first token 8, last token 8
	// request 1: 1 rows (prefix 0), first token 9, last token 9
	// request 2: 11 rows (prefix 8), first token 0, last token 10
}

// A Save that finds every staging page held by unconsumed steps fails with
// a *StagingTimeoutError naming them; consuming them frees the pages (once
// their writes landed: with a claim timeout the Save waits for that).
// A failed Save undoes its Begin: the engine begins the step again.
func ExampleStagingTimeoutError() {
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: 8, BlockSize: 4,
		Keys:                []omnicache.Key{{Name: "hidden", RowBytes: 4}},
		StagingDepth:        1,
		StagingClaimTimeout: omnicache.NoWait,
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	table := []int32{0, 1}
	plan := func(id int64) *omnicache.Plan {
		return &omnicache.Plan{IDs: []int64{id}, Rows: []int32{int32(id - 1)}, Start: []int32{0}, Count: []int32{2},
			Table: table, Stride: 1, Arrivals: []int64{id}, HitTokens: []int32{0}}
	}
	outs := &omnicache.Outputs{Tokens: 2, Padded: 2, Tensors: []omnicache.Tensor{{Host: make([]byte, 8), Rows: 2}}}

	_ = c.Begin(plan(1))
	first, _ := c.Save(outs) // holds the only page until consumed
	_ = c.Begin(plan(2))
	_, err = c.Save(outs)
	var te *omnicache.StagingTimeoutError
	if errors.As(err, &te) {
		fmt.Println("timed out; unconsumed steps:", te.Unconsumed, "still the same:", te.Unconsumed[0] == first)
	}
	_ = c.Discard(first)
	_ = c.Sync()         // the page returns once its write landed too
	_ = c.Begin(plan(2)) // the failed Save undid its Begin
	_, err = c.Save(outs)
	fmt.Println("after consuming:", err)
	// Output:
	// timed out; unconsumed steps: [1] still the same: true
	// after consuming: <nil>
}
