//go:build cuda

package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/omnicache/omnicache/gpu"
)

// newCUDA opens device 0 or skips the test (no GPU, no driver: the case on
// machines without CUDA, CI included).
func newCUDA(tb testing.TB, opt gpu.CUDAOptions) *gpu.CUDA {
	tb.Helper()
	d, err := gpu.NewCUDAWith(0, opt)
	if err != nil {
		if !errors.Is(err, gpu.ErrNoDevice) {
			tb.Fatalf("NewCUDA: %v (want an ErrNoDevice when there is no device)", err)
		}
		tb.Skipf("no CUDA device: %v", err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return d.(*gpu.CUDA)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131+i>>8) ^ seed
	}
	return b
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func sync0(tb testing.TB, d gpu.Device) {
	tb.Helper()
	ev, err := d.Record()
	must(tb, err)
	must(tb, d.Wait(ev))
}

func TestCUDANoDeviceIsAnError(t *testing.T) {
	if _, err := gpu.NewCUDA(-1); !errors.Is(err, gpu.ErrNoDevice) {
		t.Fatalf("NewCUDA(-1): %v, want ErrNoDevice", err)
	}
	if !gpu.Available {
		t.Fatal("Available is false in a cuda build")
	}
}

func TestCUDARoundTrip(t *testing.T) {
	for _, opt := range []gpu.CUDAOptions{{}, {SyncAlloc: true}} {
		t.Run(fmt.Sprintf("syncalloc=%v", opt.SyncAlloc), func(t *testing.T) {
			d := newCUDA(t, opt)
			t.Logf("device %d, alloc %s", d.Ordinal(), d.AllocMode())
			for _, n := range []int{1, 7, 4096, 1<<20 + 3, 33 << 20} {
				a, err := d.Alloc(n + 64)
				must(t, err)
				b, err := d.Alloc(n + 128)
				must(t, err)
				src := pattern(n, byte(n))
				// host → a at offset 5, a → b at offset 77, b → pinned and pageable.
				must(t, d.CopyHtoD(a, 5, src))
				must(t, d.CopyDtoD(b, 77, a, 5, n))
				pin, err := d.AllocHost(n)
				must(t, err)
				page := make([]byte, n)
				must(t, d.CopyDtoH(pin, b, 77))
				must(t, d.CopyDtoH(page, b, 77))
				sync0(t, d)
				if !bytes.Equal(pin, src) {
					t.Fatalf("n=%d: pinned round trip differs", n)
				}
				if !bytes.Equal(page, src) {
					t.Fatalf("n=%d: pageable round trip differs", n)
				}
				// A partial window, read from the middle.
				if n > 16 {
					win := make([]byte, n/2)
					must(t, d.CopyDtoH(win, b, 77+n/4))
					sync0(t, d)
					if !bytes.Equal(win, src[n/4:n/4+n/2]) {
						t.Fatalf("n=%d: window differs", n)
					}
				}
				// Overwrite part of a and check the DtoD copy kept the old bytes.
				must(t, d.CopyHtoD(a, 5, make([]byte, n)))
				must(t, d.CopyDtoH(pin, b, 77))
				sync0(t, d)
				if !bytes.Equal(pin, src) {
					t.Fatalf("n=%d: clone changed with its source", n)
				}
				d.FreeHost(pin)
				d.Free(a)
				d.Free(b)
			}
		})
	}
}

func TestCUDAHostBuffers(t *testing.T) {
	// Host memory used as a Buffer (the cache does this for owned host
	// tensors of deferred keys).
	d := newCUDA(t, gpu.CUDAOptions{})
	src := pattern(1000, 3)
	hb := gpu.HostBuffer(append([]byte(nil), src...))
	dev, err := d.Alloc(1000)
	must(t, err)
	defer d.Free(dev)
	must(t, d.CopyDtoD(dev, 0, hb, 0, 1000))
	out := gpu.HostBuffer(make([]byte, 1000))
	must(t, d.CopyDtoD(out, 0, dev, 0, 1000))
	got := make([]byte, 10)
	must(t, d.CopyDtoH(got, out, 990)) // host → host after the stream drained
	if !bytes.Equal(got, src[990:]) || !bytes.Equal(out.Host, src) {
		t.Fatal("host-buffer copies differ")
	}
	must(t, d.CopyHtoD(out, 0, make([]byte, 10)))
	if !bytes.Equal(out.Host[:10], make([]byte, 10)) {
		t.Fatal("CopyHtoD into a host buffer did not land")
	}
}

func TestCUDARangeErrors(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	a, err := d.Alloc(100)
	must(t, err)
	defer d.Free(a)
	h := make([]byte, 10)
	for name, err := range map[string]error{
		"dtoh past end":       d.CopyDtoH(h, a, 91),
		"dtoh negative off":   d.CopyDtoH(h, a, -1),
		"htod past end":       d.CopyHtoD(a, 95, h),
		"dtod dst past end":   d.CopyDtoD(a, 95, a, 0, 10),
		"dtod src past end":   d.CopyDtoD(a, 0, a, 91, 10),
		"dtod negative n":     d.CopyDtoD(a, 0, a, 0, -1),
		"zero buffer":         d.CopyDtoH(h, gpu.Buffer{}, 0),
		"overflowing offset":  d.CopyDtoH(h, a, int(^uint(0)>>1)),
		"unrecorded event":    d.Wait(1 << 40),
		"host buffer too big": d.CopyDtoH(h, gpu.HostBuffer(make([]byte, 5)), 0),
	} {
		if !errors.Is(err, gpu.ErrRange) {
			t.Errorf("%s: %v, want ErrRange", name, err)
		}
	}
	if _, err := d.Alloc(-1); !errors.Is(err, gpu.ErrAlloc) {
		t.Errorf("Alloc(-1): %v", err)
	}
	if _, err := d.AllocHost(-1); !errors.Is(err, gpu.ErrAlloc) {
		t.Errorf("AllocHost(-1): %v", err)
	}
	if _, err := d.Alloc(1 << 50); !errors.Is(err, gpu.ErrAlloc) {
		t.Errorf("Alloc(1 PiB): %v, want ErrAlloc", err)
	} else {
		t.Logf("Alloc(1 PiB): %v", err)
	}
	// Zero-length operations are no-ops.
	z, err := d.Alloc(0)
	must(t, err)
	must(t, d.CopyDtoH(nil, z, 0))
	must(t, d.CopyDtoD(z, 0, a, 100, 0))
	d.Free(z)
	// The device still works.
	must(t, d.CopyHtoD(a, 90, h))
	sync0(t, d)
}

func TestCUDAEvents(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	must(t, d.Wait(0))
	const n = 64 << 20
	a, err := d.Alloc(n)
	must(t, err)
	defer d.Free(a)
	pin, err := d.AllocHost(n)
	must(t, err)
	defer d.FreeHost(pin)
	src := pattern(n, 9)
	must(t, d.CopyHtoD(a, 0, src))
	var last gpu.Event
	var evs []gpu.Event
	for i := 0; i < 300; i++ { // more records than live events: handles are recycled
		must(t, d.CopyDtoH(pin[i*4096:(i+1)*4096], a, i*4096))
		ev, err := d.Record()
		must(t, err)
		if ev <= last {
			t.Fatalf("event handles not increasing: %d after %d", ev, last)
		}
		last = ev
		evs = append(evs, ev)
	}
	// The whole 64 MiB, then one event: waiting on it means every byte landed.
	clear(pin)
	must(t, d.CopyDtoH(pin, a, 0))
	ev, err := d.Record()
	must(t, err)
	// Several goroutines wait on the same event, and on old ones.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.Wait(ev); err != nil {
				errs <- err
			}
			for _, e := range evs[g*30 : g*30+30] {
				if err := d.Wait(e); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !bytes.Equal(pin, src) {
		t.Fatal("bytes not there after Wait")
	}
	must(t, d.Wait(evs[0])) // long recycled
}

func TestCUDAConcurrentCopies(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	const (
		workers = 8
		rounds  = 40
		size    = 1<<20 + 17
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := func() error {
				a, err := d.Alloc(size)
				if err != nil {
					return err
				}
				defer d.Free(a)
				pin, err := d.AllocHost(size)
				if err != nil {
					return err
				}
				defer d.FreeHost(pin)
				for r := 0; r < rounds; r++ {
					b, err := d.Alloc(size) // alloc/free churn from many goroutines
					if err != nil {
						return err
					}
					src := pattern(size, byte(w*rounds+r))
					off := (w*7 + r) % 13
					if err := d.CopyHtoD(a, 0, src); err != nil {
						return err
					}
					if err := d.CopyDtoD(b, off, a, 0, size-off); err != nil {
						return err
					}
					if err := d.CopyDtoH(pin[:size-off], b, off); err != nil {
						return err
					}
					ev, err := d.Record()
					if err != nil {
						return err
					}
					d.Free(b) // stream-ordered: after the copy
					if err := d.Wait(ev); err != nil {
						return err
					}
					if !bytes.Equal(pin[:size-off], src[:size-off]) {
						return fmt.Errorf("worker %d round %d: bytes differ", w, r)
					}
				}
				return nil
			}()
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// AllocHost memory is pinned, copies round-trip through it, and FreeHost
// gives it back, with both ways of pinning (registered huge pages, the
// default; cuMemHostAlloc) and sizes below, at and off a huge page.
func TestCUDAPinned(t *testing.T) {
	for _, opt := range []gpu.CUDAOptions{{}, {HostAlloc: true}} {
		t.Run(fmt.Sprintf("hostalloc=%v", opt.HostAlloc), func(t *testing.T) {
			d := newCUDA(t, opt)
			// 20 MiB + 4099: a page registered in chunks, copies crossing
			// two chunk boundaries.
			for _, n := range []int{4096, 8 << 20, 3<<20 + 4096 + 17, 20<<20 + 4099} {
				p, err := d.AllocHost(n)
				must(t, err)
				if len(p) != n {
					t.Fatalf("AllocHost(%d): %d bytes", n, len(p))
				}
				if !d.IsPinned(p) {
					t.Fatalf("AllocHost(%d) memory is not pinned", n)
				}
				if d.IsPinned(make([]byte, 4096)) {
					t.Fatal("Go memory reported as pinned")
				}
				src := pattern(len(p), byte(n))
				copy(p, src)
				a, err := d.Alloc(len(p))
				must(t, err)
				must(t, d.CopyHtoD(a, 0, p))
				sync0(t, d) // the pinned source must stay put until the copy completed
				clear(p)
				must(t, d.CopyDtoH(p, a, 0))
				sync0(t, d)
				d.Free(a)
				if !bytes.Equal(p, src) {
					t.Fatalf("pinned round trip of %d bytes differs", n)
				}
				d.FreeHost(p)
			}
			z, err := d.AllocHost(0)
			must(t, err)
			d.FreeHost(z)
			d.FreeHost(make([]byte, 10)) // not ours: ignored
		})
	}
}

// Check accepts a buffer inside its allocation and rejects one whose size
// runs past it (or that names no allocation), with both allocators.
func TestCUDACheck(t *testing.T) {
	for _, opt := range []gpu.CUDAOptions{{}, {SyncAlloc: true}} {
		t.Run(fmt.Sprintf("sync=%v", opt.SyncAlloc), func(t *testing.T) {
			d := newCUDA(t, opt)
			defer d.Close()
			b, err := d.Alloc(1 << 20)
			must(t, err)
			defer d.Free(b)
			must(t, d.Check(b))
			inner := gpu.Buffer{Ptr: b.Ptr + 4096, Size: 4096}
			must(t, d.Check(inner))
			over := b
			over.Size = b.Size + (64 << 20) // far past any rounding of the allocation
			if err := d.Check(over); !errors.Is(err, gpu.ErrRange) {
				t.Fatalf("Check of a buffer past its allocation: %v, want ErrRange", err)
			}
			if err := d.Check(gpu.Buffer{Size: 8}); !errors.Is(err, gpu.ErrRange) {
				t.Fatalf("Check of a buffer with no memory: %v, want ErrRange", err)
			}
			if err := d.Check(gpu.HostBuffer(make([]byte, 8))); err != nil {
				t.Fatalf("Check of a host-backed buffer: %v", err)
			}
		})
	}
}

// WaitFor with no time left returns ErrTimeout for a copy still in flight
// (the event stays pending and can be waited for again), and nil once it
// completes; an event known complete costs nothing.
func TestCUDAWaitFor(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	defer d.Close()
	const n = 1 << 30 // ~20 ms at pinned bandwidth: still in flight microseconds after the Record
	a, err := d.Alloc(n)
	must(t, err)
	defer d.Free(a)
	pin, err := d.AllocHost(n)
	must(t, err)
	defer d.FreeHost(pin)
	must(t, d.CopyDtoH(pin, a, 0))
	must(t, d.CopyDtoH(pin, a, 0))
	ev, err := d.Record()
	must(t, err)
	if err := d.WaitFor(ev, 0); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("WaitFor(0) of two 1 GiB copies just issued: %v, want ErrTimeout", err)
	}
	must(t, d.WaitFor(ev, time.Minute))
	must(t, d.WaitFor(ev, 0)) // complete: no wait
	must(t, d.Wait(ev))
}

// CopyDtoHBatch lands every copy exactly, in one batch when the driver has
// cuMemcpyBatchAsync (destinations in AllocHost memory), one by one when a
// destination is Go memory or a source host memory; a bad span fails
// before anything is issued.
func TestCUDACopyBatch(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	const n = 48
	page, err := d.AllocHost(n * 5000)
	must(t, err)
	defer d.FreeHost(page)
	var dst [][]byte
	var src []gpu.Buffer
	var want [][]byte
	for i := range n {
		size := 1 + (i*977)%4999 // odd sizes, one of them tiny
		if i == 7 {
			size = 0 // an empty copy is skipped
		}
		b, err := d.Alloc(max(size, 1))
		must(t, err)
		defer d.Free(b)
		w := pattern(size, byte(i))
		if size > 0 {
			must(t, d.CopyHtoD(b, 0, w))
		}
		dst = append(dst, page[i*5000:i*5000+size])
		src = append(src, gpu.Buffer{Ptr: b.Ptr, Size: size})
		want = append(want, w)
	}
	sync0(t, d)
	before := d.BatchedCopies()
	must(t, d.CopyDtoHBatch(dst, src))
	sync0(t, d)
	for i := range dst {
		if !bytes.Equal(dst[i], want[i]) {
			t.Fatalf("copy %d of the batch differs", i)
		}
	}
	t.Logf("batched copies: %d (0: the driver has no cuMemcpyBatchAsync)", d.BatchedCopies()-before)

	// A Go-memory destination: one by one, still exact.
	clear(page)
	goMem := make([]byte, len(dst[3]))
	mixed := append([][]byte{goMem}, dst[4:9]...)
	must(t, gpu.CopyDtoHAll(d, mixed, append([]gpu.Buffer{src[3]}, src[4:9]...)))
	sync0(t, d)
	if !bytes.Equal(goMem, want[3]) || !bytes.Equal(dst[5], want[5]) {
		t.Fatal("unbatched copies differ")
	}

	// Copies straddling the chunk boundaries of a page registered in
	// chunks (8 MiB), batched and single.
	big, err := d.AllocHost(17 << 20)
	must(t, err)
	defer d.FreeHost(big)
	srcBig, err := d.Alloc(len(big))
	must(t, err)
	defer d.Free(srcBig)
	wantBig := pattern(len(big), 99)
	must(t, d.CopyHtoD(srcBig, 0, wantBig))
	sync0(t, d)
	var bd [][]byte
	var bs []gpu.Buffer
	ranges := [][2]int{{8<<20 - 1000, 8<<20 + 3000}, {16<<20 - 5, 16<<20 + 5}, {9 << 20, 15 << 20}, {4096, 8 << 20 >> 1}}
	for _, r := range ranges {
		bd = append(bd, big[r[0]:r[1]])
		bs = append(bs, gpu.Buffer{Ptr: srcBig.Ptr + uintptr(r[0]), Size: r[1] - r[0]})
	}
	must(t, d.CopyDtoHBatch(bd, bs))
	sync0(t, d)
	for _, r := range ranges {
		if !bytes.Equal(big[r[0]:r[1]], wantBig[r[0]:r[1]]) {
			t.Fatalf("batched copy [%d,%d) across chunk boundaries differs", r[0], r[1])
		}
	}
	clear(big)
	must(t, d.CopyDtoH(big[8<<20-7:16<<20+9], srcBig, 8<<20-7))
	sync0(t, d)
	if !bytes.Equal(big[8<<20-7:16<<20+9], wantBig[8<<20-7:16<<20+9]) || big[8<<20-8] != 0 {
		t.Fatal("a copy across chunk boundaries differs")
	}

	// A source span past its buffer: ErrRange, nothing copied.
	clear(page)
	bad := append([]gpu.Buffer(nil), src[:3]...)
	bad[2].Size = len(dst[2]) - 1
	if err := d.CopyDtoHBatch(dst[:3], bad); !errors.Is(err, gpu.ErrRange) {
		t.Fatalf("bad span: %v, want ErrRange", err)
	}
	sync0(t, d)
	if !bytes.Equal(dst[0], make([]byte, len(dst[0]))) {
		t.Fatal("a failed batch copied rows")
	}
}

// TestCUDASpareReuse: a pooled buffer Free gave back is handed out again by
// an Alloc of its size (spares: at most 4 a size), and the stream orders a
// reused buffer's next use after its last one: copies out of the buffers,
// issued just before Free, read the old bytes although the reused buffers
// are overwritten at once; Close frees the spares.
func TestCUDASpareReuse(t *testing.T) {
	d := newCUDA(t, gpu.CUDAOptions{})
	if d.AllocMode() != "pool" {
		t.Fatalf("alloc mode %s: this device has no memory pools", d.AllocMode())
	}
	const n, count = 3<<20 + 5, 6
	var bufs, again []gpu.Buffer
	old := map[uintptr]bool{}
	var pins [][]byte
	for i := 0; i < count; i++ {
		b, err := d.Alloc(n)
		must(t, err)
		must(t, d.CopyHtoD(b, 0, pattern(n, byte(i))))
		bufs = append(bufs, b)
		old[b.Ptr] = true
	}
	for _, b := range bufs {
		pin, err := d.AllocHost(n)
		must(t, err)
		must(t, d.CopyDtoH(pin, b, 0))
		pins = append(pins, pin)
		d.Free(b) // its copy out may still be queued
	}
	reused := 0
	for i := 0; i < count; i++ {
		b, err := d.Alloc(n)
		must(t, err)
		if old[b.Ptr] {
			reused++
		}
		must(t, d.CopyHtoD(b, 0, pattern(n, byte(100+i))))
		again = append(again, b)
	}
	sync0(t, d)
	if reused < 4 {
		t.Fatalf("%d of %d buffers reused, want the 4 spares at least", reused, count)
	}
	for i, pin := range pins {
		if !bytes.Equal(pin, pattern(n, byte(i))) {
			t.Fatalf("buffer %d: the copy out issued before Free read overwritten bytes", i)
		}
		d.FreeHost(pin)
	}
	page := make([]byte, n)
	for i, b := range again {
		must(t, d.CopyDtoH(page, b, 0))
		sync0(t, d)
		if !bytes.Equal(page, pattern(n, byte(100+i))) {
			t.Fatalf("reused buffer %d reads back wrong", i)
		}
		d.Free(b)
	}
}
