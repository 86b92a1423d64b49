package replay

import (
	"errors"
	"strings"
	"testing"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// The device-output path on the host device: gpu.NewHost's device buffers
// are Go memory, so the ring, the fill, the hand-over of owned buffers and
// their return through Device.Free run here as they do on CUDA.

func rowBytesOf(keys []omnicache.Key) int {
	n := 0
	for _, k := range keys {
		n += k.RowBytes
	}
	return n
}

// TestVerifyRealCacheDeviceOutputs: the forward's outputs in device
// buffers, the oracle's rows copied host→device, every materialized row
// and the mirror checked, in every buffer mode, with preemption (tiny
// pool) and without, the steps' rows staged or copied straight into the
// mirror (MirrorDirect).
func TestVerifyRealCacheDeviceOutputs(t *testing.T) {
	spec := small().Spec(3)
	for _, kv := range []int{0, 16} {
		for _, owned := range []bool{true, false} {
			for _, mode := range []int{0, 1, 2} { // buffer on, off; off and direct
				buffer, direct := mode == 0, mode == 2
				o := Options{Cache: true, Verify: true, NotOwned: !owned, KVBlocks: kv, MaxBatchedTokens: 128,
					DisableDecodeBuffer: !buffer, MirrorDirect: direct, Pace: true, Device: gpu.NewHost(), DeviceOutputs: true}
				rep, err := Replay(spec, o)
				if err != nil {
					t.Fatalf("kv=%d owned=%v buffer=%v: %v", kv, owned, buffer, err)
				}
				if rep.VerifiedRows == 0 || rep.HitTokens == 0 || (kv > 0 && rep.Preemptions == 0) {
					t.Fatalf("kv=%d: %d rows, %d hits, %d preemptions", kv, rep.VerifiedRows, rep.HitTokens, rep.Preemptions)
				}
				if rep.Device != "host" || rep.Outputs != "device" {
					t.Fatalf("device %q outputs %q", rep.Device, rep.Outputs)
				}
				// Every computed row left the device once into a staging
				// page (hit reads of rows in transit may copy more).
				if min := rep.ComputedTokens * int64(rowBytesOf(spec.Keys)); rep.DtoHBytes < min {
					t.Fatalf("owned=%v buffer=%v: %d device→host bytes, want at least %d", owned, buffer, rep.DtoHBytes, min)
				}
				if rep.PinnedBytes == 0 {
					t.Fatal("no staging memory allocated")
				}
				wantBufs := len(spec.Keys)
				if owned {
					wantBufs *= omnicache.DefaultStagingDepth + DefaultBlockSize + 4
				}
				if rep.OutputBuffers < wantBufs || (!owned && rep.OutputBuffers != wantBufs) {
					t.Fatalf("owned=%v: %d output buffers, want %d", owned, rep.OutputBuffers, wantBufs)
				}
			}
		}
	}
}

// dropHtoD loses every host→device copy: the device buffers keep the
// previous step's rows.
type dropHtoD struct{ *gpu.Host }

func (dropHtoD) CopyHtoD(gpu.Buffer, int, []byte) error { return nil }

// TestVerifyCatchesStaleDeviceRows: --verify checks the rows that reached
// the device, not the host rows it computed.
func TestVerifyCatchesStaleDeviceRows(t *testing.T) {
	_, err := Replay(small().Spec(3), Options{Cache: true, Verify: true, MaxBatchedTokens: 128,
		Device: dropHtoD{gpu.NewHost()}, DeviceOutputs: true})
	if !errors.Is(err, ErrVerify) {
		t.Fatalf("lost host→device copies: %v, want ErrVerify", err)
	}
}

// noFill is a device without gpu.Filler.
type noFill struct{ gpu.Device }

func TestDeviceOutputsNeedFiller(t *testing.T) {
	_, err := Replay(small().Spec(3), Options{Cache: true, Device: noFill{gpu.NewHost()}, DeviceOutputs: true})
	if err == nil || !strings.Contains(err.Error(), "cannot fill") {
		t.Fatalf("device without Fill: %v", err)
	}
	// Memset outputs (no --verify) on a device that has it.
	rep, err := Replay(small().Spec(3), Options{Cache: true, Device: gpu.NewHost(), DeviceOutputs: true, MaxBatchedTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RowsWritten == 0 || rep.DtoHBytes < rep.ComputedTokens*int64(rowBytesOf(small().Keys)) {
		t.Fatalf("%d rows written, %d device→host bytes", rep.RowsWritten, rep.DtoHBytes)
	}
}

// keepFree loses the cache's Free calls, as a cache that leaked owned
// device tensors would.
type keepFree struct{ gpu.Device }

func (keepFree) Free(gpu.Buffer) {}

// TestOwnedOutputsMustComeBack: owned device buffers the cache never frees
// fail the run (and the ring grows meanwhile instead of reusing them).
func TestOwnedOutputsMustComeBack(t *testing.T) {
	leaky := func(cfg omnicache.Config) (Cache, error) {
		cfg.Device = keepFree{cfg.Device}
		return NewRealCache(cfg)
	}
	rep, err := Replay(small().Spec(3), Options{Cache: true, Device: gpu.NewHost(), DeviceOutputs: true,
		MaxBatchedTokens: 128, NewCache: leaky})
	if !errors.Is(err, errOutputsHeld) {
		t.Fatalf("leaked owned buffers: %v, want errOutputsHeld", err)
	}
	if rep.OutputBuffers <= len(small().Keys)*(omnicache.DefaultStagingDepth+DefaultBlockSize+4) {
		t.Fatalf("ring did not grow: %d buffers", rep.OutputBuffers)
	}
}

func TestDeviceOutputsPut(t *testing.T) {
	o, err := newDeviceOutputs(gpu.NewHost(), []int{8, 4}, 16, true, 2)
	if err != nil {
		t.Fatal(err)
	}
	ts := make([]omnicache.Tensor, 2)
	if err := o.take(ts, 16); err != nil {
		t.Fatal(err)
	}
	if !ts[0].Owned || ts[0].Rows != 16 || ts[1].Dev.Size != 64 {
		t.Fatalf("tensors %+v", ts)
	}
	if o.outstanding() != 2 || o.put(gpu.HostBuffer(make([]byte, 8))) {
		t.Fatal("a foreign buffer was taken back")
	}
	if !o.put(ts[0].Dev) || !o.put(ts[1].Dev) || o.outstanding() != 0 {
		t.Fatal("ring buffers not taken back")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a buffer freed twice was taken back twice")
		}
	}()
	o.put(ts[0].Dev)
}

// TestHold: the forward is held for the model step time, capped.
func TestHold(t *testing.T) {
	const holdMax = 50_000 // ns
	rep, err := Replay(small().Spec(3), Options{Cache: true, Device: gpu.NewHost(), DeviceOutputs: true,
		MaxBatchedTokens: 128, Hold: true, HoldMax: holdMax, KeepSamples: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ForwardHoldNs < int64(rep.Steps)*holdMax || rep.ForwardHoldMax != holdMax {
		t.Fatalf("held %dns over %d steps, max %d", rep.ForwardHoldNs, rep.Steps, rep.ForwardHoldMax)
	}
	for i, s := range rep.Samples {
		if s.HoldNs < holdMax {
			t.Fatalf("step %d held %dns, want at least %d", i, s.HoldNs, holdMax)
		}
	}
	off, err := Replay(small().Spec(3), Options{Cache: true, MaxBatchedTokens: 128})
	if err != nil || off.ForwardHoldNs != 0 {
		t.Fatalf("no hold: held %dns, %v", off.ForwardHoldNs, err)
	}
}

func TestDeviceTableAndFirstRequestTarget(t *testing.T) {
	rep, err := Replay(small().Spec(3), Options{Cache: true, Device: gpu.NewHost(), DeviceOutputs: true, MaxBatchedTokens: 128})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteDeviceTable(&b, []*Report{rep}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"test/P96_h50_c4", "device", bytesStr(rep.DtoHBytes), bytesStr(rep.PinnedBytes),
		"worst first request", "target <= 50.0ms: ok"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("device table lacks %q:\n%s", want, b.String())
		}
	}
	slow := *rep
	slow.FirstRequestNs = 60e6
	if m := Check([]*Report{&slow}).Missed; len(m) != 1 || !strings.Contains(m[0], "first request 60.0ms") {
		t.Fatalf("missed: %q", m)
	}
	slow.Outputs = "host" // the target is a GPU run's
	if m := Check([]*Report{&slow}).Missed; len(m) != 0 {
		t.Fatalf("host run checked against the GPU first-request target: %q", m)
	}
}
