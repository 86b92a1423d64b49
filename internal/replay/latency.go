// Projected per-request latency: time to first token, end to end and time
// to first packet, from the step-cost model's per-step times.

package replay

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay/sim"
)

// latency follows every request over the projected clock of a run: the
// clock advances by each step's projected time (the step-cost model's
// t(step), plus with the cache on the engine goroutine's cache time of the
// step and the output goroutine's backlog, as the throughput projection
// counts them). Requests are indexed by ID-1 (the simulator numbers them
// from 1 in arrival order).
type latency struct {
	clock     float64   // projected ns at the end of the last step
	ends      []float64 // projected end of each step
	arrive    []float64
	firstStep []int32 // the request's first scheduled step
	hit       []bool  // its first step's rows come through Materialize
	first     []float64
	last      []float64
	// mat is the Materialize time per step index (cache on).
	mat map[int]int64
}

// step advances the clock by ns for step st (after its forward: the
// requests' sampled tokens are known) and records its requests' times.
func (l *latency) step(st *sim.Step, ns float64) {
	l.clock += ns
	l.ends = append(l.ends, l.clock)
	for _, r := range st.Reqs {
		i := int(r.ID - 1)
		for len(l.arrive) <= i {
			l.arrive = append(l.arrive, 0)
			l.firstStep = append(l.firstStep, -1)
			l.hit = append(l.hit, false)
			l.first = append(l.first, -1)
			l.last = append(l.last, -1)
		}
		if l.firstStep[i] < 0 {
			l.firstStep[i] = int32(st.Index)
			l.hit[i] = r.ArrivalHit > 0
			if r.Sent > 0 {
				l.arrive[i] = l.ends[r.Sent-1]
			}
		}
		if l.first[i] < 0 && r.Generated() >= 1 {
			l.first[i] = l.clock
		}
		if l.last[i] < 0 && r.Generated() >= r.OutputLen {
			l.last[i] = l.clock
		}
	}
}

// materialized records the Materialize time of step index.
func (l *latency) materialized(index int, ns int64) {
	if l.mat == nil {
		l.mat = map[int]int64{}
	}
	l.mat[index] = ns
}

// Latency is a distribution's nearest-rank percentiles, in ns.
type Latency struct{ P50, P90, P99 int64 }

func percentiles(v []int64) Latency {
	s := slices.Clone(v)
	slices.Sort(s)
	return Latency{percentile(s, 0.50), percentile(s, 0.90), percentile(s, 0.99)}
}

// fill sets the report's latency fields; downstream adds the time to
// first packet.
func (l *latency) fill(rep *Report, downstream bool) {
	var ttft, e2e, ttfp []int64
	for i := range l.arrive {
		if l.first[i] < 0 || l.last[i] < 0 {
			continue // not finished (a failed run)
		}
		ttft = append(ttft, int64(l.first[i]-l.arrive[i]))
		e2e = append(e2e, int64(l.last[i]-l.arrive[i]))
		if downstream {
			t := l.ends[l.firstStep[i]]
			if l.hit[i] {
				t += float64(l.mat[int(l.firstStep[i])])
			}
			ttfp = append(ttfp, int64(t-l.arrive[i]))
		}
	}
	if len(ttft) == 0 {
		return
	}
	rep.TTFTs = ttft
	t, e := percentiles(ttft), percentiles(e2e)
	rep.TTFTP50, rep.TTFTP90, rep.TTFTP99 = t.P50, t.P90, t.P99
	rep.E2EP50, rep.E2EP90, rep.E2EP99 = e.P50, e.P90, e.P99
	if l.first[0] >= 0 {
		rep.FirstRequestTTFTNs = int64(l.first[0] - l.arrive[0])
		if rep.Cache == "on" {
			// The cache's start-up: New and the first step's Begin and
			// Save, outside the clock (as outside the throughput).
			rep.FirstRequestTTFTNs += rep.FirstRequestNs
		}
	}
	if downstream {
		p := percentiles(ttfp)
		rep.TTFPP50, rep.TTFPP90, rep.TTFPP99 = p.P50, p.P90, p.P99
	}
}

// resetPeakRSS resets the process's VmHWM to its current RSS (Linux 4.0+,
// clear_refs 5), so that a run's peak is its own; where it cannot, the
// peak is the process's since it started.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// processRSS is the process's VmRSS and VmHWM in bytes (Linux; 0, 0
// elsewhere).
func processRSS() (rss, peak int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak
}

func keyRowBytesSum(keys []omnicache.Key) int {
	n := 0
	for _, k := range keys {
		n += k.RowBytes
	}
	return n
}

// WriteScaleTable prints start-up and memory per workload: the KV pool,
// the mirror's address space and what of it is resident, the cache's New
// and first request (New + the first step's Begin and Save), the first
// request's projected time to first token off and on, and the process's
// RSS and peak RSS at the end of the cache-on run.
func WriteScaleTable(w io.Writer, reps []*Report) error {
	fmt.Fprintln(w, "start-up and memory (cache on; first req ttft: projected, with the cache's start-up):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tkv pool\tmirror\tresident\tNew\tfirst req\tfirst ttft off\ton\tproc RSS\tpeak\t")
	for _, run := range pairRuns(reps) {
		r := run.on
		if r == nil {
			continue
		}
		off := "-"
		if run.off != nil {
			off = dur(float64(run.off.FirstRequestTTFTNs))
		}
		fmt.Fprintf(tw, "%s\t%d×%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", shortName(run.name), r.KVBlocks, r.BlockSize,
			bytesStr(r.MirrorReservedBytes), bytesStr(r.MirrorResidentBytes), dur(float64(r.NewNs)),
			dur(float64(r.FirstRequestNs)), off, dur(float64(r.FirstRequestTTFTNs)), bytesStr(r.ProcessRSSBytes),
			bytesStr(r.ProcessPeakRSSBytes))
	}
	return tw.Flush()
}
