package replay

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/omnicache/omnicache/internal/replay/sim"
)

// StepCost is the model's step time as a function of what the step computes
// (sim.Work):
//
//	t(step) = A + B·prefill_tokens + C·Σ(chunk_len × context_len) + D·decode_seqs
//
// in nanoseconds. Prefill tokens are the tokens the engine computes: a prefix
// hit is not scheduled, so it costs nothing. The parameters are fitted per
// model (Fit) to the reference's cache-off throughputs over the simulator's
// cache-off schedules of the reference workloads, and embedded in the
// workload table as `cost` lines.
type StepCost struct {
	// Model names what the parameters were fitted for ("" for a constant
	// step time).
	Model string
	// A is per step, B per prefill token, C per chunk×context token pair, D
	// per decoding request; all ≥ 0.
	A, B, C, D float64
}

// ConstantStep is the step cost of a model whose every step takes d.
func ConstantStep(d time.Duration) StepCost { return StepCost{A: float64(d.Nanoseconds())} }

// IsZero reports a cost that prices nothing (no cost line, no step time).
func (c StepCost) IsZero() bool { return c.A == 0 && c.B == 0 && c.C == 0 && c.D == 0 }

// Ns is the model time of work w (one step or many summed).
func (c StepCost) Ns(w sim.Work) float64 {
	return c.A*float64(w.Steps) + c.B*float64(w.PrefillTokens) + c.C*float64(w.Attention) + c.D*float64(w.DecodeSeqs)
}

// params and fromParams order the parameters as features() does.
func (c StepCost) params() [numParams]float64 { return [numParams]float64{c.A, c.B, c.C, c.D} }

func fromParams(model string, p [numParams]float64) StepCost {
	return StepCost{Model: model, A: p[0], B: p[1], C: p[2], D: p[3]}
}

const numParams = 4

// features is w in parameter order.
func features(w sim.Work) [numParams]float64 {
	return [numParams]float64{float64(w.Steps), float64(w.PrefillTokens), float64(w.Attention), float64(w.DecodeSeqs)}
}

// String is the `cost` line of the workload table.
func (c StepCost) String() string {
	return fmt.Sprintf("cost %s %.6g %.6g %.6g %.6g", c.Model, c.A, c.B, c.C, c.D)
}

// Describe is the cost in words, with units.
func (c StepCost) Describe() string {
	if c.B == 0 && c.C == 0 && c.D == 0 {
		return fmt.Sprintf("constant %s a step", dur(c.A))
	}
	return fmt.Sprintf("%s + %s·prefill_tokens + %s·Σ(chunk_len×context_len) + %s·decode_seqs",
		fineDur(c.A), fineDur(c.B), fineDur(c.C), fineDur(c.D))
}

// fineDur is dur with three significant digits below a microsecond.
func fineDur(ns float64) string {
	if ns > 0 && ns < 1e3 {
		return fmt.Sprintf("%.3gns", ns)
	}
	return dur(ns)
}

func parseCost(f []string) (StepCost, error) {
	if len(f) != 6 {
		return StepCost{}, fmt.Errorf("want `cost model a_ns b_ns c_ns d_ns`")
	}
	var p [numParams]float64
	for i := range p {
		v, err := strconv.ParseFloat(f[2+i], 64)
		if err != nil || !(v >= 0) || math.IsInf(v, 0) {
			return StepCost{}, fmt.Errorf("bad cost parameter %q: want a finite number >= 0", f[2+i])
		}
		p[i] = v
	}
	return fromParams(f[1], p), nil
}

// FitRow is one workload of a fit.
type FitRow struct {
	Name    string
	Prompts int
	// Work is the simulator's cache-off schedule of the full-size workload.
	Work sim.Work
	// RefReqPerSec is the reference's cache-off throughput; ModelReqPerSec
	// is prompts / Cost.Ns(Work); Error is ModelReqPerSec/RefReqPerSec - 1.
	RefReqPerSec   float64
	ModelReqPerSec float64
	Error          float64
}

// ModelFit is the step cost fitted for one model and how well it fits.
type ModelFit struct {
	Cost StepCost
	Rows []FitRow
}

// MaxError is the largest |Error| over the rows.
func (f *ModelFit) MaxError() float64 {
	m := 0.0
	for _, r := range f.Rows {
		m = max(m, math.Abs(r.Error))
	}
	return m
}

