package mirror

import (
	"context"
	"math/bits"
	"runtime/pprof"
	"sync"
	"sync/atomic"
)

// DefaultSplitBytes is the smallest copy WriteSplit and ReadSplit hand to
// workers: below it, waking parked goroutines costs about as much as the
// copy they would take over, and the committer's split scatters compete
// with the engine goroutine for the host's caches. A decode step of 64
// rows of 4 KiB (256 KiB) stays on the calling goroutine: split, it makes
// BenchmarkStep shape=decode64/row=4096 no faster on a many-core host and
// the engine goroutine's time per step (engine-ns/op) longer, while
// BenchmarkSplit shows where a lone copy of that size would gain.
const DefaultSplitBytes = 1 << 20

// partBytes is the least a part of a split copy moves (a work item's size),
// unless the split size is below 4 parts (tests force splits on small
// copies).
const partBytes = 64 << 10

// minSplitRow: scatters of smaller rows are never split (each part scans
// every slot of the call; see WriteSplit).
const minSplitRow = 512

// Workers is a fixed set of long-lived goroutines (pprof label
// omnicache=copy-worker) that large row copies are split across. The
// goroutine asking for a copy always copies a share itself and returns once
// every part is in, so a copy makes progress whatever the workers do: when
// they are busy with another copy, or stopped, the caller copies the rest.
// Nothing is allocated per copy in steady state (finished jobs are kept
// for reuse; a job is handed over as a pointer on a buffered channel).
//
// One Workers may serve any number of goroutines at once (the committer's
// scatters and any number of readers' gathers): they share its goroutines,
// so the number of goroutines copying at any moment is bounded by
// N()-1 plus the callers themselves.
type Workers struct {
	n         int // goroutines a copy is split across, the caller included
	splitB    int
	partB     int
	jobs      chan *job
	mu        sync.RWMutex // guards stopped against sends on jobs
	stopped   bool
	running   sync.WaitGroup
	freeMu    sync.Mutex
	free      []*job // jobs to reuse
	splitRuns atomic.Int64
}

// NewWorkers starts n-1 goroutines, so that a large copy is split n ways
// (the caller's included). n <= 1 starts none: every copy runs on its
// caller, exactly as Write and Read. splitBytes is the smallest copy that
// is split (<= 0: DefaultSplitBytes).
func NewWorkers(n, splitBytes int) *Workers {
	if splitBytes <= 0 {
		splitBytes = DefaultSplitBytes
	}
	w := &Workers{n: max(1, n), splitB: splitBytes, partB: max(1, min(partBytes, splitBytes/4))}
	if w.n > 1 {
		w.jobs = make(chan *job, 4*(w.n-1))
		w.running.Add(w.n - 1)
		for i := 1; i < w.n; i++ {
			go pprof.Do(context.Background(), pprof.Labels("omnicache", "copy-worker"), func(context.Context) { w.loop() })
		}
	}
	return w
}

// N is the number of goroutines a large copy is split across (1: none).
func (w *Workers) N() int {
	if w == nil {
		return 1
	}
	return w.n
}

// SplitBytes is the smallest copy that is split.
func (w *Workers) SplitBytes() int {
	if w == nil {
		return DefaultSplitBytes
	}
	return w.splitB
}

// Splits counts the copies that were split so far (tests, benchmarks).
func (w *Workers) Splits() int64 {
	if w == nil {
		return 0
	}
	return w.splitRuns.Load()
}

// Stop ends the goroutines once they have finished the parts handed to
// them; copies asked for afterwards run on their callers. Idempotent.
func (w *Workers) Stop() {
	if w == nil || w.jobs == nil {
		return
	}
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	close(w.jobs)
	w.mu.Unlock()
	w.running.Wait()
}

func (w *Workers) loop() {
	defer w.running.Done()
	for j := range w.jobs {
		if j.work(nil) {
			j.fin <- struct{}{} // the caller waits for the last part
		}
		w.release(j)
	}
}

