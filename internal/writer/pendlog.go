package writer

import "github.com/omnicache/omnicache/soa"

// The join of a hit read. The rows a hit finds are those cached before its
// plan, and only a task that lands immediate rows in one of its blocks (a
// write, a decode-buffer flush, an import) can have put them there: the read
// waits for the newest such task handed over before the plan, not for every
// task queued (a decode step's write to other blocks, a prefill's scatter).
//
// Recording a task's blocks when it is handed over would cost the engine
// goroutine a store per token into a per-block table (a decode step's 64
// requests are 64 blocks: a fifth of its Save), and even copying its slots
// into a log costs the engine's caches a stream of lines. So handing over
// only logs the write itself (its Slots are written on the engine
// goroutine alone, by Save and newWrite: reading them here, on that
// goroutine, races with nothing), and the plan of a hit, far rarer, scans
// the log from its newest task for one that touches a hit block, after
// dropping the tasks the committer has finished (their rows are in: nothing
// to wait for). A write whose rows have landed may be recycled (newWrite)
// before the committer counts it finished: its entry then shows the newer
// write's slots, which costs at most a wait for the old write, about to
// finish; the newer write has an entry of its own. A trim also runs when
// the log grows past logTrimTasks.

// pendTask is one task of the log: a write, or an import of blocks. A
// write's blocks (the distinct blocks its slots fall in, in order of first
// appearance within runs) are worked out by the first scan that reaches it
// when it has more than joinScanSlots slots: a prefill's thousands of slots
// are then scanned once, not once per hit planned while it is queued. A
// smaller write (a decode step's) is checked slot by slot.
type pendTask struct {
	seq    uint64
	w      *Write
	blocks []int32 // nil until worked out (always set for an import)
}

// pendLog is the engine goroutine's log of tasks handed over that land
// immediate rows, oldest first.
type pendLog struct {
	tasks []pendTask
	first int       // tasks[first:] are live
	free  [][]int32 // block lists of dropped tasks, for reuse
	// mark and gen flag the blocks of the hit being joined.
	mark []uint32
	gen  uint32
}

// logTrimTasks is how many logged tasks make a hand-over trim the log
// (drop the finished tasks) before it appends.
const logTrimTasks = 256

// trim drops the tasks with a sequence at most done (finished), and
// compacts the log once its dead part outweighs the live one.
func (l *pendLog) trim(done uint64) {
	for l.first < len(l.tasks) && l.tasks[l.first].seq <= done {
		if b := l.tasks[l.first].blocks; b != nil {
			l.free = append(l.free, b[:0])
		}
		l.tasks[l.first] = pendTask{}
		l.first++
	}
	if l.first == len(l.tasks) {
		l.tasks, l.first = l.tasks[:0], 0
		return
	}
	if l.first < len(l.tasks)/2 {
		return
	}
	n := copy(l.tasks, l.tasks[l.first:])
	clear(l.tasks[n:])
	l.tasks, l.first = l.tasks[:n], 0
}

// list returns an empty block list (a dropped task's, else a new one).
func (l *pendLog) list() []int32 {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		return b
	}
	return make([]int32, 0, 16)
}

// logWrite logs write w, handed over as queue item w.Seq, with the blocks
// it writes when Save knows them (a long step: copied), else its slots tell
// them later; logImport logs import seq of blocks (copied). Engine
// goroutine.
// Only immediate keys land such rows, so p.ten is set whenever they are
// called.
func (p *Path) logWrite(w *Write, blocks []int32) {
	t := pendTask{seq: w.Seq, w: w}
	if blocks != nil {
		t.blocks = append(p.plog.list(), blocks...)
	}
	p.logTask(t)
}

func (p *Path) logImport(seq uint64, blocks []int32) {
	p.logTask(pendTask{seq: seq, blocks: append(p.plog.list(), blocks...)})
}

func (p *Path) logTask(t pendTask) {
	if len(p.plog.tasks) >= logTrimTasks {
		p.plog.trim(p.q.DoneSeq())
	}
	p.plog.tasks = append(p.plog.tasks, t)
}

// writeBlocks works out the blocks of write slots sl (a run of slots in
// one block, a request's tokens, costs one lookup: soa.RunEnd).
func (p *Path) writeBlocks(sl []int32) []int32 {
	bl := p.plog.list()
	bs := p.lay.BlockSize
	for i := 0; i < len(sl); {
		b := p.ten.Block(sl[i])
		bl = append(bl, int32(b))
		i = soa.RunEnd(sl, i+1, int32(b*bs), bs)
	}
	return bl
}

// joinSeq is the queue sequence a read of the immediate rows of the blocks
// in hits must wait for: that of the newest task handed over so far that
// lands rows in one of them and has not finished (0: none). Engine
// goroutine (the plan of a hit on immediate keys).
func (p *Path) joinSeq(hits [][]int32) uint64 {
	l := &p.plog
	if len(l.tasks) == 0 {
		return 0
	}
	l.trim(p.q.DoneSeq())
	if l.first == len(l.tasks) {
		return 0
	}
	if len(l.mark) < p.cfg.NumBlocks {
		l.mark = make([]uint32, p.cfg.NumBlocks)
	}
	if l.gen++; l.gen == 0 { // wrapped: start the marks afresh
		clear(l.mark)
		l.gen = 1
	}
	for _, bl := range hits {
		for _, b := range bl {
			l.mark[b] = l.gen
		}
	}
	for i := len(l.tasks) - 1; i >= l.first; i-- { // newest first: the first match is the newest
		t := &l.tasks[i]
		if t.blocks == nil {
			if sl := t.w.Slots; len(sl) <= joinScanSlots {
				if p.slotsMarked(sl) {
					return t.seq
				}
				continue
			}
			t.blocks = p.writeBlocks(t.w.Slots)
		}
		for _, b := range t.blocks {
			if l.mark[b] == l.gen {
				return t.seq
			}
		}
	}
	return 0
}

// joinScanSlots is the most slots of a write that joinSeq checks slot by
// slot, without working out (and keeping) its blocks: a decode step's
// write, a slot per request and so a block per slot, is checked in one pass
// over its slots at each scan that reaches it, at no cost to the scans
// that do not. A larger write (a prefill: a block per BlockSize slots) has
// its blocks worked out once. (A variable for the tests.)
var joinScanSlots = 128

// slotsMarked reports whether a slot of sl lies in a block marked for the
// join (a write's slots were checked to lie in the mirror at Begin). The
// loop shifts when the block size is a power of two: it runs per slot, and
// Tenancy.Block's test of the shift in it costs a decode step's join about
// a third more (CPU profiles of decode64 hit=50).
func (p *Path) slotsMarked(sl []int32) bool {
	l := &p.plog
	if sh := p.ten.Shift(); sh >= 0 {
		for _, s := range sl {
			if l.mark[s>>sh] == l.gen {
				return true
			}
		}
		return false
	}
	for _, s := range sl {
		if l.mark[p.ten.Block(s)] == l.gen {
			return true
		}
	}
	return false
}
