// Tier imports: an arrival's blocks whose KV was loaded from outside get
// their rows from the tier, fetched by an importer and written by the
// committer ahead of the step's hit read.

package tierlink

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/internal/writer"
	"github.com/omnicache/omnicache/tier"
)

// Import is one step's import: every tier block its fresh arrivals named,
// fetched in one batch. It is the write path's writer.Fetch.
type Import struct {
	l      *Link
	hashes []uint64
	blocks []int32
	reqs   []importReq
	start  time.Time

	// written by the importer, read by the committer after done
	rows  [][]byte
	fetch []error
	buf   []byte // the rows are views into it (nil: fresh values)
	done  chan struct{}
	// refs: the fetch and the committer's Applied; the last to let go
	// hands buf back to the link (a fetch that outlived Wait's timeout
	// still writes into it).
	refs atomic.Int32

	// written by the committer before applied is closed
	why     []error
	applied chan struct{}
}

type importReq struct {
	id     int64
	lo, n  int32 // its blocks in the job
	offset int32 // index of its first tier block among its hit blocks
}

// Failure is a request of a step whose import lost a block.
type Failure struct {
	QI      int // the request's index in the ids Failures was given
	Request int64
	// Index is the block's position in the request's hit blocks; Block its
	// local block id; Hash its chained hash.
	Index int
	Block int32
	Hash  uint64
	Err   error
}

// NoteImport records arrival id's tier blocks, the last len(hashes) of its
// hit blocks hit, in the begun step's import; rest is the tier block
// counts of the plan's arrivals from this one on (they size the import).
// Engine goroutine.
func (l *Link) NoteImport(id int64, hit []int32, hashes []uint64, rest []int32) {
	n := len(hashes)
	if n == 0 {
		return
	}
	e := &l.eng
	if e.imp == nil {
		// sized for the plan's tier blocks from here on: one allocation
		// each, not a growth per arrival
		more := 0
		for _, m := range rest {
			more += int(m)
		}
		e.imp = &Import{l: l, done: make(chan struct{}), applied: make(chan struct{}),
			reqs: make([]importReq, 0, len(rest)), blocks: make([]int32, 0, more), hashes: make([]uint64, 0, more)}
	}
	j := e.imp
	j.reqs = append(j.reqs, importReq{id: id, lo: int32(len(j.blocks)), n: int32(n), offset: int32(len(hit) - n)})
	j.blocks = append(j.blocks, hit[len(hit)-n:]...)
	j.hashes = append(j.hashes, hashes...)
}

// StartImport hands the begun step's import to an importer and queues it
// to the committer of p, ahead of the step's hit read. It never blocks:
// with every importer busy and their queue full, the import fails at once.
// Engine goroutine.
func (l *Link) StartImport(p *writer.Path) {
	j := l.eng.imp
	if j == nil {
		return
	}
	j.start = time.Now()
	j.refs.Store(2)
	select {
	case l.fetchQ <- j:
	default:
		j.fetch = make([]error, len(j.blocks))
		for b := range j.fetch {
			j.fetch[b] = fmt.Errorf("%w: the importers are busy", tier.ErrUnavailable)
		}
		close(j.done)
	}
	p.PushImport(j.blocks, j)
}

// fetch runs on an importer goroutine.
func (l *Link) fetch(j *Import) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.ImportTimeout)
	var buf []byte
	select {
	case buf = <-l.fetchBufs:
	default:
	}
	j.rows, j.fetch, j.buf = l.t.FetchInto(ctx, j.hashes, buf) // views into the values: the import only reads them
	cancel()
	if j.buf == nil && buf != nil {
		l.keepBuf(buf) // not used (nothing found, or a store that allocates)
	}
	close(j.done)
	j.release()
}

// release lets go of j's buffer for one of its two holders: once both did
// (the fetch ended, the committer applied or skipped the rows), no one
// reads the rows any more.
func (j *Import) release() {
	if j.refs.Add(-1) == 0 && j.buf != nil {
		j.l.keepBuf(j.buf)
		j.rows, j.buf = nil, nil
	}
}

// keepBuf offers buf to the next fetches (dropped when each importer has
// one).
func (l *Link) keepBuf(buf []byte) {
	select {
	case l.fetchBufs <- buf[:0]:
	default:
	}
}

