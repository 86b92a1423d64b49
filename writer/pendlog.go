package writer

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
// to wait for; a finished write's page may already hold a newer write,
// which the log holds as a task of its own). A trim also runs when the log
// grows past logTrimTasks.

// pendTask is one task of the log: a write (its Slots) or an import (the
// blocks it fills).
type pendTask struct {
	seq    uint64
	w      *Write
	blocks []int32
}

// pendLog is the engine goroutine's log of tasks handed over that land
// immediate rows, oldest first.
type pendLog struct {
	tasks []pendTask
	first int // tasks[first:] are live
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

// logWrite logs write w, handed over as queue item w.Seq; logImport logs
// import seq of blocks (copied). Engine goroutine.
func (p *Path) logWrite(w *Write) { p.logTask(pendTask{seq: w.Seq, w: w}) }
func (p *Path) logImport(seq uint64, blocks []int32) {
	p.logTask(pendTask{seq: seq, blocks: append([]int32(nil), blocks...)})
}

func (p *Path) logTask(t pendTask) {
	if p.ten == nil {
		return // no immediate keys: nothing lands rows a hit joins
	}
	if len(p.plog.tasks) >= logTrimTasks {
		p.plog.trim(p.q.DoneSeq())
	}
	p.plog.tasks = append(p.plog.tasks, t)
}

// JoinSeq is the queue sequence a read of the immediate rows of the blocks
// in hits must wait for: that of the newest task handed over so far that
// lands rows in one of them and has not finished (0: none). Engine
// goroutine (a hit's plan).
func (p *Path) JoinSeq(hits [][]int32) uint64 {
	l := &p.plog
	if p.ten == nil || len(l.tasks) == 0 {
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
		if t.w == nil {
			for _, b := range t.blocks {
				if l.mark[b] == l.gen {
					return t.seq
				}
			}
			continue
		}
		for _, s := range t.w.Slots {
			if l.mark[p.ten.Block(s)] == l.gen {
				return t.seq
			}
		}
	}
	return 0
}
