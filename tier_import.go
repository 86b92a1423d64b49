// Tier imports: an arrival's blocks whose KV was loaded from outside get
// their rows from the tier, fetched by an importer and written by the
// committer ahead of the step's hit read.

package omnicache

import (
	"context"
	"fmt"
	"time"

	"github.com/omnicache/omnicache/tier"
)

// importJob is one step's import: every tier block its fresh arrivals
// named, fetched in one batch.
type importJob struct {
	tl     *tierLink
	hashes []uint64
	blocks []int32
	reqs   []importReq
	start  time.Time

	// written by the importer, read by the committer after done
	rows  [][]byte
	fetch []error
	done  chan struct{}

	// written by the committer before applied is closed
	why     []error
	applied chan struct{}
}

type importReq struct {
	id     int64
	lo, n  int32 // its blocks in the job
	offset int32 // index of its first tier block among its hit blocks
}

// noteImport records arrival i's tier blocks (the last n of its hit
// blocks, hit) in the begun step's import. Engine goroutine.
func (c *Cache) noteImport(p *Plan, i int, hit []int32, tierLo int) {
	n := int(p.TierBlocks[i])
	if n == 0 {
		return
	}
	e := &c.te
	if e.imp == nil {
		// sized for the plan's tier blocks from here on: one allocation
		// each, not a growth per arrival
		tot := 0
		for _, m := range p.TierBlocks[i:] {
			tot += int(m)
		}
		e.imp = &importJob{tl: c.tl, done: make(chan struct{}), applied: make(chan struct{}),
			reqs: make([]importReq, 0, len(p.Arrivals)-i), blocks: make([]int32, 0, tot), hashes: make([]uint64, 0, tot)}
	}
	j := e.imp
	j.reqs = append(j.reqs, importReq{id: p.Arrivals[i], lo: int32(len(j.blocks)), n: int32(n), offset: int32(len(hit) - n)})
	j.blocks = append(j.blocks, hit[len(hit)-n:]...)
	j.hashes = append(j.hashes, p.TierHashes[tierLo:tierLo+n]...)
}

// startImport hands the begun step's import to an importer and queues it
// to the committer, ahead of the step's hit read. It never blocks: with
// every importer busy and their queue full, the import fails at once.
func (c *Cache) startImport() {
	j := c.te.imp
	if j == nil {
		return
	}
	j.start = time.Now()
	select {
	case c.tl.fetchQ <- j:
	default:
		j.fetch = make([]error, len(j.blocks))
		for b := range j.fetch {
			j.fetch[b] = fmt.Errorf("%w: the importers are busy", tier.ErrUnavailable)
		}
		close(j.done)
	}
	c.path.PushImport(j.blocks, j)
}

// fetch runs on an importer goroutine.
func (tl *tierLink) fetch(j *importJob) {
	ctx, cancel := context.WithTimeout(context.Background(), tl.cfg.ImportTimeout)
	j.rows, j.fetch = tl.t.Fetch(ctx, j.hashes) // views into the values: the import only reads them
	cancel()
	close(j.done)
}

// Wait implements writer.Fetch (on the committer): the fetched rows, or a
// timeout for every block when the fetch did not finish in time.
func (j *importJob) Wait() ([][]byte, []error) {
	left := j.tl.cfg.ImportTimeout + j.tl.cfg.ImportTimeout/2 - time.Since(j.start)
	t := time.NewTimer(max(left, 0))
	defer t.Stop()
	var cause error
	select {
	case <-j.done:
		return j.rows, append([]error(nil), j.fetch...)
	case <-t.C:
		cause = fmt.Errorf("%w: the fetch did not finish within %v", tier.ErrUnavailable, j.tl.cfg.ImportTimeout)
	case <-j.tl.t.CircuitOpened():
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
func (j *importJob) Applied(why []error, failed bool) {
	j.why = why
	tl := j.tl
	ev := ImportEvent{Blocks: len(j.blocks), Latency: time.Since(j.start)}
	for _, err := range why {
		if err != nil || failed {
			ev.Failed++
			continue
		}
		for k := 0; k < tl.nkeys; k++ {
			ev.Bytes += int64(tl.t.BlockBytes(k))
		}
	}
	tl.imported.Add(int64(ev.Blocks - ev.Failed))
	tl.importFailed.Add(int64(ev.Failed))
	tl.bytesImp.Add(ev.Bytes)
	close(j.applied)
	if tl.cfg.OnImport != nil {
		tl.cfg.OnImport(ev)
	}
}

// failImports waits (bounded) for step id's import, then fails in dst
// every request whose import lost a block.
func (c *Cache) failImports(j *importJob, dst *Result) {
	t := time.NewTimer(c.tl.cfg.ImportTimeout * 2)
	defer t.Stop()
	timedOut := false
	c.path.Kick() // the import may have been handed over lazily
	select {
	case <-j.applied:
	case <-t.C:
		timedOut = true // the committer is behind: fail the imports' requests
	}
	for qi, id := range dst.ids {
		for _, r := range j.reqs {
			if r.id != id {
				continue
			}
			for b := r.lo; b < r.lo+r.n; b++ {
				var err error
				switch {
				case timedOut:
					err = fmt.Errorf("%w: the import was not applied within %v", tier.ErrUnavailable, 2*c.tl.cfg.ImportTimeout)
				case j.why[b] != nil:
					err = j.why[b]
				}
				if err != nil {
					dst.fail(qi, &TierImportError{Request: id, Index: int(r.offset + b - r.lo), Block: j.blocks[b], Hash: j.hashes[b], Err: err})
					break
				}
			}
		}
	}
}