// job is one split copy: parts are claimed with an atomic counter by the
// caller and by every worker it was handed to. The caller waits for the
// parts, not for the workers: a worker that takes the job up after every
// part was claimed finds nothing to do and only drops its reference (refs:
// the job is reused once the caller and every worker handed it are done
// with it), so a copy never waits for a worker to wake up.
type job struct {
	m     *Mirror
	slots []int32
	buf   []byte
	src   []byte // a plain copy into buf (Copy): parts of per bytes
	write bool
	parts int
	per   int  // read: rows per part
	gsh   uint // write: log2(rows per slot group)
	next  atomic.Int64
	poll  func() // the caller's, between its parts (WriteSplitPoll)

	done atomic.Int64  // parts finished
	refs atomic.Int32  // the caller and the workers handed the job, until each is done with it
	fin  chan struct{} // cap 1: the worker that finishes the last part tells the caller
}

// work copies parts until none is left unclaimed, and reports whether it
// finished the last part.
func (j *job) work(poll func()) (last bool) {
	for {
		p := int(j.next.Add(1) - 1)
		if p >= j.parts {
			return false
		}
		if poll != nil && p > 0 {
			poll()
		}
		switch {
		case j.src != nil:
			lo := p * j.per
			hi := min(lo+j.per, len(j.buf))
			copy(j.buf[lo:hi], j.src[lo:hi])
		case j.write:
			j.m.writePart(j.slots, j.buf, p, j.parts, j.gsh)
		default:
			lo := p * j.per
			hi := min(lo+j.per, len(j.slots))
			rb := j.m.rowBytes
			j.m.Read(j.buf[lo*rb:hi*rb], j.slots[lo:hi])
		}
		if j.done.Add(1) == int64(j.parts) {
			return true
		}
	}
}

// run splits j into parts, hands it to up to parts-1 workers, works on it
// too and returns once every part is done: the parts the workers took are
// waited for, the workers that had not started by the time every part was
// claimed are not.
func (w *Workers) run(j *job) {
	w.splitRuns.Add(1)
	j.next.Store(0)
	j.done.Store(0)
	j.refs.Store(1)
	w.mu.RLock()
	if !w.stopped {
		for i := 1; i < min(w.n, j.parts); i++ {
			j.refs.Add(1)
			select {
			case w.jobs <- j:
				continue
			default:
				j.refs.Add(-1)
			}
			break
		}
	}
	w.mu.RUnlock()
	if !j.work(j.poll) {
		// A worker finishes the last part (every part was claimed, some by
		// workers): it sends exactly once.
		<-j.fin
	}
	w.release(j)
}

// release drops a reference to j; the last one makes it reusable. Once
// every part is done nobody reads the copy's buffers any more: the fields
// are cleared so that a reusable job holds no memory alive.
func (w *Workers) release(j *job) {
	if j.refs.Add(-1) != 0 {
		return
	}
	j.m, j.slots, j.buf, j.src, j.poll = nil, nil, nil, nil, nil
	w.freeMu.Lock()
	w.free = append(w.free, j)
	w.freeMu.Unlock()
}

// Copy copies src into dst (min of both lengths), split across w when it
// is large (at least the split size, w with more than one goroutine). Any
// goroutine; w may be nil.
func (w *Workers) Copy(dst, src []byte) {
	n := min(len(dst), len(src))
	if w.N() <= 1 || n < w.splitB {
		copy(dst, src)
		return
	}
	j := w.getJob()
	parts := min(4*w.n, max(1, n/w.partB))
	j.per = (n + parts - 1) / parts
	j.per = (j.per + 63) &^ 63 // whole cache lines a part
	j.buf, j.src = dst[:n], src[:n]
	j.parts = (n + j.per - 1) / j.per
	w.run(j)
}

// getJob reuses a finished job or makes one: there are never more jobs than
// copies that ran at once.
func (w *Workers) getJob() *job {
	w.freeMu.Lock()
	defer w.freeMu.Unlock()
	if n := len(w.free); n > 0 {
		j := w.free[n-1]
		w.free = w.free[:n-1]
		return j
	}
	return &job{fin: make(chan struct{}, 1)}
}