// Wait implements writer.Fetch (on the committer): the fetched rows, or a
// timeout for every block when the fetch did not finish in time.
func (j *Import) Wait() ([][]byte, []error) {
	cfg := &j.l.cfg
	left := cfg.ImportTimeout + cfg.ImportTimeout/2 - time.Since(j.start)
	t := time.NewTimer(max(left, 0))
	defer t.Stop()
	var cause error
	select {
	case <-j.done:
		return j.rows, append([]error(nil), j.fetch...)
	case <-t.C:
		cause = fmt.Errorf("%w: the fetch did not finish within %v", tier.ErrUnavailable, cfg.ImportTimeout)
	case <-j.l.t.CircuitOpened():
		// A tier call ran out of its time: the store hangs, and this fetch
		// with it. Give up now rather than hold every write queued behind
		// this import on the committer until the timeout (the requests
		// recompute the blocks).
		select {
		case <-j.done:
			return j.rows, append([]error(nil), j.fetch...)
		default:
		}
		cause = fmt.Errorf("the fetch was still waiting: %w", tier.ErrCircuitOpen)
	}
	why := make([]error, len(j.blocks))
	for b := range why {
		why[b] = cause
	}
	return nil, why
}

// Applied implements writer.Fetch (on the committer).
func (j *Import) Applied(why []error, failed bool) {
	j.why = why
	l := j.l
	ev := Event{Blocks: len(j.blocks), Latency: time.Since(j.start)}
	l.importTime.Observe(int64(ev.Latency))
	for _, err := range why {
		if err != nil || failed {
			ev.Failed++
			continue
		}
		for k := 0; k < l.cfg.NKeys; k++ {
			ev.Bytes += int64(l.t.BlockBytes(k))
		}
	}
	l.imported.Add(int64(ev.Blocks - ev.Failed))
	l.importFailed.Add(int64(ev.Failed))
	l.bytesImp.Add(ev.Bytes)
	j.release() // the committer copied the rows (or skipped them)
	close(j.applied)
	if l.cfg.OnImport != nil {
		l.cfg.OnImport(ev)
	}
}

// Saved attaches the begun step's import (if any) to the saved step id and
// ends the step for the publishing side (see Unbegin). Engine goroutine.
func (l *Link) Saved(id uint64) {
	e := &l.eng
	e.begun = false
	if e.imp != nil {
		l.mu.Lock()
		l.byStep[id] = e.imp
		l.imports.Add(1)
		l.mu.Unlock()
		e.imp = nil
	}
}

// Take removes step id's import (nil when none). Any goroutine.
func (l *Link) Take(id uint64) *Import {
	if l.imports.Load() == 0 {
		return nil // no saved step has an import waiting: no lock taken
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	j, ok := l.byStep[id]
	if ok {
		delete(l.byStep, id)
		l.imports.Add(-1)
	}
	return j
}

// Failures waits (bounded by twice ImportTimeout) until the import is in
// the mirror, waking the committer first (prog; the import may have been
// handed over lazily), and returns the requests of ids (a step's, in the
// order the caller reads them) that lost a block: nil when none did. The
// consumer's goroutine.
func (j *Import) Failures(prog *writer.Progress, ids []int64) []Failure {
	timeout := 2 * j.l.cfg.ImportTimeout
	timedOut := false
	select {
	case <-j.applied:
		j.l.importWait.Observe(0)
	default:
		t0 := time.Now()
		t := time.NewTimer(timeout)
		prog.Kick()
		select {
		case <-j.applied:
		case <-t.C:
			timedOut = true // the committer is behind: fail the imports' requests
		}
		t.Stop()
		j.l.importWait.Observe(int64(time.Since(t0)))
	}
	var out []Failure
	for qi, id := range ids {
		for _, r := range j.reqs {
			if r.id != id {
				continue
			}
			for b := r.lo; b < r.lo+r.n; b++ {
				var err error
				switch {
				case timedOut:
					err = fmt.Errorf("%w: the import was not applied within %v", tier.ErrUnavailable, timeout)
				case j.why[b] != nil:
					err = j.why[b]
				}
				if err != nil {
					out = append(out, Failure{QI: qi, Request: id, Index: int(r.offset + b - r.lo), Block: j.blocks[b], Hash: j.hashes[b], Err: err})
					break
				}
			}
		}
	}
	return out
}
