package gpu

import (
	"bytes"
	"errors"
	"testing"
)

func TestHostFill(t *testing.T) {
	d := NewHost()
	var _ Filler = d
	b, _ := d.Alloc(32)
	for i := range b.Host {
		b.Host[i] = 0xEE
	}
	if err := d.Fill(b, 4, 8, 0x5A); err != nil {
		t.Fatal(err)
	}
	if err := d.Fill(b, 12, 4, 0); err != nil {
		t.Fatal(err)
	}
	want := append(append(append(bytes.Repeat([]byte{0xEE}, 4), bytes.Repeat([]byte{0x5A}, 8)...),
		make([]byte, 4)...), bytes.Repeat([]byte{0xEE}, 16)...)
	if !bytes.Equal(b.Host, want) {
		t.Fatalf("after fills: %x, want %x", b.Host, want)
	}
	for _, c := range [][2]int{{30, 4}, {-1, 1}, {0, -1}} {
		if err := d.Fill(b, c[0], c[1], 1); !errors.Is(err, ErrRange) {
			t.Fatalf("Fill(%d, %d): %v, want ErrRange", c[0], c[1], err)
		}
	}
}