// WriteSplit is Write, split across w when the copy is large (at least the
// split size, rows of at least 512 bytes, w with more than one goroutine).
// It first makes every chunk the rows land in, then each part writes the
// rows of its own slot groups (64 KiB of consecutive slots, or whole chunks
// when the call made chunks, dealt round robin to the parts), scanning every slot of the call: a slot that repeats is written
// by one part, in call order, so the last of its rows still wins. Writer
// goroutine only; w may be nil.
func (m *Mirror) WriteSplit(w *Workers, slots []int32, rows []byte) {
	m.WriteSplitPoll(w, slots, rows, nil)
}

// WriteSplitPoll is WriteSplit that calls poll, on the calling goroutine,
// between the parts of a split write that it copies itself (poll may be
// nil): the committer issues the next queued write's device copies from it,
// so that they run while this write is scattered rather than after it.
func (m *Mirror) WriteSplitPoll(w *Workers, slots []int32, rows []byte, poll func()) {
	rb := m.rowBytes
	if w.N() <= 1 || len(rows) < w.splitB || rb < minSplitRow {
		m.Write(slots, rows)
		return
	}
	if len(rows) != len(slots)*rb {
		panicLen("WriteSplit", len(rows), len(slots), rb)
	}
	res := m.resident.Load()
	for _, s := range slots {
		if s >= 0 {
			m.writable(s)
		}
	}
	j := w.getJob()
	j.m, j.slots, j.buf, j.write, j.poll = m, slots, rows, true, poll
	// One part per goroutine: each part scans every slot.
	j.parts = min(w.n, max(1, len(rows)/w.partB))
	j.gsh = 0
	switch {
	case m.resident.Load() != res:
		// New chunks: deal whole chunks, so that each is first touched by
		// one goroutine (two faulting the same huge page would both zero
		// it, and one would throw its page away).
		j.gsh = m.rowShift
	case rb < partBytes:
		j.gsh = uint(bits.Len(uint(partBytes/rb)) - 1)
	}
	w.run(j)
}

// writePart writes the rows whose slot group (s>>gsh) is p modulo parts,
// round robin so that consecutive slots spread evenly. Every chunk exists
// (WriteSplit made them before handing the job over).
func (m *Mirror) writePart(slots []int32, rows []byte, p, parts int, gsh uint) {
	rb := m.rowBytes
	// g mod parts without a division (Lemire's fastmod): slots < 2^31.
	mul := ^uint64(0)/uint64(parts) + 1
	var cb []byte
	cc := ^uint32(0)
	for i := 0; i < len(slots); {
		s := slots[i]
		if s < 0 {
			i++
			continue
		}
		if hi, _ := bits.Mul64(mul*uint64(s>>gsh), uint64(parts)); int(hi) != p {
			i++
			continue
		}
		c := uint32(s) >> m.rowShift
		if c != cc {
			cb, cc = m.chunkR(c), c
		}
		// A run of consecutive slots in one chunk and one group is one
		// copy (see runEnd).
		j := i + 1
		if j < len(slots) && slots[j] == s+1 {
			j = runEnd(slots, i, min(m.runLimit(c), int32(min((int64(s>>gsh)+1)<<gsh, 1<<31-1))))
		}
		off := int(uint32(s)&m.rowMask) * rb
		copy(cb[off:off+(j-i)*rb], rows[i*rb:j*rb])
		i = j
	}
}

// ReadSplit is Read, split across w by rows when the copy is large (at
// least the split size, w with more than one goroutine). Read's rules
// apply; any goroutine; w may be nil.
func (m *Mirror) ReadSplit(w *Workers, dst []byte, slots []int32) {
	rb := m.rowBytes
	if w.N() <= 1 || len(dst) < w.splitB {
		m.Read(dst, slots)
		return
	}
	if len(dst) != len(slots)*rb {
		panicLen("ReadSplit", len(dst), len(slots), rb)
	}
	j := w.getJob()
	// More parts than goroutines, so that a worker busy with another
	// copy leaves its share to the others.
	parts := min(4*w.n, max(1, len(dst)/w.partB))
	j.per = (len(slots) + parts - 1) / parts
	j.m, j.slots, j.buf, j.write = m, slots, dst, false
	j.parts = (len(slots) + j.per - 1) / j.per
	w.run(j)
}