// Fit fits a StepCost per model (in table order) to the reference's
// cache-off throughputs: over the rows of a model it minimises, with every
// parameter ≥ 0, the squared relative error of the projected throughput,
// Σ (T_ref/T_model − 1)², with T_ref = prompts / ref_req_per_s_off and
// T_model = Σ_steps t(step) over the simulator's cache-off schedule (no
// prefix caching: every prompt token computed) of the full-size workload
// under o's engine options (block size, token budget, KV pool). See
// fitRelative. The result depends only on the table and o: it is
// reproducible bit for bit on one platform.
func Fit(ws []Workload, o Options) ([]ModelFit, error) {
	var fits []ModelFit
	index := map[string]int{}
	for _, w := range ws {
		if w.Field != nil {
			continue // generated, no reference to fit
		}
		i, ok := index[w.Model]
		if !ok {
			i = len(fits)
			index[w.Model] = i
			fits = append(fits, ModelFit{Cost: StepCost{Model: w.Model}})
		}
		sch, err := Simulate(w.Spec(0), o, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.FullName(), err)
		}
		fits[i].Rows = append(fits[i].Rows, FitRow{Name: w.FullName(), Prompts: w.Prompts, Work: sch.Work,
			RefReqPerSec: w.Ref.ReqPerSecOff})
	}
	for i := range fits {
		f := &fits[i]
		a := make([][]float64, len(f.Rows))
		for r, row := range f.Rows {
			tRef := float64(row.Prompts) / row.RefReqPerSec * 1e9
			x := features(row.Work)
			a[r] = make([]float64, numParams)
			for j := range x {
				a[r][j] = x[j] / tRef
			}
		}
		p, err := fitRelative(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Cost.Model, err)
		}
		f.Cost = fromParams(f.Cost.Model, p)
		for r := range f.Rows {
			row := &f.Rows[r]
			row.ModelReqPerSec = float64(row.Prompts) / (f.Cost.Ns(row.Work) / 1e9)
			row.Error = row.ModelReqPerSec/row.RefReqPerSec - 1
		}
	}
	return fits, nil
}

// FormatFit prints the fits: per model its parameters, its `cost` line and
// per row the model's and the reference's cache-off throughput.
func FormatFit(fits []ModelFit) string {
	var b strings.Builder
	for i, f := range fits {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s: t(step) = %s\n", f.Cost.Model, f.Cost.Describe())
		fmt.Fprintf(&b, "  %s\n", f.Cost)
		fmt.Fprintf(&b, "  %-26s %7s %9s %10s %9s %9s %9s %9s %8s\n", "workload", "prompts", "steps", "prefill", "attn", "decodes",
			"model", "ref", "error")
		for _, r := range f.Rows {
			fmt.Fprintf(&b, "  %-26s %7d %9d %10d %9.3g %9d %9.2f %9.2f %+7.1f%%\n", r.Name, r.Prompts, r.Work.Steps,
				r.Work.PrefillTokens, float64(r.Work.Attention), r.Work.DecodeSeqs, r.ModelReqPerSec, r.RefReqPerSec, 100*r.Error)
		}
		fmt.Fprintf(&b, "  max |error| %.1f%% over %d rows (model and ref in req/s, cache off)\n", 100*f.MaxError(), len(f.Rows))
	}
	return b.String()
}

// fitRelative returns p ≥ 0 minimising Σ_r (1/(a_r·p) − 1)², the relative
// throughput error when a_r·p is T_model/T_ref. Since 1/m − 1 = (m − 1)/m, it
// iterates weighted non-negative least squares, Σ ((a_r·p − 1)/m_r)² with m_r
// the previous iterate's a_r·p, from the unweighted solution to its fixed
// point (a few tens of iterations; at most fitIterations).
func fitRelative(a [][]float64) ([numParams]float64, error) {
	var p [numParams]float64
	b := make([]float64, len(a))
	for i := range b {
		b[i] = 1
	}
	x, err := nnls(a, b)
	if err != nil {
		return p, err
	}
	aw := make([][]float64, len(a))
	for it := 0; it < fitIterations; it++ {
		for i, row := range a {
			m := 0.0
			for j := range row {
				m += row[j] * x[j]
			}
			if !(m > 0) {
				return p, fmt.Errorf("fit: a workload costs nothing under %v", x)
			}
			aw[i] = make([]float64, len(row))
			for j := range row {
				aw[i][j] = row[j] / m
			}
			b[i] = 1 / m
		}
		next, err := nnls(aw, b)
		if err != nil {
			return p, err
		}
		done := true
		for j := range x {
			if math.Abs(next[j]-x[j]) > 1e-13*math.Abs(next[j]) {
				done = false
			}
		}
		x = next
		if done {
			break
		}
	}
	copy(p[:], x)
	return p, nil
}

const fitIterations = 200

