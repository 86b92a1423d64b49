package replay

import (
	"errors"
	"testing"

	"github.com/omnicache/omnicache/gpu"
)

// TestVerifyOnCUDA: the device-output replay under --verify on CUDA device
// 0, in every buffer mode (owned buffers handed over and taken back, or one
// engine buffer the cache clones device→device), with the decode buffer on
// and off, the steps' device rows staged or copied straight into the mirror
// (MirrorDirect), and preemption in a tiny pool. It skips without the cuda tag or
// without a GPU (CI); make gpu-test builds it into .gpu/replay.test.
func TestVerifyOnCUDA(t *testing.T) {
	d, err := gpu.NewCUDA(0)
	if errors.Is(err, gpu.ErrNoCUDA) || errors.Is(err, gpu.ErrNoDevice) {
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	spec := small().Spec(3)
	for _, kv := range []int{0, 16} {
		for _, owned := range []bool{true, false} {
			for _, buffer := range []bool{true, false} {
				for _, direct := range []bool{false, true} {
					rep, err := Replay(spec, Options{Cache: true, Verify: true, NotOwned: !owned, KVBlocks: kv,
						MaxBatchedTokens: 128, DisableDecodeBuffer: !buffer, MirrorDirect: direct, Pace: true, Device: d,
						DeviceOutputs: true, Hold: true, HoldMax: 100_000})
					if err != nil {
						t.Fatalf("kv=%d owned=%v buffer=%v direct=%v: %v", kv, owned, buffer, direct, err)
					}
					if rep.VerifiedRows == 0 || rep.HitTokens == 0 || rep.Device != "cuda:0" || rep.StagingWaits == 0 {
						t.Fatalf("kv=%d owned=%v buffer=%v direct=%v: %d rows, %d hit tokens, device %q, %d waits",
							kv, owned, buffer, direct, rep.VerifiedRows, rep.HitTokens, rep.Device, rep.StagingWaits)
					}
				}
			}
		}
	}
	// Device memset outputs (no --verify).
	if _, err := Replay(spec, Options{Cache: true, MaxBatchedTokens: 128, Device: d, DeviceOutputs: true}); err != nil {
		t.Fatal(err)
	}
}
