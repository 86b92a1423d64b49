package gpu

import (
	"bytes"
	"errors"
	"testing"
)

func TestHostCopies(t *testing.T) {
	d := NewHost()
	src, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CopyHtoD(src, 8, []byte("omnicache")); err != nil {
		t.Fatal(err)
	}
	dst, _ := d.Alloc(64)
	if err := d.CopyDtoD(dst, 0, src, 8, 9); err != nil {
		t.Fatal(err)
	}
	host, err := d.AllocHost(9)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoH(host, dst, 0); err != nil {
		t.Fatal(err)
	}
	ev, err := d.Record()
	if err != nil || d.Wait(ev) != nil {
		t.Fatal("host events are complete when recorded")
	}
	if !bytes.Equal(host, []byte("omnicache")) {
		t.Fatalf("round trip got %q", host)
	}
	for _, err := range []error{
		d.CopyHtoD(src, 60, make([]byte, 8)),
		d.CopyDtoD(dst, -1, src, 0, 1),
		d.CopyDtoH(make([]byte, 65), src, 0),
	} {
		if !errors.Is(err, ErrRange) {
			t.Fatalf("out-of-range copy: %v, want ErrRange", err)
		}
	}
	if _, err := d.Alloc(-1); !errors.Is(err, ErrAlloc) {
		t.Fatalf("negative alloc: %v", err)
	}
	if Available {
		return
	}
	if _, err := NewCUDA(0); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("NewCUDA without the cuda tag: %v, want ErrNoCUDA", err)
	}
}
