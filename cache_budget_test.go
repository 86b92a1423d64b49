package omnicache_test

import (
	"errors"
	"testing"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// A parked decode step larger than the whole budget fails with ErrBudget,
// as the same step does with the buffer off. Budget 64 bytes, rows of 32. Step 1 prefills 4 tokens from host memory
// (no device bytes); step 2 is a pure decode step of 4 requests with
// non-owned device tensors: 128 bytes, more than the whole budget.
func TestBudgetErrorFromDecodeBuffer(t *testing.T) {
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: 4,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: 32}}, DeviceBudgetBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plan := &omnicache.Plan{IDs: []int64{1, 2, 3, 4}, Rows: []int32{0, 1, 2, 3}, Start: []int32{0, 0, 0, 0}, Count: []int32{1, 1, 1, 1},
		Table: []int32{0, 1, 2, 3}, Stride: 1, Arrivals: []int64{1, 2, 3, 4}, HitTokens: []int32{0, 0, 0, 0}}
	if err := c.Begin(plan); err != nil {
		t.Fatal(err)
	}
	id, err := c.Save(&omnicache.Outputs{Tokens: 4, Padded: 4, Tensors: []omnicache.Tensor{{Host: make([]byte, 128), Rows: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	c.Discard(id)
	plan = &omnicache.Plan{IDs: []int64{1, 2, 3, 4}, Rows: []int32{0, 1, 2, 3}, Start: []int32{1, 1, 1, 1}, Count: []int32{1, 1, 1, 1},
		Table: []int32{0, 1, 2, 3}, Stride: 1}
	if err := c.Begin(plan); err != nil {
		t.Fatal(err)
	}
	_, err = c.Save(&omnicache.Outputs{Tokens: 4, Padded: 4, Tensors: []omnicache.Tensor{{Dev: gpu.HostBuffer(make([]byte, 128)), Rows: 4}}})
	if !errors.Is(err, omnicache.ErrBudget) {
		t.Fatalf("pure decode Save over the whole budget: %v, want ErrBudget", err)
	}
}