// nnls solves min ‖a·x − b‖² subject to x ≥ 0 (Lawson and Hanson, "Solving
// Least Squares Problems", ch. 23), with the columns scaled to unit norm for
// the solve.
func nnls(a [][]float64, b []float64) ([]float64, error) {
	m := len(a)
	if m == 0 {
		return nil, fmt.Errorf("nnls: no rows")
	}
	n := len(a[0])
	scale := make([]float64, n)
	for j := range n {
		for i := range m {
			scale[j] += a[i][j] * a[i][j]
		}
		scale[j] = math.Sqrt(scale[j])
		if scale[j] == 0 {
			scale[j] = 1
		}
	}
	as := make([][]float64, m)
	for i := range m {
		as[i] = make([]float64, n)
		for j := range n {
			as[i][j] = a[i][j] / scale[j]
		}
	}
	x := make([]float64, n)
	passive := make([]bool, n)
	const tol = 1e-12
	grad := func() []float64 { // aᵀ(b − a·x)
		r := make([]float64, m)
		for i := range m {
			r[i] = b[i]
			for j := range n {
				r[i] -= as[i][j] * x[j]
			}
		}
		w := make([]float64, n)
		for j := range n {
			for i := range m {
				w[j] += as[i][j] * r[i]
			}
		}
		return w
	}
	for iter := 0; iter < 3*n+10; iter++ {
		w := grad()
		t := -1
		for j := range n {
			if !passive[j] && w[j] > tol && (t < 0 || w[j] > w[t]) {
				t = j
			}
		}
		if t < 0 {
			break
		}
		passive[t] = true
		for inner := 0; ; inner++ {
			if inner > 3*n {
				return nil, fmt.Errorf("nnls: no convergence")
			}
			z, err := lstsq(as, b, passive)
			if err != nil {
				return nil, err
			}
			feasible := true
			for j := range n {
				if passive[j] && z[j] <= 0 {
					feasible = false
				}
			}
			if feasible {
				copy(x, z)
				break
			}
			alpha := math.Inf(1)
			for j := range n {
				if passive[j] && z[j] <= 0 {
					alpha = min(alpha, x[j]/(x[j]-z[j]))
				}
			}
			for j := range n {
				x[j] += alpha * (z[j] - x[j])
				if passive[j] && x[j] <= tol {
					passive[j], x[j] = false, 0
				}
			}
		}
	}
	for j := range x {
		x[j] /= scale[j]
	}
	return x, nil
}

// lstsq solves the unconstrained least squares problem over the columns cols
// marks (Householder QR); the other entries of the result are 0.
func lstsq(a [][]float64, b []float64, cols []bool) ([]float64, error) {
	m := len(a)
	var idx []int
	for j, c := range cols {
		if c {
			idx = append(idx, j)
		}
	}
	k := len(idx)
	if k > m {
		return nil, fmt.Errorf("nnls: %d parameters over %d rows", k, m)
	}
	q := make([][]float64, m) // m×k working copy, reduced to R in place
	for i := range m {
		q[i] = make([]float64, k)
		for c, j := range idx {
			q[i][c] = a[i][j]
		}
	}
	y := append([]float64(nil), b...)
	for c := range k {
		norm := 0.0
		for i := c; i < m; i++ {
			norm += q[i][c] * q[i][c]
		}
		norm = math.Sqrt(norm)
		if norm == 0 {
			return nil, fmt.Errorf("nnls: rank-deficient features")
		}
		if q[c][c] > 0 {
			norm = -norm
		}
		v := make([]float64, m)
		v[c] = q[c][c] - norm
		for i := c + 1; i < m; i++ {
			v[i] = q[i][c]
		}
		vv := 0.0
		for i := c; i < m; i++ {
			vv += v[i] * v[i]
		}
		apply := func(col func(i int) *float64) {
			d := 0.0
			for i := c; i < m; i++ {
				d += v[i] * *col(i)
			}
			f := 2 * d / vv
			for i := c; i < m; i++ {
				*col(i) -= f * v[i]
			}
		}
		for cc := c; cc < k; cc++ {
			apply(func(i int) *float64 { return &q[i][cc] })
		}
		apply(func(i int) *float64 { return &y[i] })
	}
	z := make([]float64, k)
	for c := k - 1; c >= 0; c-- {
		s := y[c]
		for cc := c + 1; cc < k; cc++ {
			s -= q[c][cc] * z[cc]
		}
		if math.Abs(q[c][c]) < 1e-14 {
			return nil, fmt.Errorf("nnls: rank-deficient features")
		}
		z[c] = s / q[c][c]
	}
	x := make([]float64, len(cols))
	for c, j := range idx {
		x[j] = z[c]
	}
	return x, nil
}
