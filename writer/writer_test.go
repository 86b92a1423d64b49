package writer_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/writer"
)

// TestWriteOracle writes random steps (host rows and device buffers, two
// keys, slots rewritten) and checks every slot against the last row
// written to it, after each Sync.
func TestWriteOracle(t *testing.T) {
	const nb, bs = 8, 16
	rb := []int{8, 24}
	w, err := writer.New(writer.Config{NumBlocks: nb, BlockSize: bs, RowBytes: rb, StagingRows: 64, StagingDepth: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	oracle := make([][]byte, len(rb))
	for k := range rb {
		oracle[k] = make([]byte, nb*bs*rb[k])
	}
	rng := rand.New(rand.NewPCG(1, 2))
	all := make([]int32, nb*bs)
	for i := range all {
		all[i] = int32(i)
	}
	for step := 0; step < 200; step++ {
		n := 1 + rng.IntN(64)
		slots := make([]int32, n)
		for i := range slots {
			slots[i] = int32(rng.IntN(nb * bs))
		}
		rows := make([][]byte, len(rb))
		for k := range rb {
			rows[k] = make([]byte, n*rb[k])
			for i := range rows[k] {
				rows[k][i] = byte(rng.Uint32())
			}
			for i, s := range slots {
				copy(oracle[k][int(s)*rb[k]:], rows[k][i*rb[k]:(i+1)*rb[k]])
			}
		}
		if step%2 == 0 {
			err = w.Write(slots, rows, nil)
		} else {
			err = w.Write(slots, nil, []gpu.Buffer{gpu.HostBuffer(rows[0]), gpu.HostBuffer(rows[1])})
		}
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for k := range rows { // staged: scribbling over the caller's rows changes nothing
			clear(rows[k])
		}
		if step%7 != 6 {
			continue
		}
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		for k := range rb {
			got := make([]byte, len(all)*rb[k])
			if err := w.Read(k, all, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, oracle[k]) {
				t.Fatalf("step %d key %d: mirror differs from the last rows written", step, k)
			}
		}
	}
}

// TestWriteErrors: each refusal names its sentinel and changes nothing
// (the rows read back are those of the writes before it).
func TestWriteErrors(t *testing.T) {
	for _, cfg := range []writer.Config{
		{},
		{NumBlocks: 1, BlockSize: 1},
		{NumBlocks: 1 << 20, BlockSize: 1 << 12, RowBytes: []int{1}},
		{NumBlocks: 1, BlockSize: 1, RowBytes: []int{0}},
		{NumBlocks: 1, BlockSize: 1, RowBytes: []int{1 << 24}, StagingRows: 1 << 20},
		{NumBlocks: 1, BlockSize: 1, RowBytes: []int{1}, ClaimTimeout: -1},
	} {
		if _, err := writer.New(cfg); !errors.Is(err, omnicache.ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
	w, err := writer.New(writer.Config{NumBlocks: 2, BlockSize: 2, RowBytes: []int{2}, StagingRows: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write([]int32{0, 1}, [][]byte{[]byte("aabb")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		slots []int32
		rows  [][]byte
		dev   []gpu.Buffer
		want  error
	}{
		{[]int32{4}, [][]byte{[]byte("xx")}, nil, omnicache.ErrPlan},
		{[]int32{-1}, [][]byte{[]byte("xx")}, nil, omnicache.ErrPlan},
		{[]int32{0, 1}, [][]byte{[]byte("xxx")}, nil, omnicache.ErrOutputs},
		{[]int32{0}, nil, nil, omnicache.ErrOutputs},
		{[]int32{0}, [][]byte{[]byte("xx")}, []gpu.Buffer{gpu.HostBuffer([]byte("xx"))}, omnicache.ErrOutputs},
		{[]int32{0, 1, 2}, [][]byte{[]byte("xxyyzz")}, nil, omnicache.ErrStepTooLarge},
	} {
		if err := w.Write(c.slots, c.rows, c.dev); !errors.Is(err, c.want) {
			t.Errorf("Write(%v) = %v, want %v", c.slots, err, c.want)
		}
	}
	if err := w.Read(1, []int32{0}, make([]byte, 2)); !errors.Is(err, omnicache.ErrPlan) {
		t.Errorf("Read of key 1 = %v, want ErrPlan", err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if err := w.Read(0, []int32{0, 1, 2, 3}, got); err != nil || string(got) != "aabb\x00\x00\x00\x00" {
		t.Fatalf("after the refusals: %q, %v; want the first write only", got, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write([]int32{0}, [][]byte{[]byte("xx")}, nil); !errors.Is(err, omnicache.ErrClosed) {
		t.Errorf("Write after Close = %v", err)
	}
	if err := w.Close(); !errors.Is(err, omnicache.ErrClosed) {
		t.Errorf("second Close = %v", err)
	}
}
