"""make bench-python's rows part: whole steps of 2048-wide float32 hidden
rows and one per-token multimodal key through Cache, host tensors or (with
--cuda) CUDA tensors, per shape:

- engine: begin + save, the engine's calls around its forward (an
  untimed spin between them stands for the forward: the committer writes
  the step before, and a hit is read ahead, meanwhile);
- materialize: Cache.materialize of the step into torch buffers of the
  keys' dtype and width, and Result.split into one tensor per request and
  key, ``[prefix + step rows, width]``. Host tensors: host buffers; a
  prefill step is begun with Cache.begin_into, its buffers made then (in
  the engine part): the hit rows are read into them during the forward,
  save copies the step's rows into them while the library writes its
  mirror, and materialize finds them in place. --cuda: every step is
  begun with begin_into and CUDA buffers, made then: the hit rows are
  copied up into them during the forward, save copies the step's rows
  there device to device, and materialize(step) returns them there;
- torch.cat: beside it, on the same rows, one torch.cat per request and
  key of its prefix rows and its step rows: what a Python manager that
  keeps the rows itself does (on the device with --cuda, its stream synchronized).

Shapes: 16 and 64 requests decoding one token each; a 2,048-token prefill;
a 2,048-token prompt whose first 1,024 tokens hit (the step computes
1,024). The first step of each shape checks that materialize returns the
rows torch.cat makes. Figures: per round the median a step, then the
median over rounds with the range.
"""

import statistics
import time

import numpy as np

from .core import Cache, Key, Outputs, Plan

W, MMW, BS = 2048, 4, 16  # the hidden width and the multimodal key's (float32), the block size
STRIDE = 160  # block-table columns: 2,560 positions
# name, requests, tokens each step, hit tokens, the untimed forward (ns)
ROW_SHAPES = [("decode16", 16, 1, 0, 50_000), ("decode64", 64, 1, 0, 50_000),
              ("prefill2048", 1, 2048, 0, 2_000_000), ("prefill2048 hit1024", 1, 1024, 1024, 2_000_000)]


def spin(ns):
    t0 = time.perf_counter_ns()
    while time.perf_counter_ns() - t0 < ns:
        pass


