package gputest

import (
	"errors"
	"github.com/omnicache/omnicache/gpu"
	"testing"
	"time"
)

func TestFaulty(t *testing.T) {
	f := NewFaulty(gpu.NewHost())
	b, _ := f.Alloc(8)
	h := make([]byte, 8)
	if err := f.CopyDtoH(h, b, 0); err != nil {
		t.Fatal("unarmed wrapper failed")
	}
	f.FailAfter(1)
	if err := f.CopyDtoD(b, 0, b, 0, 8); err != nil {
		t.Fatal("first armed copy must pass")
	}
	if err := f.CopyDtoH(h, b, 0); !errors.Is(err, gpu.ErrCopy) {
		t.Fatalf("second armed copy: %v, want gpu.ErrCopy", err)
	}
}

func TestFaultyEveryOp(t *testing.T) {
	calls := map[Op]func(f *Faulty) error{
		OpAlloc:     func(f *Faulty) error { _, err := f.Alloc(8); return err },
		OpAllocHost: func(f *Faulty) error { _, err := f.AllocHost(8); return err },
		OpCopyDtoD: func(f *Faulty) error {
			b := gpu.HostBuffer(make([]byte, 8))
			return f.CopyDtoD(b, 0, b, 0, 8)
		},
		OpCopyDtoH: func(f *Faulty) error { return f.CopyDtoH(make([]byte, 8), gpu.HostBuffer(make([]byte, 8)), 0) },
		OpCopyHtoD: func(f *Faulty) error { return f.CopyHtoD(gpu.HostBuffer(make([]byte, 8)), 0, make([]byte, 8)) },
		OpRecord:   func(f *Faulty) error { _, err := f.Record(); return err },
		OpWait:     func(f *Faulty) error { return f.Wait(0) },
	}
	for op := Op(0); op < NumOps; op++ {
		f := NewFaulty(gpu.NewHost())
		call := calls[op]
		f.FailOpAfter(op, 2)
		for i := 0; i < 2; i++ {
			if err := call(f); err != nil {
				t.Fatalf("%v: call %d failed before the fault: %v", op, i, err)
			}
		}
		err := call(f)
		if !errors.Is(err, gpu.ErrCopy) && !errors.Is(err, gpu.ErrAlloc) {
			t.Fatalf("%v: armed call returned %v, want an injected fault", op, err)
		}
		for other, c := range calls {
			if other != op {
				if err := c(f); err != nil {
					t.Fatalf("%v armed: %v failed too: %v", op, other, err)
				}
			}
		}
		f.Heal()
		if err := call(f); err != nil {
			t.Fatalf("%v: failed after Heal: %v", op, err)
		}
	}
}

func TestFaultyHang(t *testing.T) {
	f := NewFaulty(gpu.NewHost())
	before, _ := f.Record()
	f.Hang()
	ev, _ := f.Record()
	if err := f.Wait(before); err != nil {
		t.Fatal(err) // recorded before Hang: never hangs
	}
	if err := f.Wait(0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- f.Wait(ev) }()
	time.Sleep(10 * time.Millisecond) // a chance to return early (a pass can only be false, never a failure)
	select {
	case <-done:
		t.Fatal("Wait returned while the device hangs")
	default:
	}
	f.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
