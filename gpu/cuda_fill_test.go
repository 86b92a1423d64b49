//go:build cuda

package gpu_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/omnicache/omnicache/gpu"
)

// TestCUDAFill: a memset on the stream lands exactly in its range, after
// the copy issued before it and before the copy issued after it.
func TestCUDAFill(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	var f gpu.Filler = d
	const n = 1 << 20
	b, err := d.Alloc(n)
	must(t, err)
	defer d.Free(b)
	src := pattern(n, 7)
	must(t, d.CopyHtoD(b, 0, src))
	must(t, f.Fill(b, 4096, 8192, 0x5A))
	must(t, f.Fill(b, n-3, 3, 0))
	got, err := d.AllocHost(n)
	must(t, err)
	defer d.FreeHost(got)
	must(t, d.CopyDtoH(got, b, 0))
	sync0(t, d)
	want := append([]byte(nil), src...)
	copy(want[4096:4096+8192], bytes.Repeat([]byte{0x5A}, 8192))
	copy(want[n-3:], []byte{0, 0, 0})
	if !bytes.Equal(got, want) {
		i := 0
		for i < n && got[i] == want[i] {
			i++
		}
		t.Fatalf("first difference at byte %d: got %#x, want %#x", i, got[i], want[i])
	}
	if err := f.Fill(b, n-1, 2, 1); !errors.Is(err, gpu.ErrRange) {
		t.Fatalf("fill past the end: %v, want ErrRange", err)
	}
	h := gpu.HostBuffer(make([]byte, 16))
	must(t, f.Fill(h, 2, 4, 9))
	if !bytes.Equal(h.Host, []byte{0, 0, 9, 9, 9, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("host-memory buffer fill: %v", h.Host)
	}
}