class RowBench:
    """One shape's cache, plan, outputs and the torch.cat baseline's prefix
    rows; step() runs and times one step."""

    def __init__(self, torch, reqs, tokens, hit, forward, cuda, workers):
        self.torch, self.reqs, self.tokens, self.hit, self.forward, self.cuda = torch, reqs, tokens, hit, forward, cuda
        dev = "cuda:0" if cuda else "cpu"
        ntok = reqs * tokens
        keys = [Key("hidden", W * 4), Key("mm", MMW * 4, optional=True)]
        self.c = Cache(keys, num_blocks=max(reqs, 2) * STRIDE, block_size=BS,
                       staging_capacity_tokens=max(2048, ntok), cuda_device=0 if cuda else None,
                       copy_workers=workers)
        g = torch.Generator().manual_seed(51)
        self.hs = torch.randn(ntok, W, generator=g).to(dev)
        self.mm = torch.randn(ntok, MMW, generator=g).to(dev)
        # --cuda: what the forward writes into the outputs, on the producer stream, the two
        # alternating (a clone that ran before the write would give the other's rows)
        self.src = [(self.hs.clone(), self.mm.clone()),
                    (torch.randn(ntok, W, generator=g).to(dev), torch.randn(ntok, MMW, generator=g).to(dev))] \
            if cuda else None
        self.stream = torch.cuda.Stream(device=0) if cuda else None
        self.outs = Outputs(self.c, [self.hs, self.mm], tokens=ntok)
        self.prefix = (self.hs[:0], self.mm[:0])
        self.table = np.zeros((max(reqs, 1), STRIDE), np.int32)
        self.ids = np.arange(1, reqs + 1, dtype=np.int64)
        self.start = np.full(reqs, hit, np.int32)
        self.count = np.full(reqs, tokens, np.int32)
        self.plan = Plan(ids=self.ids, rows=np.arange(reqs, dtype=np.int32), start=self.start, count=self.count,
                         table=self.table)
        self.fin = np.zeros(1, np.int64)
        self.arr = np.zeros(1, np.int64)
        self.hits = np.full(1, hit, np.int32)
        self.hit_blocks = np.arange(hit // BS, dtype=np.int32)
        self.n = 0
        self.into = None  # the begun step's begin_into buffers, by key name
        self.alloc = lambda k, rows: torch.empty((rows, W if k.name == "hidden" else MMW))
        if cuda:  # the step's rows on the device, as the device torch.cat makes them
            self.alloc = lambda k, rows: torch.empty((rows, W if k.name == "hidden" else MMW), device=dev)
        if tokens == 1:
            self.table[:] = np.arange(reqs * STRIDE, dtype=np.int32).reshape(reqs, STRIDE)
            self.plan.set_arrivals(self.ids.copy(), np.zeros(reqs, np.int32))
        elif hit:
            self._seed(g, dev)
        else:
            self.ids[0] = 0  # no request before the first
        if cuda:
            torch.cuda.synchronize()  # the tensors above, made on the default stream, are complete

    def _seed(self, g, dev):
        """The request whose first 1,024 rows every later request hits:
        2,048 tokens on blocks [0, 128)."""
        torch = self.torch
        seed_h, seed_m = torch.randn(2048, W, generator=g).to(dev), torch.randn(2048, MMW, generator=g).to(dev)
        self.table[0, :128] = np.arange(128)
        c = self.c
        c.begin(ids=[1], rows=[0], start=[0], count=[2048], table=self.table, arrivals=[1], hit_tokens=[0])
        if self.cuda:
            torch.cuda.synchronize()  # seed_h and seed_m were made on the default stream
        c.discard(self._save({"hidden": seed_h, "mm": seed_m}, 2048))
        c.sync()
        self.prefix = (seed_h[:self.hit], seed_m[:self.hit])
        self.ids[0] = 1

    def _save(self, outs, tokens=None):
        """save; with --cuda inside the producer stream, on which save
        records the event the cache's clones wait for."""
        if not self.cuda:
            return self.c.save(outs, tokens=tokens) if tokens else self.c.save(outs)
        with self.torch.cuda.stream(self.stream):
            return self.c.save(outs, tokens=tokens) if tokens else self.c.save(outs)

    def advance(self):
        """The next step's plan: decode positions move on; a prefill is a
        new request (the one before finishes) on the other half of the
        blocks, after the seed's 64 hit blocks when it hits."""
        self.n += 1
        if self.tokens == 1:
            if self.n == 2:
                self.plan.clear_events()
            if self.n > 1:
                np.add(self.start, 1, out=self.start)
                if self.start[0] >= STRIDE * BS:
                    self.start[:] = STRIDE * BS // 2
            return
        self.fin[0] = self.ids[0]
        self.ids[0] += 1
        self.arr[0] = self.ids[0]
        lo = self.hit // BS
        fresh = (self.tokens + BS - 1) // BS
        base = 128 if self.hit else 0
        self.table[0, lo:lo + fresh] = base + (self.n % 2) * fresh + np.arange(fresh)
        self.plan.set_arrivals(self.arr, self.hits, self.hit_blocks if self.hit else None)
        self.plan.set_finished(self.fin if self.fin[0] else None)

    def step(self, check=False):
        """One step: (engine, materialize, torch.cat) in ns."""
        torch, clock, c = self.torch, time.perf_counter_ns, self.c
        self.advance()
        t0 = clock()
        if self.tokens > 1 or self.cuda:
            rows = self.plan.result_rows()
            self.into = {k.name: self.alloc(k, rows) for k in c.keys}
            c.begin_into(self.plan, list(self.into.values()))
        else:
            c.begin(self.plan)
        t1 = clock()
        if self.cuda:
            with torch.cuda.stream(self.stream):  # the forward writes the outputs on its stream
                h, m = self.src[self.n % 2]
                self.hs.copy_(h)
                self.mm.copy_(m)
            spin(self.forward)
            self.stream.synchronize()  # the forward is over: the engine part is the cache's
        else:
            spin(self.forward)
        t2 = clock()
        sid = self._save(self.outs)
        t3 = clock()
        first = self.n % 2 == 0  # which of the two goes first alternates
        if first:
            mat, got = self._materialize(sid, check)
            cat, want = self._cat(check)
        else:
            cat, want = self._cat(check)
            mat, got = self._materialize(sid, check)
        if check:
            for g, w in zip(got, want):
                for a, b in zip(g, w):
                    if not torch.equal(a.cpu(), b.cpu()):
                        raise AssertionError("materialize differs from torch.cat of the request's rows")
        return (t1 - t0) + (t3 - t2), mat, cat

    def _materialize(self, sid, keep):
        """materialize's ns, and its per-request tensors when keep (else
        freed at once, as torch.cat's: each side's allocations find the
        memory the other freed)."""
        clock = time.perf_counter_ns
        into, self.into = self.into, None
        if into is None:
            alloc = self.alloc
        else:  # the buffers made at begin, whole when the step's rows fill them (no view to make)
            def alloc(k, rows):
                b = into[k.name]
                return b if len(b) == rows else b[:rows]
        t0 = clock()
        # a step begun with CUDA buffers: materialize(sid) returns its rows in them
        r = self.c.materialize(sid) if self.cuda else self.c.materialize(sid, alloc=alloc)
        out = (r.split(0), r.split(1))
        t = clock() - t0
        return t, out if keep else None

    def _cat(self, keep):
        torch, clock = self.torch, time.perf_counter_ns
        ph, pm = self.prefix
        hs, mm, t = self.hs, self.mm, self.tokens
        t0 = clock()
        h = [torch.cat([ph, hs[i * t:(i + 1) * t]]) for i in range(self.reqs)]
        m = [torch.cat([pm, mm[i * t:(i + 1) * t]]) for i in range(self.reqs)]
        if self.cuda:
            # Its own stream only: a device-wide synchronize would wait for
            # the library's copies still running on its stream too.
            torch.cuda.current_stream().synchronize()
        t = clock() - t0
        return t, (h, m) if keep else None

    def close(self):
        self.c.close()


def warm_heap():
    """Keeps glibc's heap from handing the steps' 16 MiB buffers back to
    the kernel (M_MMAP_THRESHOLD and M_TRIM_THRESHOLD at 1 GiB), as a
    caching allocator would: otherwise, depending on how the two sides'
    buffers interleave, the heap is trimmed between steps and every buffer
    of either side is faulted in afresh (25-30 ms a 2,048-row step on a
    VM, drowning what is measured). Both sides allocate from the same heap.
    Not glibc: nothing to do."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD


def bench_rows(torch, rounds, steps, cuda=False, shapes=ROW_SHAPES, workers=None):
    """Per shape: name and, per round, the median (engine, materialize,
    torch.cat) µs a step. The cache's copy workers are torch's intra-op
    threads unless given: both sides copy with as many threads."""
    warm_heap()
    out = []
    workers = workers or torch.get_num_threads()
    for name, reqs, tokens, hit, forward in shapes:
        b = RowBench(torch, reqs, tokens, hit, forward, cuda, workers)
        n = steps if tokens == 1 else max(3, steps // 10)
        for i in range(10):  # warm: buffers, the allocator's cache, the committer
            b.step(check=i == 9)
        per = []
        for _ in range(rounds):
            st = [b.step() for _ in range(n)]
            per.append(tuple(statistics.median(x[j] for x in st) / 1e3 for j in range(3)))
        b.close()
        out.append((name, per))
    return out


def fmt(xs):
    """median [min–max] of xs."""
    return "%.1f [%.1f–%.1f]" % (statistics.median(xs), min(xs), max(xs))


def print_rows(results, device):
    print("%-20s | %-24s | %-24s | %-24s | %-9s | %-24s" % (
        "shape (%s)" % device, "engine µs", "materialize µs", "torch.cat µs", "mat/cat", "whole step µs"))
    for name, per in results:
        eng, mat, cat = ([p[j] for p in per] for j in range(3))
        whole = [e + m for e, m in zip(eng, mat)]
        print("%-20s | %-24s | %-24s | %-24s | %-9s | %-24s" % (
            name, fmt(eng), fmt(mat), fmt(cat), "%.2f" % (statistics.median(mat) / statistics.median(cat)),
            fmt(whole)))
