package replay

import (
	"strings"
	"testing"
)

// BenchmarkReplay replays a few reference workloads (scaled) through the
// real cache and reports the engine goroutine's cache time per step and the
// projected throughput change. One iteration is a whole replay.
func BenchmarkReplay(b *testing.B) {
	for _, name := range []string{"Qwen3-Omni/DEC100_c64", "MiniCPM-o/DECV_c32", "MiniCPM-o/P1024_h0_c32"} {
		var w Workload
		for _, x := range DefaultWorkloads() {
			if x.FullName() == name {
				w = x.Scaled(0.125)
			}
		}
		b.Run("workload="+strings.ReplaceAll(name, "/", "_"), func(b *testing.B) {
			var engine, steps int64
			var change float64
			for b.Loop() {
				rep, err := Replay(w.Spec(0), Options{Cache: true, Pace: true})
				if err != nil {
					b.Fatal(err)
				}
				engine += rep.EngineNsTotal
				steps += int64(rep.Steps)
				change += rep.ProjectedChange
			}
			b.ReportMetric(float64(engine)/float64(steps), "engine-ns/step")
			b.ReportMetric(100*change/float64(b.N), "throughput-%")
		})
	}
}
